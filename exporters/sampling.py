"""Random graph inputs drawn from a graph's spec (numpy only), for export tracing and verification."""

from __future__ import annotations

import numpy as np

from edgeattn.config import ModelConfig
from edgeattn.runtime.specs import LOGITS_AT, PAST_LEN, POSITION, POSITION_IDS, TGT_LEN, TOKEN_TYPE_IDS, GraphSpec

MASK_INPUTS = ("attention_mask", "key_padding_mask", "encoder_attention_mask")


def row_lengths(batch: int, length: int) -> list[int]:
    """Distinct real lengths per row: the first row full, later rows shorter (at least 1)."""
    step = -(-length // (batch + 1))
    return [max(1, length - i * step) for i in range(batch)]


def padding(batch: int, length: int) -> np.ndarray:
    """An int64 (batch, length) mask, 1 for real tokens, with different padding per row."""
    mask = np.zeros((batch, length), dtype=np.int64)
    for i, n in enumerate(row_lengths(batch, length)):
        mask[i, :n] = 1
    return mask


def sample_inputs(
    spec: GraphSpec, config: ModelConfig, sizes: dict[str, int], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """One input per spec entry, with each named axis set from ``sizes``.

    Token ids are uniform over the vocabulary, token types over the model's types, masks pad the
    rows differently, floats are N(0, 1); a fixed-capacity cache's position is ``past_len`` (its
    unwritten slots hold noise too, which must not matter); positions are below max_len, picked
    logits index the new tokens.
    """
    feeds: dict[str, np.ndarray] = {}
    for t in spec.inputs:
        shape = tuple(a if isinstance(a, int) else sizes[a] for a in t.axes)
        if t.name in MASK_INPUTS:
            feeds[t.name] = padding(*shape)
        elif t.name == POSITION:
            feeds[t.name] = np.array([sizes[PAST_LEN]], dtype=np.int64)
        elif t.name == POSITION_IDS:
            feeds[t.name] = rng.integers(0, config.max_len, size=shape, dtype=np.int64)
        elif t.name == LOGITS_AT:
            feeds[t.name] = rng.integers(0, sizes[TGT_LEN], size=shape, dtype=np.int64)
        elif t.name == TOKEN_TYPE_IDS:
            feeds[t.name] = rng.integers(0, config.token_types, size=shape, dtype=np.int64)
        elif t.dtype == "int64":
            feeds[t.name] = rng.integers(0, config.vocab_size, size=shape, dtype=np.int64)
        else:
            feeds[t.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds
