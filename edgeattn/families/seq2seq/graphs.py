"""The seq2seq family's decoding graphs as PyTorch modules: cross keys and values once per source, the
decoder step over a growing cache, and the step over a fixed cache written in place."""

from __future__ import annotations

from torch import Tensor, nn

from edgeattn.attention import CacheSlots
from edgeattn.families.seq2seq.model import Seq2SeqTransformer


class CrossKVGraph(nn.Module):
    """encoder_hidden_states -> cross_key_0, cross_value_0, ... for every decoder layer."""

    def __init__(self, model: Seq2SeqTransformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, encoder_hidden_states: Tensor) -> tuple[Tensor, ...]:
        return tuple(t for kv in self.model.cross_kv(encoder_hidden_states) for t in kv)

class DecoderGraph(nn.Module):
    """input_ids, encoder_attention_mask, past_*, cross_* -> logits, present_*."""

    def __init__(self, model: Seq2SeqTransformer) -> None:
        super().__init__()
        self.model = model
        self.n_layers = model.config.n_decoder_layers

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, *caches: Tensor) -> tuple[Tensor, ...]:
        n = self.n_layers
        past = [(caches[2 * i], caches[2 * i + 1]) for i in range(n)]
        cross = [(caches[2 * n + 2 * i], caches[2 * n + 2 * i + 1]) for i in range(n)]
        logits, presents = self.model.decode(input_ids, cross_kv=cross, memory_mask=encoder_attention_mask, past=past)
        return (logits, *(t for kv in presents for t in kv))

class FixedDecoderGraph(DecoderGraph):
    """input_ids, encoder_attention_mask, position, cache_*, cross_* -> logits, updated_* (the
    caches with the new keys and values written at position .. position + T - 1)."""

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, position: Tensor, *caches: Tensor
                ) -> tuple[Tensor, ...]:  # fmt: skip
        n = self.n_layers
        slots = [CacheSlots(caches[2 * i], caches[2 * i + 1], position) for i in range(n)]
        cross = [(caches[2 * n + 2 * i], caches[2 * n + 2 * i + 1]) for i in range(n)]
        logits, updated = self.model.decode(input_ids, cross_kv=cross, memory_mask=encoder_attention_mask,
                                            past=slots)  # fmt: skip
        return (logits, *(t for kv in updated for t in kv))
