"""The causal family's eager PyTorch stepper: the generation its exported decoder is checked against."""

from __future__ import annotations

import numpy as np
import torch

from edgeattn.attention import CacheSlots
from edgeattn.families.causal.model import CausalLM, positions_of
from edgeattn.runtime.generate import prompt_seen


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
