"""Rotary position frequencies of every scaling kind edgeattn exports, as transformers computes them.

:func:`rope_frequencies` gives the inverse frequency of each pair of rotating dimensions and the
factor the cosines and sines are multiplied by (``attention_factor``: 1 but for YaRN and LongRoPE),
for a :class:`~edgeattn.families.causal.config.CausalLMConfig`'s ``rope_type`` (see
:data:`~edgeattn.families.causal.config.ROPE_TYPES`). The formulas follow transformers'
``modeling_rope_utils``: ``default``, ``linear`` (frequencies / factor), ``llama3`` (Llama 3.1's
smoothed band), ``yarn`` (NTK-by-parts with its ramp and attention factor) and ``longrope``
(Phi-3's per-frequency short factors, the short window only).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from edgeattn.families.causal.config import CausalLMConfig


def rope_frequencies(config: CausalLMConfig) -> tuple[Tensor, float]:
    """(inverse frequencies (rotary / 2,), the cos/sin factor) of ``config``'s rotary positions."""
    rotary = int(config.dim * config.rotary_fraction)
    exponents = torch.arange(0, rotary, 2, dtype=torch.int64).float() / rotary  # (rotary / 2,)
    inv = 1.0 / (config.rope_theta**exponents)
    s = dict(config.rope_scaling)
    kind = config.rope_type
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / float(s["factor"]), 1.0
    if kind == "llama3":
        return _llama3(inv, s), 1.0
    if kind == "yarn":
        return _yarn(config, rotary, s)
    if kind == "longrope":
        short = torch.tensor(s["short_factor"], dtype=torch.float32)
        return 1.0 / (short * config.rope_theta**exponents), float(s["attention_factor"])
    raise AssertionError(kind)  # CausalLMConfig refuses any other kind


def _llama3(inv: Tensor, s: dict) -> Tensor:
    old = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / s["low_freq_factor"], old / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s["factor"], inv)
    smooth = (old / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    smoothed = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(config: CausalLMConfig, dim: int, s: dict) -> tuple[Tensor, float]:
    base, factor = config.rope_theta, float(s["factor"])
    old = float(s["original_max_position_embeddings"])
    attention = s.get("attention_factor")
    if attention is None:
        mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")
        attention = _mscale(factor, mscale) / _mscale(factor, mscale_all) if mscale and mscale_all else _mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32.0, s.get("beta_slow") or 1.0

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", 1.0):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    positions = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolated = 1 - ramp
    inv = (1.0 / (factor * positions)) * (1 - extrapolated) + (1.0 / positions) * extrapolated
    return inv, float(attention)
