"""Whisper in PyTorch: a convolutional front end and a pre-norm transformer encoder over log-mel
frames, and edgeattn's pre-norm decoder (learned positions, cross-attention, a per-layer
self-attention cache) with an output layer tied to the token embedding.

Shapes: features (B, n_mels, 2·P) -> encoder states (B, P, d) for P audio positions (1,500 for
a 30 s window); target ids (B, T) -> logits (B, T, vocab).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgeattn.attention import Cache, KeyValue
from edgeattn.config import ModelConfig
from edgeattn.layers import EncoderLayer, make_norm
from edgeattn.model import Decoder, TransformerModel


class AudioEncoder(nn.Module):
    """conv(3) -> GELU -> conv(3, stride 2) -> GELU, plus a position table, then pre-norm encoder
    layers and a final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        assert config.section is not None, "a speech-to-text config has its speech section"
        shape, d = config.section, config.d_model
        self.conv1 = nn.Conv1d(shape.n_mels, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.positions = nn.Parameter(torch.empty(shape.audio_positions, d))
        nn.init.normal_(self.positions, std=0.02)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
        self.final_norm = make_norm(config)

    def forward(self, features: Tensor) -> Tensor:
        """(B, n_mels, frames) -> (B, frames / 2, d)."""
        x = F.gelu(self.conv1(features))  # (B, d, frames)
        x = F.gelu(self.conv2(x)).transpose(1, 2)  # (B, P, d)
        x = x + self.positions[: x.shape[1]]
        for layer in self.layers:
            x, _ = layer(x)
        return self.final_norm(x)


class WhisperModel(TransformerModel):
    """Whisper's encoder-decoder: :meth:`encode` a window's features once, :meth:`cross_kv` once,
    then :meth:`decode` tokens with the self-attention cache."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.encoder = AudioEncoder(config)
        self.decoder = Decoder(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.embed.weight

    def tied_aliases(self) -> dict[str, str]:
        return {"lm_head.weight": "embed.weight"}

    def encode(self, features: Tensor) -> Tensor:
        """(B, n_mels, frames) log-mel features -> encoder states (B, frames / 2, d)."""
        return self.encoder(features)

    def cross_kv(self, memory: Tensor) -> list[KeyValue]:
        """Each decoder layer's cross-attention keys and values (B, H, P, D), once per window."""
        return self.decoder.cross_kv(memory)

    def decode(
        self, ids: Tensor, *, memory: Tensor | None = None, cross_kv: list[KeyValue] | None = None,
        memory_mask: Tensor | None = None, past: list[Cache] | None = None,
    ) -> tuple[Tensor, list[KeyValue]]:  # fmt: skip
        """(B, T) token ids after ``past`` -> logits (B, T, vocab) and the present caches
        (``memory_mask`` (B, P): the audio positions attended to, all of them when None)."""
        h, presents = self.decoder(self.embed_tokens(ids), memory=memory, cross_kv=cross_kv, memory_mask=memory_mask,
                                   past=past)
        return self.lm_head(h), presents

    def forward(self, features: Tensor, ids: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, vocab) of ``ids`` given a window's features."""
        return self.decode(ids, memory=self.encode(features))[0]

    def greedy(self, features: Tensor, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Plain greedy decoding (every step's top token, no end, no rules) after ``prompts`` (one
        length): the rows' whole sequences, prompts included."""
        with torch.no_grad():
            cross = self.cross_kv(self.encode(features))
            rows = [list(p) for p in prompts]
            feed, past = torch.tensor(prompts, dtype=torch.long), None
            for _ in range(max_new_tokens):
                logits, past = self.decode(feed, cross_kv=cross, past=past)
                chosen = logits[:, -1].argmax(-1)
                for row, token in zip(rows, chosen.tolist(), strict=True):
                    row.append(token)
                feed = chosen[:, None]
        return rows
