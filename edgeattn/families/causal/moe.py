"""Mixtures of experts in Hugging Face folders (Qwen3-MoE): the config's expert fields and the
experts' tensors, one (out, in) matrix an expert in the folder, stacked into
:class:`~edgeattn.families.causal.model.Experts`' (E, out, in) weights."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from edgeattn.errors import CheckpointError, ConfigError

#: architecture -> the model_type its config.json names
ARCHITECTURES = {"Qwen3MoeForCausalLM": "qwen3_moe"}
_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def config_fields(hf: dict[str, Any], path: Path, n_layers: int) -> dict[str, Any]:
    """The CausalLMConfig fields of a mixture-of-experts config.json (transformers 4.x names the
    count ``num_experts``, 5.x ``num_local_experts``): a layer is dense where ``mlp_only_layers``
    lists it or ``decoder_sparse_step`` skips it, as transformers builds it."""
    count = hf.get("num_experts", hf.get("num_local_experts"))
    top, width = hf.get("num_experts_per_tok"), hf.get("moe_intermediate_size")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (count, top, width)):
        raise ConfigError(f"{path}: a mixture of experts needs positive num_experts (or num_local_experts), "
                          "num_experts_per_tok and moe_intermediate_size, "
                          f"got {count!r}, {top!r}, {width!r}")  # fmt: skip
    step = hf.get("decoder_sparse_step", 1) or 1
    only = hf.get("mlp_only_layers") or []
    if not isinstance(only, list) or not isinstance(step, int):
        raise ConfigError(f"{path}: mlp_only_layers must be a list and decoder_sparse_step a number, "
                          f"got {only!r} and {step!r}")  # fmt: skip
    dense = tuple(i for i in range(n_layers) if i in only or (i + 1) % step)
    return {"n_experts": count, "experts_per_token": top, "expert_d_ff": width,
            "norm_topk": bool(hf.get("norm_topk_prob", False)), "dense_layers": dense}  # fmt: skip


def is_expert_tensor(rest: str) -> bool:
    """Whether a layer's tensor (its name after ``model.layers.<i>.``) belongs to its experts or router."""
    return rest == "mlp.gate.weight" or rest.startswith("mlp.experts.")


def stack_experts(parts: dict[str, dict[str, torch.Tensor]], n_experts: int, source: str) -> dict[str, torch.Tensor]:
    """{layer: {name after ``model.layers.<i>.``: tensor}} of the router and experts as edgeattn's
    ``layers.<i>.ff.*``: one expert a tensor in the folder (transformers 4.x and 5.x save them so),
    or already stacked (``experts.gate_up_proj`` (E, 2 * width, d) and ``experts.down_proj``)."""
    out: dict[str, torch.Tensor] = {}
    for layer, tensors in parts.items():
        prefix = f"layers.{layer}.ff"
        if "mlp.gate.weight" not in tensors:
            raise CheckpointError(f"{source}: layer {layer}'s experts have no router (mlp.gate.weight)")
        out[f"{prefix}.router.weight"] = tensors.pop("mlp.gate.weight")
        if "mlp.experts.gate_up_proj" in tensors:  # stacked already
            gate, up = tensors.pop("mlp.experts.gate_up_proj").chunk(2, dim=1)
            stacked = {"gate_proj": gate, "up_proj": up, "down_proj": tensors.pop("mlp.experts.down_proj", None)}
            if stacked["down_proj"] is None:
                raise CheckpointError(f"{source}: layer {layer} stacks its experts' gate_up_proj but not down_proj")
        else:
            stacked = {}
            for name in _PROJECTIONS:
                found = [tensors.pop(f"mlp.experts.{e}.{name}.weight", None) for e in range(n_experts)]
                missing = [e for e, t in enumerate(found) if t is None]
                if missing:
                    raise CheckpointError(f"{source}: layer {layer} lacks {name} of experts {missing[:8]} "
                                          f"(config.json names {n_experts} experts)")  # fmt: skip
                stacked[name] = torch.stack(found)  # type: ignore[arg-type]
        if tensors:
            extra = sorted(tensors)[0]
            kind = "bias" if re.search(r"bias$", extra) else "tensor"
            raise CheckpointError(f"{source}: {kind} model.layers.{layer}.{extra} is not one edgeattn maps")
        out.update({f"{prefix}.{name}": t for name, t in stacked.items()})
    return out
