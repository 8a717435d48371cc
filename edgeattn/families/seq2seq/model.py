"""The seq2seq family's PyTorch model: an encoder-decoder with a language-model head over a shared vocabulary."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from edgeattn.attention import Cache, KeyValue
from edgeattn.config import ModelConfig
from edgeattn.model import Decoder, Encoder, TransformerModel, relative_aliases


class Seq2SeqTransformer(TransformerModel):
    """Encoder-decoder transformer with a language-model head over a shared vocabulary."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def tied_aliases(self) -> dict[str, str]:
        aliases = {**super().tied_aliases(), **relative_aliases(self.config, "decoder", self.config.n_decoder_layers)}
        if self.config.tie_embeddings:
            aliases["lm_head.weight"] = "embed.weight"
        return aliases

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None, need_weights: bool = False) -> Tensor:
        """(B, S) source ids -> encoder hidden states (B, S, d_model)."""
        return self.encoder(self.embed_tokens(src_ids), src_mask, need_weights=need_weights)[0]

    def cross_kv(self, memory: Tensor) -> list[KeyValue]:
        """Per-layer cross-attention keys/values of the encoder output, computed once per source."""
        return self.decoder.cross_kv(memory)

    def decode(
        self,
        tgt_ids: Tensor,
        *,
        memory: Tensor | None = None,
        cross_kv: list[KeyValue] | None = None,
        memory_mask: Tensor | None = None,
        past: list[Cache] | None = None,
    ) -> tuple[Tensor, list[KeyValue]]:
        """(B, T) target ids after ``past`` -> logits (B, T, vocab) and the present caches."""
        h, presents = self.decoder(
            self.embed_tokens(tgt_ids), memory=memory, cross_kv=cross_kv, memory_mask=memory_mask, past=past
        )  # (B, T, d_model)
        if self.config.scale_decoder_output:
            h = h * self.config.d_model**-0.5
        return self.lm_head(h), presents

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Teacher-forced logits (B, T, vocab) for targets ``tgt_ids`` given the source."""
        memory = self.encode(src_ids, src_mask)
        return self.decode(tgt_ids, memory=memory, memory_mask=src_mask)[0]

    @torch.no_grad()
    def greedy(
        self, src_ids: Tensor, src_mask: Tensor | None = None, max_new_tokens: int = 20, stop_at_eos: bool = True
    ) -> Tensor:
        """Greedy decoding with the cache: (B, S) -> (B, N) new tokens, ``pad_id`` after each row's
        EOS (with ``stop_at_eos=False``, every row runs all ``max_new_tokens`` steps)."""
        cfg = self.config
        memory = self.encode(src_ids, src_mask)
        cross = self.cross_kv(memory)
        b = src_ids.shape[0]
        token = torch.full((b, 1), cfg.bos_id, dtype=torch.long, device=src_ids.device)
        done = torch.zeros(b, dtype=torch.bool, device=src_ids.device)
        past: list[KeyValue] | None = None
        out = []
        for _ in range(max_new_tokens):
            logits, past = self.decode(token, cross_kv=cross, memory_mask=src_mask, past=past)
            nxt = logits[:, -1].argmax(-1)
            if stop_at_eos:
                nxt = torch.where(done, torch.full_like(nxt, cfg.pad_id), nxt)
                done = done | (nxt == cfg.eos_id)
            out.append(nxt)
            token = nxt[:, None]
            if bool(done.all()):
                break
        return torch.stack(out, dim=1)
