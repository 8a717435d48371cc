"""Positional information: absolute encodings added to embeddings, relative terms added to scores.

Absolute: sinusoidal (Vaswani et al. 2017, computed from the positions, no table) and learned.
Relative: clipped relative-position representations (Shaw et al. 2018) and T5's bucketed
relative bias. Relative terms are built from the query and key positions of each call, so
they follow the run-time sequence length rather than a table sized at construction.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from edgeattn.config import ModelConfig


class SinusoidalPosition(nn.Module):
    """PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d))."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: Tensor) -> Tensor:
        """(T,) integer positions -> (T, d_model) encodings."""
        angles = positions.to(self.inv_freq.dtype)[:, None] * self.inv_freq[None, :]  # (T, d/2)
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # (T, d)


class LearnedPosition(nn.Module):
    """A trained vector per absolute position, up to ``max_len`` positions."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, positions: Tensor) -> Tensor:
        """(T,) or (B, T) integer positions -> (T, d_model) or (B, T, d_model) vectors."""
        return self.weight[positions]


def build_absolute(config: ModelConfig) -> nn.Module | None:
    """The absolute position module the config asks for, or None for relative kinds."""
    if config.position == "sinusoidal":
        return SinusoidalPosition(config.d_model)
    if config.position == "learned":
        return LearnedPosition(config.max_len + config.position_offset, config.d_model)
    return None


class RelativePosition(nn.Module):
    """A term added to the attention scores that depends only on key minus query position."""

    #: whether the term is multiplied by the attention scale like the content scores
    scaled: bool = False

    def forward(self, q: Tensor | None, q_pos: Tensor, k_pos: Tensor) -> Tensor:  # pragma: no cover
        """q (B, H, T, D), q_pos (T,), k_pos (S,) -> a term broadcasting to (B, H, T, S). ``q`` may be
        None for a term that does not read the queries (T5's)."""
        raise NotImplementedError


class ShawRelativePosition(RelativePosition):
    """Clipped relative-position key representations a_ij (Shaw et al. 2018).

    score_ij += q_i · a[clip(j - i, -k, k)], one table of 2k+1 vectors shared by the heads.
    """

    scaled = True

    def __init__(self, clip: int, head_dim: int) -> None:
        super().__init__()
        self.clip = clip
        self.embedding = nn.Embedding(2 * clip + 1, head_dim)

    def forward(self, q: Tensor | None, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        if q is None:
            raise ValueError("Shaw relative positions read the queries: pass q")
        rel = (k_pos[None, :] - q_pos[:, None]).clamp(-self.clip, self.clip) + self.clip  # (T, S)
        a = self.embedding(rel)  # (T, S, D)
        return torch.einsum("bhtd,tsd->bhts", q, a)


class T5RelativeBias(RelativePosition):
    """T5's bucketed relative position bias: one learned scalar per bucket and head.

    Offsets below half the buckets get a bucket each; larger ones share logarithmically wider
    buckets up to ``max_distance``. Bidirectional (encoder) attention splits the buckets between
    keys before and after the query; causal attention uses them all for keys before it.
    """

    def __init__(self, n_heads: int, num_buckets: int, max_distance: int, bidirectional: bool) -> None:
        super().__init__()
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.embedding = nn.Embedding(num_buckets, n_heads)

    def bucket(self, relative: Tensor) -> Tensor:
        """Bucket index of each key-minus-query offset."""
        num_buckets = self.num_buckets
        buckets = torch.zeros_like(relative)
        if self.bidirectional:
            num_buckets //= 2
            buckets = buckets + (relative > 0).long() * num_buckets
            distance = relative.abs()
        else:
            distance = (-relative).clamp(min=0)
        max_exact = num_buckets // 2
        is_small = distance < max_exact
        log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(self.max_distance / max_exact)
        large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
        large = large.clamp(max=num_buckets - 1)
        return buckets + torch.where(is_small, distance, large)

    def forward(self, q: Tensor | None, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        rel = k_pos[None, :] - q_pos[:, None]  # (T, S)
        bias = self.embedding(self.bucket(rel))  # (T, S, H)
        return bias.permute(2, 0, 1).unsqueeze(0)  # (1, H, T, S)


def build_relative(config: ModelConfig, bidirectional: bool) -> RelativePosition | None:
    """The relative position module for one self-attention block, or None."""
    if config.position == "relative":
        return ShawRelativePosition(config.relative_clip, config.head_dim)
    if config.position == "t5":
        return T5RelativeBias(config.n_heads, config.relative_buckets, config.relative_max_distance, bidirectional)
    return None
