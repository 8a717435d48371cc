"""The causal family's graph as a PyTorch module (the eager reference its written graph is verified
against): a prompt or the next tokens over caches written in place."""

from __future__ import annotations

from torch import Tensor, nn

from edgeattn.attention import CacheSlots, share_slot_index
from edgeattn.model import TransformerModel


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
