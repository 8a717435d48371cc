"""The seq2seq family's eager PyTorch stepper: the generation the exported decoders are checked against."""

from __future__ import annotations

import numpy as np
import torch

from edgeattn.attention import KeyValue
from edgeattn.families.seq2seq.model import Seq2SeqTransformer


class EagerStepper:
    """The :class:`~edgeattn.runtime.generate.Stepper` of an eager PyTorch model."""

    def __init__(self, model: Seq2SeqTransformer, ids: np.ndarray, mask: np.ndarray, repeat: int = 1,
                 capacity: int = 0) -> None:  # fmt: skip
        """``capacity``: the new tokens the decode may make (unused: the eager cache grows as it goes)."""
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
