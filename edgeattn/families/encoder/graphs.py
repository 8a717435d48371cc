"""The encoder family's graphs as PyTorch modules whose flat tensor signature is their spec's: one
attention block, and the token encoder (hidden states and the head's logits)."""

from __future__ import annotations

from torch import Tensor, nn

from edgeattn.attention import MultiHeadAttention, padding_mask
from edgeattn.families.encoder.model import EncoderModel
from edgeattn.model import TransformerModel


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
