"""Feed-forward, normalisation, and the encoder and decoder layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgeattn.attention import Cache, KeyValue, MultiHeadAttention, ScoreTerms
from edgeattn.config import ModelConfig


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight, without centring or bias (T5-style)."""

    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(config: ModelConfig) -> nn.Module:
    """The normalisation layer the config asks for."""
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model, config.norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps)


def _activate(x: Tensor, activation: str) -> Tensor:
    activation = activation.removeprefix("gated-")
    if activation == "relu":
        return F.relu(x)
    if activation == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    if activation == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    return F.gelu(x)


class FeedForward(nn.Module):
    """Position-wise feed-forward: linear2(dropout(act(linear1(x)))).

    ``gated-gelu`` (``gated-gelu_tanh``) multiplies gelu(linear1(x)) by a second projection
    ``gate(x)`` (T5 v1.1 and Flan-T5 use the tanh form).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.activation = config.activation
        self.linear1 = nn.Linear(config.d_model, config.d_ff, bias=config.bias)
        self.gate = nn.Linear(config.d_model, config.d_ff, bias=config.bias) if config.gated else None
        self.linear2 = nn.Linear(config.d_ff, config.d_model, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = _activate(self.linear1(x), self.activation)  # (B, T, d_ff)
        if self.gate is not None:
            h = h * self.gate(x)
        return self.linear2(self.dropout(h))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in a residual and a norm.

    Post-LN: x = norm(x + sublayer(x)). Pre-LN (``norm_first``): x = x + sublayer(norm(x)).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.self_attn = MultiHeadAttention(config)
        self.ff = FeedForward(config)
        self.norm1 = make_norm(config)
        self.norm2 = make_norm(config)
        self.dropout1 = nn.Dropout(config.dropout)
        self.dropout2 = nn.Dropout(config.dropout)

    def _sa(
        self, x: Tensor, mask: Tensor | None, terms: ScoreTerms | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        out, weights, _ = self.self_attn(x, mask=mask, terms=terms, need_weights=need_weights)
        return self.dropout1(out), weights

    def forward(
        self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False, terms: ScoreTerms | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, S, d_model), mask broadcasting to (B, H, S, S) -> (B, S, d_model), weights.
        ``terms``: the self-attention's position terms when the stack made them once."""
        if self.norm_first:
            sa, weights = self._sa(self.norm1(x), mask, terms, need_weights)
            x = x + sa
            x = x + self.dropout2(self.ff(self.norm2(x)))
        else:
            sa, weights = self._sa(x, mask, terms, need_weights)
            x = self.norm1(x + sa)
            x = self.norm2(x + self.dropout2(self.ff(x)))
        return x, weights


class DecoderLayer(nn.Module):
    """Causal self-attention (with a key/value cache), cross-attention, feed-forward."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.self_attn = MultiHeadAttention(config, causal=True)
        self.cross_attn = MultiHeadAttention(config, cross=True)
        self.ff = FeedForward(config)
        self.norm1 = make_norm(config)
        self.norm2 = make_norm(config)
        self.norm3 = make_norm(config)
        self.dropout1 = nn.Dropout(config.dropout)
        self.dropout2 = nn.Dropout(config.dropout)
        self.dropout3 = nn.Dropout(config.dropout)

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        cross_kv: KeyValue | None = None,
        memory_mask: Tensor | None = None,
        past: Cache | None = None,
        terms: ScoreTerms | None = None,
    ) -> tuple[Tensor, KeyValue]:
        """x (B, T, d_model) -> (B, T, d_model) and the present self-attention cache.

        The source comes as ``memory`` (B, S, d_model) or as its projected ``cross_kv``;
        ``memory_mask`` broadcasts to (B, H, T, S); self-attention is causal, its position terms
        ``terms`` when the stack made them once.
        """

        def sa(h: Tensor) -> tuple[Tensor, KeyValue]:
            out, _, present = self.self_attn(h, past=past, terms=terms)
            return self.dropout1(out), present

        def ca(h: Tensor) -> Tensor:
            out, _, _ = self.cross_attn(h, memory=memory, static_kv=cross_kv, mask=memory_mask)
            return self.dropout2(out)

        if self.norm_first:
            out, present = sa(self.norm1(x))
            x = x + out
            x = x + ca(self.norm2(x))
            x = x + self.dropout3(self.ff(self.norm3(x)))
        else:
            out, present = sa(x)
            x = self.norm1(x + out)
            x = self.norm2(x + ca(x))
            x = self.norm3(x + self.dropout3(self.ff(x)))
        return x, present
