"""Eager PyTorch decoding through the runtime's search code, as the reference the exported graphs
must match token for token (greedy, beam search, sampling)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from edgeattn.attention import CacheSlots, KeyValue
from edgeattn.errors import EdgeattnError
from edgeattn.families.causal.model import CausalLM, positions_of
from edgeattn.model import Seq2SeqTransformer, TransformerModel
from edgeattn.runtime.families import family_of, resolve
from edgeattn.runtime.generate import GenerationConfig, GenerationOutput, generate, prompt_seen


class EagerStepper:
    """The :class:`~edgeattn.runtime.generate.Stepper` of an eager PyTorch model."""

    def __init__(self, model: Seq2SeqTransformer, ids: np.ndarray, mask: np.ndarray, repeat: int = 1) -> None:
        self.model = model.eval()
        src, src_mask = torch.from_numpy(ids), torch.from_numpy(mask)
        with torch.no_grad():
            cross = model.cross_kv(model.encode(src, src_mask))
        if repeat > 1:
            src_mask = src_mask.repeat_interleave(repeat, dim=0)
            cross = [(k.repeat_interleave(repeat, dim=0), v.repeat_interleave(repeat, dim=0)) for k, v in cross]
        self.mask, self.cross = src_mask, cross
        self.past: list[KeyValue] | None = None

    def step(self, tokens: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            logits, self.past = self.model.decode(
                torch.from_numpy(tokens.astype(np.int64))[:, None],
                cross_kv=self.cross,
                memory_mask=self.mask,
                past=self.past,
            )
        return logits[:, -1].numpy()

    def reorder(self, index: np.ndarray) -> None:
        if self.past is not None:
            idx = torch.from_numpy(index)
            self.past = [(k[idx], v[idx]) for k, v in self.past]


class CausalEagerStepper:
    """The :class:`~edgeattn.runtime.generate.Stepper` of an eager decoder-only model: the prompt
    runs at construction into a cache of prompt + ``capacity`` slots, the first step answers from it
    (as :class:`edgeattn.runtime.families.causal.runtime.CausalState` does)."""

    def __init__(self, model: CausalLM, ids: np.ndarray, mask: np.ndarray, repeat: int = 1,
                 capacity: int = 64) -> None:  # fmt: skip
        self.model = model.eval()
        t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)
        if repeat > 1:
            t_ids, t_mask = t_ids.repeat_interleave(repeat, dim=0), t_mask.repeat_interleave(repeat, dim=0)
        rows, width = t_ids.shape
        self.slots = torch.cat([t_mask, torch.zeros(rows, capacity, dtype=torch.int64)], dim=1)
        self.cache = model.empty_cache(rows, width + capacity)
        self.position = width
        self.next_position = t_mask.sum(1, keepdim=True)
        positions = positions_of(t_mask)
        with torch.no_grad():
            logits, kept = model(t_ids, self.slots, positions, self.cache,
                                 (t_mask * torch.arange(width)).argmax(-1, keepdim=True))  # fmt: skip
        self.kept = kept
        self.pending: np.ndarray | None = logits[:, 0].numpy()
        self.prompt = t_ids.numpy(), t_mask.numpy()

    def step(self, tokens: np.ndarray) -> np.ndarray:
        if self.pending is not None:
            logits, self.pending = self.pending, None
            return logits
        self.slots[:, self.position] = 1
        cache = [CacheSlots(k, v, torch.tensor([self.position])) for k, v in self.kept]
        with torch.no_grad():
            logits, self.kept = self.model(torch.from_numpy(tokens.astype(np.int64))[:, None], self.slots,
                                           self.next_position, cache)  # fmt: skip
        self.position += 1
        self.next_position = self.next_position + 1
        return logits[:, -1].numpy()

    def reorder(self, index: np.ndarray) -> None:
        idx = torch.from_numpy(index)
        self.kept = [(k[idx], v[idx]) for k, v in self.kept]
        self.slots, self.next_position = self.slots[idx], self.next_position[idx]

    def seen(self) -> np.ndarray:
        """(rows, vocab) True for each row's prompt tokens (where a repetition penalty starts)."""
        return prompt_seen(*self.prompt, self.model.config.vocab_size)


def eager_generate(
    model: TransformerModel,
    ids: np.ndarray,
    mask: np.ndarray,
    max_new_tokens: int = 32,
    strategy: str = "greedy",
    eos_id: int | None = None,
    **options: Any,
) -> GenerationOutput:
    """What the family runtime's ``generate`` does, with the family's eager stepper (eager PyTorch)
    in place of the graphs."""
    c = model.config
    family = family_of(c)
    if family.stepper is None:
        raise EdgeattnError(f"a {family.name} model does not generate")
    stepper = resolve(family.stepper)
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, strategy=strategy, **options)  # type: ignore[arg-type]
    eos = c.eos_id if eos_id is None else eos_id
    extra = {"capacity": cfg.max_new_tokens} if isinstance(model, CausalLM) else {}
    return generate(lambda n: stepper(model, ids, mask, n, **extra), ids.shape[0], c.bos_id, eos, c.pad_id, cfg)
