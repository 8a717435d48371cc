"""The speech family's own graph modules: a window's log-mel features -> encoder states, and the
encoder-decoder family's decoder (:mod:`edgeattn.exporters.graphs`) that also returns the
alignment heads' cross-attention weights (the cross keys/values graph is that family's)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgeattn.attention import MultiHeadAttention
from edgeattn.attention import scaled_dot_product_attention as attend
from edgeattn.families.seq2seq.graphs import DecoderGraph
from edgeattn.families.speech.model import WhisperModel


class AudioEncoderGraph(nn.Module):
    """input_features (B, n_mels, frames) -> last_hidden_state (B, frames / 2, d)."""

    def __init__(self, model: WhisperModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_features: Tensor) -> Tensor:
        return self.model.encode(input_features)


class SpeechDecoderGraph(DecoderGraph):
    """input_ids, encoder_attention_mask, past_*, cross_* -> logits, present_* and, where the
    config lists alignment heads, ``alignment`` (B, heads, T, audio positions): those heads'
    cross-attention weights, the evidence of word timestamps.

    The weights are computed beside each attention block, from its input and cross keys, by a
    query projection of the listed heads alone: the block itself is left as it was, for ONNX
    Runtime's attention fusion to find."""

    def __init__(self, model: WhisperModel) -> None:
        super().__init__(model)  # type: ignore[arg-type]
        assert model.config.section is not None
        self.heads = model.config.section.alignment_heads

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, *caches: Tensor) -> tuple[Tensor, ...]:
        if not self.heads:
            return super().forward(input_ids, encoder_attention_mask, *caches)
        weights: dict[int, Tensor] = {}
        layers = self.model.decoder.layers
        hooks = [layers[layer].cross_attn.register_forward_hook(_keeping_weights(weights, layer, self.heads),
                                                                 with_kwargs=True)
                 for layer in sorted({layer for layer, _ in self.heads})]  # fmt: skip
        try:
            outputs = super().forward(input_ids, encoder_attention_mask, *caches)
        finally:
            for hook in hooks:
                hook.remove()
        alignment = torch.cat([weights[layer] for layer in sorted(weights)], dim=1)  # (B, A, T, S), heads in order
        order = [sorted(self.heads).index(h) for h in self.heads]
        return (*outputs, alignment[:, order])


def _keeping_weights(store: dict[int, Tensor], layer: int, heads: tuple[tuple[int, int], ...]) -> Any:
    """A forward hook on a cross-attention block keeping, in ``store``, the weights (B, h, T, S)
    of its listed heads: softmax(q_h K_hᵀ · scale + mask) from the block's input and keys."""
    chosen = sorted(head for at, head in heads if at == layer)

    def hook(mha: MultiHeadAttention, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        x, (k, _) = args[0], kwargs["static_kv"]
        d = mha.head_dim
        rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in chosen])
        bias = None if mha.q_proj.bias is None else mha.q_proj.bias[rows]
        q = F.linear(x, mha.q_proj.weight[rows], bias)  # (B, T, h * D)
        q = q.view(q.shape[0], q.shape[1], len(chosen), d).transpose(1, 2)  # (B, h, T, D)
        _, kept = attend(q, k[:, chosen], k[:, chosen], mask=kwargs.get("mask"), scale=mha.scale, need_weights=True)
        assert kept is not None
        store[layer] = kept

    return hook
