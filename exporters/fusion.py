"""The fp32-opt graphs: every attention block emitted as ONNX Runtime's fused MultiHeadAttention,
then ONNX Runtime's transformer optimizer for the rest (BiasGelu, FastGelu, SkipLayerNormalization
where it pays).

ONNX Runtime's optimizer finds attention by matching the subgraph an exporter wrote, and it
misses blocks whose pattern differs from the one it knows (the first layer after an embedding,
relative position biases, key/value caches). Instead of hoping for a match, the exporter swaps
each attention core for a function whose ONNX form *is* ``com.microsoft.MultiHeadAttention``
(padding mask, position bias, past keys/values and causal masking are all inputs or attributes
of that operator), so every block of every layer is fused by construction. Top-k sparse
attention has no fused kernel and stays unfused.
"""

from __future__ import annotations

import copy
import functools
import logging
from pathlib import Path
from typing import Any

import onnx
import torch
import torch.nn.functional as F
from torch import Tensor

from edgeattn.attention import (
    AttentionCall,
    CacheSlots,
    KeyValue,
    MultiHeadAttention,
    additive_mask,
    causal_mask,
    combine_masks,
    scaled_dot_product_attention,
)
from edgeattn.model import TransformerModel
from edgeattn.runtime.precisions import FusedForm

log = logging.getLogger(__name__)

MS_DOMAIN = "com.microsoft"
FUSED_ATTENTION_OP = "MultiHeadAttention"


class _OrtMultiHeadAttention(torch.autograd.Function):
    """Eager: the attention core in PyTorch. Exported: one com.microsoft.MultiHeadAttention node."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q_in: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None,
        bias: Tensor | None,
        past_key: Tensor | None,
        past_value: Tensor | None,
        num_heads: int,
        scale: float,
        causal: bool,
        projection_bias: Tensor | None = None,
    ) -> tuple[Tensor, ...]:
        b, t, d = q_in.shape
        hd = d // num_heads
        if projection_bias is not None:  # the q, k, v projections' biases, packed (3d,)
            q_bias, k_bias, v_bias = projection_bias.split(d)
            q_in, key, value = q_in + q_bias, key + k_bias, value + v_bias

        def split(x: Tensor) -> Tensor:
            return x if x.dim() == 4 else x.view(x.shape[0], x.shape[1], num_heads, hd).transpose(1, 2)

        q, k, v = split(q_in), split(key), split(value)
        if past_key is not None:
            k = torch.cat([past_key, k], dim=2)
            v = torch.cat([past_value, v], dim=2)
        mask = None if key_padding_mask is None else key_padding_mask.bool()[:, None, None, :]
        if causal:
            mask = combine_masks(mask, causal_mask(t, k.shape[2], device=q.device))
        out, _ = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, scale=scale)
        out = out.transpose(1, 2).reshape(b, t, d)
        return (out, k, v) if past_key is not None else (out,)

    @staticmethod
    def symbolic(  # type: ignore[no-untyped-def]
        g, q_in, key, value, key_padding_mask, bias, past_key, past_value, num_heads, scale, causal,
        projection_bias=None,
    ):  # fmt: skip
        from torch.onnx._internal.torchscript_exporter import symbolic_helper

        optional = [projection_bias, key_padding_mask, bias, past_key, past_value]
        optional = [None if _is_none(x) else x for x in optional]
        while optional and optional[-1] is None:
            optional.pop()
        inputs = [q_in, key, value] + [
            symbolic_helper._optional_input_placeholder_tensor(g) if x is None else x for x in optional
        ]
        has_past = past_key is not None and not _is_none(past_key)
        outs = g.op(
            f"{MS_DOMAIN}::{FUSED_ATTENTION_OP}",
            *inputs,
            num_heads_i=num_heads,
            scale_f=scale,
            unidirectional_i=int(causal),
            outputs=3 if has_past else 1,
        )
        # declare the output types (sizes stay symbolic) so torch.onnx does not guess them
        if has_past:
            outs[0].setType(q_in.type())
            for present in outs[1:]:
                present.setType(past_key.type().with_sizes([None, None, None, None]))
        else:
            outs.setType(q_in.type())
        return outs


def _is_none(x: Any) -> bool:
    return x is None or (hasattr(x, "node") and x.node().mustBeNone())


class _OrtAttention(torch.autograd.Function):
    """Eager: packed-QKV self-attention in PyTorch. Exported: one com.microsoft.Attention node,
    whose weights int8 quantisation turns into a single QAttention kernel."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: Tensor, weight: Tensor, bias: Tensor, key_padding_mask: Tensor | None, num_heads: int, scale: float
    ) -> Tensor:
        b, t, d = x.shape
        hd = d // num_heads
        qkv = torch.matmul(x, weight) + bias  # (B, T, 3d)
        q, k, v = (p.reshape(b, t, num_heads, hd).transpose(1, 2) for p in qkv.split(d, dim=-1))
        mask = None if key_padding_mask is None else key_padding_mask.bool()[:, None, None, :]
        out, _ = scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
        return out.transpose(1, 2).reshape(b, t, d)

    @staticmethod
    def symbolic(g, x, weight, bias, key_padding_mask, num_heads, scale):  # type: ignore[no-untyped-def]
        inputs = [x, weight, bias] + ([] if _is_none(key_padding_mask) else [key_padding_mask])
        out = g.op(f"{MS_DOMAIN}::Attention", *inputs, num_heads_i=num_heads, scale_f=scale)
        out.setType(x.type())
        return out


def ort_attention_kernel(mha: MultiHeadAttention, call: AttentionCall, packed: bool = True) -> tuple[Tensor, KeyValue]:
    """The :attr:`MultiHeadAttention.kernel` that exports as one fused attention node.

    With ``packed``, plain self-attention (no cache, no causal mask, no position bias: the
    encoder's with absolute positions) becomes ``Attention`` with packed QKV weights, which int8
    dynamic quantisation turns into QAttention; everything else, and everything without
    ``packed`` (whose separate projections weight-only quantisers can reach), becomes
    ``MultiHeadAttention``. Masks must be key-padding masks (B, 1, 1, S), as the encoder and
    decoder build them.
    """
    if isinstance(call.past, CacheSlots):
        return _slots_attention(mha, call)
    padding = None if call.mask is None else call.mask[:, 0, 0, :].to(torch.int32)  # (B, S)
    plain = call.static_kv is None and call.past is None and not mha.causal and call.bias is None
    if packed and plain and call.kv_in is not None:
        weight = torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight], dim=0).t()  # (d, 3d)
        if mha.q_proj.bias is not None:
            qkv_bias = torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias])
        else:
            qkv_bias = torch.zeros(weight.shape[1], dtype=weight.dtype)
        out = _OrtAttention.apply(call.x, weight, qkv_bias, padding, mha.n_heads, float(mha.scale))
        return out, (call.k, call.v)
    key, value = call.static_kv if call.static_kv is not None else call.kv_in  # type: ignore[misc]
    past_k, past_v = call.past if call.past is not None else (None, None)
    q_in, projection_bias = call.q_in, None
    if _biases_into_attention(mha, call):
        # the operator adds the projections' biases itself, saving an Add per projection (three
        # passes over the activations; a static int8 product cannot take its bias in QDQ form)
        q_in, key, value = (F.linear(call.x, p.weight) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
        projection_bias = torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias])
    outs = _OrtMultiHeadAttention.apply(
        q_in, key, value, padding, call.bias, past_k, past_v, mha.n_heads, float(mha.scale), mha.causal,
        projection_bias,
    )  # fmt: skip
    if call.past is not None:
        return outs[0], (outs[1], outs[2])
    return outs[0], (call.k, call.v)


def _biases_into_attention(mha: MultiHeadAttention, call: AttentionCall) -> bool:
    """Whether self-attention's projection biases can move into the fused operator: the block
    projects its own input (no cache, no cross source) and nothing else reads the biased
    projections (no position term over the queries)."""
    own_input = not mha.cross and call.kv_in is not None and call.past is None  # kv_in: no static_kv
    return own_input and mha.q_proj.bias is not None and mha.relative is None


def _slots_attention(mha: MultiHeadAttention, call: AttentionCall) -> tuple[Tensor, KeyValue]:
    """Self-attention over a fixed-capacity cache as MultiHeadAttention: keys and values are every
    slot after this call's write (B, H, C, D), and the causal mask over the slots (the unwritten
    ones masked with the rest) joins the position bias as the operator's ``attention_bias``."""
    if call.causal is None:
        raise ValueError("a slot cache is for causal self-attention")
    bias = additive_mask(call.causal, call.q.dtype)[None, None]  # (1, 1, T, C)
    if call.bias is not None:
        bias = call.bias + bias  # (1, H, T, C)
    out = _OrtMultiHeadAttention.apply(call.q_in, call.k, call.v, None, bias, None, None, mha.n_heads,
                                       float(mha.scale), False)  # fmt: skip
    return out[0], (call.k, call.v)


def can_fuse(model: TransformerModel) -> tuple[bool, str]:
    """Whether every attention block of this model has a fused kernel, and why not."""
    if model.config.attention_topk is not None:
        return False, "top-k sparse attention has no fused ONNX Runtime kernel"
    return True, ""


def fused_copy(model: TransformerModel, packed: bool = True) -> TransformerModel:
    """A copy of ``model`` whose attention blocks export as fused attention nodes (see
    :func:`ort_attention_kernel` for ``packed``)."""
    fused = copy.deepcopy(model).eval()
    ok, _ = can_fuse(fused)
    if ok:
        kernel = ort_attention_kernel if packed else functools.partial(ort_attention_kernel, packed=False)
        for module in fused.modules():
            if isinstance(module, MultiHeadAttention):
                module.kernel = kernel
    return fused


def optimize_fused(path: Path, model: TransformerModel, form: FusedForm) -> onnx.ModelProto:
    """Run ONNX Runtime's transformer optimizer (offline fusions only, portable across machines)
    on an exported graph; returns the optimised model (not saved)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    c = model.config
    options = FusionOptions("bert")
    options.enable_attention = False  # attention is already fused, by construction
    # RMS norms would become SimplifiedLayerNormalization, an ONNX Runtime operator in the ONNX
    # domain that onnx.checker (and any other runtime) does not know: they stay as plain operators
    options.enable_layer_norm = c.norm != "rmsnorm"
    options.enable_skip_layer_norm = form.skip_layer_norm
    options.enable_bias_skip_layer_norm = form.skip_layer_norm
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    optimized = optimize_model(
        str(path), model_type="bert", num_heads=c.n_heads, hidden_size=c.n_heads * c.head_dim,
        optimization_options=options, opt_level=0, only_onnxruntime=False,
    )  # fmt: skip
    return optimized.model
