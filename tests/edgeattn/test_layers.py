"""Encoder and decoder layers against torch.nn.TransformerEncoderLayer / TransformerDecoderLayer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgeattn.attention import MultiHeadAttention
from edgeattn.config import ModelConfig
from edgeattn.layers import DecoderLayer, EncoderLayer, FeedForward, RMSNorm

pytestmark = pytest.mark.quick

D, HEADS, FF = 32, 4, 64


def config(norm_first: bool, activation: str = "relu") -> ModelConfig:
    return ModelConfig(
        d_model=D,
        n_heads=HEADS,
        d_ff=FF,
        dropout=0.0,
        norm_first=norm_first,
        activation=activation,
        position="none",
        norm_eps=1e-5,
    )


def copy_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    wq, wk, wv = theirs.in_proj_weight.chunk(3)
    bq, bk, bv = theirs.in_proj_bias.chunk(3)
    for proj, w, b in ((ours.q_proj, wq, bq), (ours.k_proj, wk, bk), (ours.v_proj, wv, bv)):
        proj.weight.data.copy_(w)
        proj.bias.data.copy_(b)
    ours.out_proj.load_state_dict(theirs.out_proj.state_dict())


def copy_common(ours: nn.Module, theirs: nn.Module) -> None:
    ours.ff.linear1.load_state_dict(theirs.linear1.state_dict())
    ours.ff.linear2.load_state_dict(theirs.linear2.state_dict())
    for name in ("norm1", "norm2", "norm3"):
        if hasattr(theirs, name):
            # non-trivial norm weights, so that a swapped norm would show
            getattr(theirs, name).weight.data.uniform_(0.5, 1.5)
            getattr(theirs, name).bias.data.uniform_(-0.5, 0.5)
            getattr(ours, name).load_state_dict(getattr(theirs, name).state_dict())


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch(norm_first, activation):
    theirs = nn.TransformerEncoderLayer(
        D, HEADS, FF, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    ).eval()
    ours = EncoderLayer(config(norm_first, activation)).eval()
    copy_attention(ours.self_attn, theirs.self_attn)
    copy_common(ours, theirs)
    x = torch.randn(3, 9, D)
    pad = torch.tensor([[False] * 9, [False] * 6 + [True] * 3, [False] * 2 + [True] * 7])
    with torch.no_grad():
        ref = theirs(x, src_key_padding_mask=pad)
        got, _ = ours(x, mask=(~pad)[:, None, None, :])
    # torch's fast path leaves padded positions as zeros; compare the real tokens
    keep = ~pad
    torch.testing.assert_close(got[keep], ref[keep], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        ref_all = theirs(x)
        got_all, _ = ours(x)
    torch.testing.assert_close(got_all, ref_all, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_decoder_layer_matches_torch(norm_first):
    theirs = nn.TransformerDecoderLayer(D, HEADS, FF, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    ours = DecoderLayer(config(norm_first)).eval()
    copy_attention(ours.self_attn, theirs.self_attn)
    copy_attention(ours.cross_attn, theirs.multihead_attn)
    copy_common(ours, theirs)
    x, memory = torch.randn(2, 6, D), torch.randn(2, 8, D)
    mem_pad = torch.tensor([[False] * 8, [False] * 5 + [True] * 3])
    causal = nn.Transformer.generate_square_subsequent_mask(6)
    with torch.no_grad():
        ref = theirs(x, memory, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=mem_pad)
        got, present = ours(x, memory=memory, memory_mask=(~mem_pad)[:, None, None, :])
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert present[0].shape == (2, HEADS, 6, D // HEADS)


def test_gated_gelu_feed_forward():
    ff = FeedForward(ModelConfig(d_model=D, n_heads=HEADS, d_ff=FF, activation="gated-gelu", dropout=0.0)).eval()
    x = torch.randn(2, 3, D)
    expected = ff.linear2(torch.nn.functional.gelu(ff.linear1(x)) * ff.gate(x))
    torch.testing.assert_close(ff(x), expected)


def test_rms_norm():
    norm = RMSNorm(D, eps=1e-6)
    x = torch.randn(4, D)
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(x), expected)


def test_dropout_is_inert_in_eval_and_active_in_train():
    layer = EncoderLayer(ModelConfig(d_model=D, n_heads=HEADS, d_ff=FF, dropout=0.5, position="none"))
    x = torch.randn(2, 5, D)
    layer.eval()
    torch.testing.assert_close(layer(x)[0], layer(x)[0])
    layer.train()
    assert not torch.allclose(layer(x)[0], layer(x)[0])
