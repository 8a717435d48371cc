"""Gemma 2 and Gemma 3 (text) from Hugging Face folders: what sets them apart from Llama.

Both interleave sliding-window layers with global ones (Gemma 2 one to one, Gemma 3 five to one),
scale the token embeddings by the square root of the width, norm each branch again before it joins
the residual stream, scale the attention by ``query_pre_attn_scalar ** -0.5`` and run gelu-tanh
gated feed-forwards. Their RMS norms multiply by ``1 + weight``: the importer folds the one into
the weight, so the model's norm is the plain one. Gemma 2 soft-caps the attention scores and the
logits; Gemma 3 norms each head's queries and keys and rotates its sliding layers by a base of
their own (``rope_local_base_freq``; transformers 5 writes ``rope_parameters`` per layer type).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from edgeattn.errors import CheckpointError, ConfigError
from edgeattn.families.causal.config import CausalLMConfig

#: architecture -> the model_type its config.json names
ARCHITECTURES = {"Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text"}

_LAYER = {
    "input_layernorm.weight": "norm1.weight", "post_attention_layernorm.weight": "attn_out_norm.weight",
    "pre_feedforward_layernorm.weight": "norm2.weight", "post_feedforward_layernorm.weight": "ff_out_norm.weight",
    **{f"self_attn.{p}_proj.weight": f"attn.{p}_proj.weight" for p in "qkvo"},
    "self_attn.q_norm.weight": "attn.q_norm.weight", "self_attn.k_norm.weight": "attn.k_norm.weight",
    **{f"mlp.{p}_proj.weight": f"ff.{p}_proj.weight" for p in ("gate", "up", "down")},
}  # fmt: skip


def default_layer_types(hf: dict[str, Any], architecture: str, n_layers: int) -> list[str]:
    """Each layer's attention as transformers lays it out when config.json lists none: Gemma 2
    alternates sliding and global from the first layer; Gemma 3 makes every ``sliding_window_pattern``-th
    layer global (6 unless given)."""
    if architecture == "Gemma2ForCausalLM":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
    pattern = int(hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or 6)
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]


def rope_views(hf: dict[str, Any], path: Path) -> tuple[dict[str, Any], float]:
    """(config.json as its global layers' rotation reads it, the sliding layers' rotary base; 0 where
    they share the global one). Gemma 3 in transformers 4.x: ``rope_theta`` and ``rope_scaling``
    for the global layers and ``rope_local_base_freq`` for the sliding ones; in 5.x ``rope_parameters``
    per layer type. A scaled local rotation is a ConfigError."""
    params = hf.get("rope_parameters")
    per_type = isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values())
    if not per_type:  # Gemma 3's local base defaults to 10,000 as transformers' does; Gemma 2 has one rotation
        return hf, float(hf.get("rope_local_base_freq") or 10000.0) if hf.get("model_type") == "gemma3_text" else 0.0
    unknown = sorted(set(params) - {"full_attention", "sliding_attention"})
    if unknown or "full_attention" not in params:
        raise ConfigError(f"{path}: rope_parameters per layer type must be full_attention and sliding_attention, "
                          f"got {', '.join(params)}")  # fmt: skip
    view = {k: v for k, v in hf.items() if k not in ("rope_theta", "rope_scaling", "rope_parameters")}
    view["rope_parameters"] = params["full_attention"]
    local = params.get("sliding_attention") or {}
    if (local.get("rope_type") or "default") != "default":
        raise ConfigError(f"{path}: the sliding layers' rope type {local.get('rope_type')!r} is not one edgeattn "
                          f"implements for them (default)")  # fmt: skip
    return view, float(local.get("rope_theta") or 0.0)


def config_fields(hf: dict[str, Any], architecture: str, path: Path) -> dict[str, Any]:
    """The CausalLMConfig fields Gemma sets beyond a Llama's (the rotation aside: :func:`rope_views`)."""
    if hf.get("use_bidirectional_attention"):
        raise ConfigError(f"{path}: use_bidirectional_attention (an embedding model's attention) is not a language "
                          f"model's; edgeattn exports Gemma's causal attention only")  # fmt: skip
    scalar = hf.get("query_pre_attn_scalar")
    if not isinstance(scalar, int | float) or scalar <= 0:
        raise ConfigError(f"{path}: query_pre_attn_scalar must be a positive number, got {scalar!r}")
    return {
        "sandwich_norm": True, "embed_scale": float(torch.tensor(float(hf["hidden_size"]) ** 0.5)),
        "attn_scale": float(scalar) ** -0.5, "attn_softcap": float(hf.get("attn_logit_softcapping") or 0.0),
        "logit_softcap": float(hf.get("final_logit_softcapping") or 0.0),
        "qk_norm": architecture == "Gemma3ForCausalLM",
    }  # fmt: skip


def map_tensors(tensors: dict[str, torch.Tensor], config: CausalLMConfig, source: str) -> dict[str, torch.Tensor]:
    """A Gemma folder's tensors under edgeattn's names, each norm's weight ``1 + w`` (in float32, as
    transformers computes it)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        if key in ("model.embed_tokens.weight", "lm_head.weight"):
            out["embed.weight" if key.startswith("model.") else key] = value
            continue
        if key == "model.norm.weight":
            out["norm.weight"] = 1.0 + value.float()
            continue
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", key)
        if m is None or m.group(2) not in _LAYER:
            raise CheckpointError(f"{source}: tensor {key} is not one edgeattn maps")
        layer, rest = m.groups()
        out[f"layers.{layer}.{_LAYER[rest]}"] = 1.0 + value.float() if "norm" in rest else value
    return out
