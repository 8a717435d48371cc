"""The PyTorch side of each exported graph: a module whose flat tensor signature is its spec's.

The same modules are traced for export and run eagerly as the verifier's reference.
"""

from __future__ import annotations

from torch import Tensor, nn

from edgeattn.attention import CacheSlots, MultiHeadAttention, padding_mask, share_slot_index
from edgeattn.model import EncoderModel, Seq2SeqTransformer, TransformerModel
from edgeattn.runtime.families import family_of, resolve
from edgeattn.runtime.specs import GraphSpec


class AttentionGraph(nn.Module):
    """query, key, value, key_padding_mask -> attention_output (the first encoder layer's block)."""

    def __init__(self, model: TransformerModel) -> None:
        super().__init__()
        self.mha: MultiHeadAttention = model.encoder.layers[0].self_attn

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor) -> Tensor:
        kv = (self.mha._split(self.mha.k_proj(key)), self.mha._split(self.mha.v_proj(value)))
        out, _, _ = self.mha(query, static_kv=kv, mask=padding_mask(key_padding_mask))
        return out


class EncoderGraph(nn.Module):
    """input_ids, attention_mask (, token_type_ids) -> last_hidden_state (and logits for models with a head)."""

    def __init__(self, model: TransformerModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        if isinstance(self.model, EncoderModel):
            if self.model.classifier is not None:
                return self.model(input_ids, attention_mask, token_type_ids)
            return self.model.encode(input_ids, attention_mask, token_type_ids=token_type_ids)
        return self.model.encode(input_ids, attention_mask)


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


class CausalDecoderGraph(nn.Module):
    """input_ids, attention_mask, position_ids, position, logits_at, cache_* -> logits, updated_*
    (the caches with the new keys and values written at position .. position + T - 1)."""

    def __init__(self, model: TransformerModel) -> None:
        super().__init__()
        self.model = model
        self.n_layers = model.config.n_decoder_layers

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, position: Tensor,
                logits_at: Tensor, *caches: Tensor) -> tuple[Tensor, ...]:  # fmt: skip
        slots = [CacheSlots(caches[2 * i], caches[2 * i + 1], position) for i in range(self.n_layers)]
        slots = share_slot_index(slots, input_ids.shape[0], input_ids.shape[1])
        logits, updated = self.model(input_ids, attention_mask, position_ids, slots, logits_at)
        return (logits, *(t for kv in updated for t in kv))


def graph_module(name: str, model: TransformerModel) -> tuple[nn.Module, GraphSpec]:
    """The module to trace for graph ``name`` (its family role's module) and that graph's spec."""
    role = family_of(model.config).role(name)
    module: nn.Module = resolve(role.module)(model)
    return module.eval(), role.spec(model.config)
