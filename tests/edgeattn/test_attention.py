"""Attention against a float64 reference written from the formula, masks, top-k, and the cache."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from edgeattn.attention import (
    MultiHeadAttention,
    causal_mask,
    combine_masks,
    padding_mask,
    scaled_dot_product_attention,
)
from edgeattn.config import ModelConfig
from edgeattn.model import build_model

pytestmark = pytest.mark.quick

B, H, T, S, D = 3, 2, 5, 7, 8


def reference(q, k, v, keep=None, additive=None):
    """softmax(QKᵀ/√d + mask)V in float64; a row with no key left gives zeros."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if additive is not None:
        scores = scores + additive.double()
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v, weights


def qkv():
    return torch.randn(B, H, T, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)


def lengths_mask(lengths, s=S):
    ids = torch.tensor([[1] * n + [0] * (s - n) for n in lengths])
    return ids


def random_bool(shape):
    m = torch.rand(shape) > 0.5
    m[..., 0] = True  # at least one key per row
    return m


MASKS = {
    "none": lambda: None,
    "padding": lambda: padding_mask(lengths_mask([7, 4, 1])),
    "causal": lambda: causal_mask(T, S),
    "padding+causal": lambda: combine_masks(padding_mask(lengths_mask([7, 6, 3])), causal_mask(T, S)),
    "boolean": lambda: random_bool((B, H, T, S)),
}


@pytest.mark.parametrize("kind", list(MASKS))
def test_boolean_masks_match_float64_reference(kind):
    q, k, v = qkv()
    mask = MASKS[kind]()
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, need_weights=True)
    keep = None if mask is None else mask.expand(B, H, T, S)
    ref_out, ref_w = reference(q, k, v, keep=keep)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.double(), ref_w, atol=1e-6, rtol=1e-5)
    if keep is not None:
        assert (weights[~keep] == 0).all()


def test_additive_mask_matches_reference_and_minus_inf_is_safe():
    q, k, v = qkv()
    additive = torch.randn(B, 1, T, S)
    additive[0, 0, :, 3:] = float("-inf")
    out, weights = scaled_dot_product_attention(q, k, v, mask=additive, need_weights=True)
    ref_out, ref_w = reference(q, k, v, additive=additive)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.double(), ref_w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("as_additive", [False, True])
def test_fully_masked_row_gives_zeros_not_nan(as_additive):
    q, k, v = qkv()
    keep = torch.ones(B, 1, T, S, dtype=torch.bool)
    keep[1, 0, 2, :] = False  # query 2 of batch row 1 sees nothing
    keep[2, 0, :, :] = False  # batch row 2 sees nothing at all
    mask = keep if not as_additive else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, need_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert (out[1, :, 2] == 0).all() and (out[2] == 0).all()
    assert (weights[2] == 0).all()
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(H, T))


def test_topk_keeps_the_k_largest_scores_per_row():
    q, k, v = qkv()
    mask = padding_mask(lengths_mask([7, 4, 1]))
    _, weights = scaled_dot_product_attention(q, k, v, mask=mask, topk=0.5, need_weights=True)
    kept = (weights > 0).sum(-1)  # (B, H, T)
    for b, valid in enumerate([7, 4, 1]):
        assert (kept[b] == math.ceil(0.5 * valid)).all()
    # the kept keys are the highest-scoring valid ones
    scores = (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
    top = scores.topk(4, dim=-1).indices  # row 0 keeps ceil(3.5) = 4
    assert (weights[0].gather(-1, top[0]) > 0).all()


def test_topk_fraction_one_equals_dense():
    q, k, v = qkv()
    dense, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(T, S))
    sparse, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(T, S), topk=1.0)
    torch.testing.assert_close(dense, sparse)


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal"])
def test_multi_head_attention_matches_torch_sdpa(mask_kind):
    cfg = ModelConfig(d_model=32, n_heads=4, dropout=0.0, position="none")
    mha = MultiHeadAttention(cfg).eval()
    x = torch.randn(B, S, 32)
    lengths = lengths_mask([7, 5, 2])
    mask = {"none": None, "padding": padding_mask(lengths), "causal": causal_mask(S, S)}[mask_kind]
    out, _, _ = mha(x, mask=mask)

    def heads(t):
        return t.view(B, S, 4, 8).transpose(1, 2)

    q, k, v = heads(mha.q_proj(x)), heads(mha.k_proj(x)), heads(mha.v_proj(x))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ref = mha.out_proj(ref.transpose(1, 2).reshape(B, S, 32))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_cross_attention_with_other_key_length():
    cfg = ModelConfig(d_model=32, n_heads=4, dropout=0.0)
    mha = MultiHeadAttention(cfg, cross=True).eval()
    x, memory = torch.randn(2, 3, 32), torch.randn(2, 11, 32)
    out, weights, (k, v) = mha(x, memory=memory, need_weights=True)
    assert out.shape == (2, 3, 32) and weights.shape == (2, 4, 3, 11) and k.shape == (2, 4, 11, 8)
    again, _, _ = mha(x, static_kv=mha.project_kv(memory))
    torch.testing.assert_close(out, again)


@pytest.mark.parametrize("position", ["sinusoidal", "learned", "relative", "t5"])
@pytest.mark.parametrize("prefix", [1, 4, 9])
def test_decoder_cache_equals_recomputing_the_prefix(tiny_config, position, prefix):
    model = build_model(tiny_config.replace(position=position, attention_topk=None), seed=1)
    src = torch.randint(3, 50, (2, 6))
    src_mask = lengths_mask([6, 3], s=6)
    tgt = torch.randint(3, 50, (2, 12))
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full, _ = model.decode(tgt, memory=memory, memory_mask=src_mask)
        cross = model.cross_kv(memory)
        logits, past = model.decode(tgt[:, :prefix], cross_kv=cross, memory_mask=src_mask)
        steps = [logits]
        for t in range(prefix, tgt.shape[1]):
            logits, past = model.decode(tgt[:, t : t + 1], cross_kv=cross, memory_mask=src_mask, past=past)
            steps.append(logits)
    assert past[0][0].shape == (2, 4, 12, 8)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", ["sinusoidal", "relative", "t5"])
def test_sdpa_kernel_matches_the_default_core(tiny_config, position):
    from edgeattn.attention import torch_sdpa_kernel

    model = build_model(tiny_config.replace(position=position), seed=2)
    src = torch.randint(3, 50, (2, 7))
    src_mask = lengths_mask([7, 4], s=7)
    tgt = torch.randint(3, 50, (2, 5))
    with torch.no_grad():
        ref = model(src, tgt, src_mask)
        for module in model.modules():
            if isinstance(module, MultiHeadAttention):
                module.kernel = torch_sdpa_kernel
        got = model(src, tgt, src_mask)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
