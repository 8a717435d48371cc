"""Positional encodings: shapes, determinism, known values, and relative-offset invariance."""

from __future__ import annotations

import math

import pytest
import torch

from edgeattn.config import ModelConfig
from edgeattn.model import build_model
from edgeattn.positional import LearnedPosition, ShawRelativePosition, SinusoidalPosition, T5RelativeBias

pytestmark = pytest.mark.quick


def test_sinusoidal_matches_the_paper_formula():
    pe = SinusoidalPosition(16)(torch.arange(50))
    assert pe.shape == (50, 16)
    for pos in (0, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_sinusoidal_is_deterministic_and_has_no_length_limit():
    a, b = SinusoidalPosition(16), SinusoidalPosition(16)
    torch.testing.assert_close(a(torch.arange(3000)), b(torch.arange(3000)))
    assert list(a.state_dict()) == []  # computed, not a stored table


def test_learned_positions_shape_and_lookup():
    pos = LearnedPosition(32, 8)
    out = pos(torch.arange(5) + 3)
    assert out.shape == (5, 8)
    torch.testing.assert_close(out, pos.weight[3:8])


def relative_modules():
    return {
        "shaw": ShawRelativePosition(clip=4, head_dim=8),
        "t5-bidirectional": T5RelativeBias(n_heads=2, num_buckets=32, max_distance=128, bidirectional=True),
        "t5-causal": T5RelativeBias(n_heads=2, num_buckets=32, max_distance=128, bidirectional=False),
    }


@pytest.mark.parametrize("name", list(relative_modules()))
def test_relative_terms_depend_only_on_offsets(name):
    module = relative_modules()[name]
    q = torch.randn(1, 2, 6, 8)
    base = module(q, torch.arange(6), torch.arange(9))
    for shift in (1, 17, 500):
        shifted = module(q, torch.arange(6) + shift, torch.arange(9) + shift)
        torch.testing.assert_close(base, shifted)
    again = relative_modules()[name]
    again.load_state_dict(module.state_dict())
    torch.testing.assert_close(again(q, torch.arange(6), torch.arange(9)), base)


@pytest.mark.parametrize("name", list(relative_modules()))
def test_relative_terms_follow_the_runtime_length(name):
    module = relative_modules()[name]
    for t, s in ((1, 1), (3, 700), (700, 2)):
        out = module(torch.randn(2, 2, t, 8), torch.arange(t), torch.arange(s))
        assert out.shape[-2:] == (t, s)


def test_shaw_clips_long_offsets():
    module = ShawRelativePosition(clip=2, head_dim=8)
    q = torch.randn(1, 1, 1, 8)
    scores = module(q, torch.tensor([0]), torch.arange(10))
    torch.testing.assert_close(scores[..., 2:], scores[..., 2:3].expand(1, 1, 1, 8))


def test_t5_buckets_match_known_values():
    bias = T5RelativeBias(n_heads=1, num_buckets=32, max_distance=128, bidirectional=True)
    rel = torch.tensor([-200, -20, -3, 0, 3, 20, 200])
    # bidirectional: 16 buckets per side, 8 exact, log-spaced up to 128
    assert bias.bucket(rel).tolist() == [15, 10, 3, 0, 19, 26, 31]
    causal = T5RelativeBias(n_heads=1, num_buckets=32, max_distance=128, bidirectional=False)
    assert causal.bucket(torch.tensor([0, -5, -40, -1000, 7])).tolist() == [0, 5, 23, 31, 0]


@pytest.mark.parametrize("position", ["sinusoidal", "learned", "relative", "t5"])
def test_each_position_kind_builds_a_deterministic_model(position):
    cfg = ModelConfig(vocab_size=40, d_model=32, n_heads=4, d_ff=64, position=position, dropout=0.0)
    a, b = build_model(cfg, seed=3), build_model(cfg, seed=3)
    ids = torch.randint(0, 40, (2, 9))
    tgt = torch.randint(0, 40, (2, 4))
    torch.testing.assert_close(a(ids, tgt), b(ids, tgt))
    # absolute kinds change the output when tokens move; all kinds see order
    assert not torch.allclose(a(ids, tgt), a(ids.flip(1), tgt))
