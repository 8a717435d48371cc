"""What a batch's padding looks like, checked on the host before a graph form that depends on it runs.

ONNX Runtime's fused attention operators take the padding mask either as a (batch, keys) matrix
or as one length per row, "keys 0 .. length-1 are real" (see
:mod:`edgeattn.exporters.mask_forms`). The lengths form is right only when every row's real
tokens come first: :func:`right_padded` says whether they do. Torch-free.
"""

from __future__ import annotations

import numpy as np


def right_padded(mask: np.ndarray) -> bool:
    """Whether every row of a (B, S) 0/1 mask is ones followed by zeros (no padding before or
    between real tokens), so that its row sums say exactly which keys are real."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        return False
    if mask.shape[1] < 2:
        return True
    return bool((np.diff(mask.astype(np.int8), axis=1) <= 0).all())


def key_lengths(mask: np.ndarray) -> np.ndarray:
    """(B,) int32 real-token counts of a right-padded (B, S) mask: the lengths form of the mask."""
    return np.asarray(mask).sum(axis=1).astype(np.int32)
