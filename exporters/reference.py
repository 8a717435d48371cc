"""Eager PyTorch decoding through the runtime's search code, as the reference the exported graphs
must match token for token (greedy, beam search, sampling)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from edgeattn.attention import KeyValue
from edgeattn.errors import EdgeattnError
from edgeattn.model import Seq2SeqTransformer, TransformerModel
from edgeattn.runtime.families import family_of, resolve
from edgeattn.runtime.generate import GenerationConfig, GenerationOutput, generate


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
    return generate(lambda n: stepper(model, ids, mask, n), ids.shape[0], c.bos_id, eos, c.pad_id, cfg)
