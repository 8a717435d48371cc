"""The encoder family's PyTorch model: an encoder alone, with a pooled or per-token classification head."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from edgeattn.config import ModelConfig
from edgeattn.model import Encoder, TransformerModel


class EncoderModel(TransformerModel):
    """An encoder alone, optionally with a sequence- or token-classification head."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.token_type = nn.Embedding(config.token_types, config.d_model) if config.token_types else None
        if self.token_type is not None:
            nn.init.normal_(self.token_type.weight, std=0.02)
        self.encoder = Encoder(config)
        self.pooler = nn.Linear(config.d_model, config.d_model) if config.pooler != "none" else None
        self.classifier = nn.Linear(config.d_model, config.num_labels) if config.head != "none" else None

    def positions(self, input_ids: Tensor) -> Tensor | None:
        """(B, S) position rows when the config offsets them (counting non-pad tokens only), else None."""
        c = self.config
        if not c.position_offset:
            return None
        real = (input_ids != c.pad_id).long()  # (B, S)
        return torch.cumsum(real, dim=1) * real + (c.position_offset - 1)

    def encode(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, need_weights: bool = False,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:  # fmt: skip
        """(B, S) ids (and token types, zeros by default) -> hidden states (B, S, d_model)."""
        x = self.embed_tokens(input_ids)
        if self.token_type is not None:
            types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            x = x + self.token_type(types)
        positions = self.positions(input_ids)
        return self.encoder(x, attention_mask, need_weights=need_weights, positions=positions)[0]

    def pool(self, hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
        """(B, S, d) -> (B, d): the first token, or the mean over real tokens."""
        if self.config.pooling == "first":
            return hidden[:, 0]
        if attention_mask is None:
            return hidden.mean(dim=1)
        m = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, S, 1)
        return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Hidden states (B, S, d) and logits: (B, labels) per sequence or (B, S, labels) per token."""
        hidden = self.encode(input_ids, attention_mask, token_type_ids=token_type_ids)
        if self.classifier is None:
            return hidden, None
        if self.config.head == "sequence":
            pooled = self.pool(hidden, attention_mask)
            if self.pooler is not None:
                pooled = self.pooler(pooled)
                pooled = torch.tanh(pooled) if self.config.pooler == "tanh" else torch.relu(pooled)
            return hidden, self.classifier(pooled)
        return hidden, self.classifier(hidden)
