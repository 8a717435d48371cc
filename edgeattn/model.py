"""Whole models' shared parts: the encoder and decoder stacks, the base every family's model is, and
the model a config describes (its family's class, :func:`build_model`)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from edgeattn.attention import Cache, CacheSlots, KeyValue, ScoreTerms, padding_mask, share_slot_index
from edgeattn.config import ModelConfig
from edgeattn.layers import DecoderLayer, EncoderLayer, make_norm
from edgeattn.positional import build_absolute


class _Stack(nn.Module):
    """What encoder and decoder stacks share: absolute positions, embedding norm, final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.position = build_absolute(config)
        self.embed_norm = make_norm(config) if config.embedding_norm else None
        self.dropout = nn.Dropout(config.dropout)
        self.final_norm = make_norm(config) if config.norm_first else None
        self.relative_shared = config.relative_shared

    def _prepare(self, x: Tensor, offset: Tensor | int = 0, positions: Tensor | None = None) -> Tensor:
        """Token embeddings (B, T, d) plus positions (``positions`` (B, T), else offset..offset+T-1),
        normed, dropped out."""
        if self.position is not None:
            if positions is None:
                positions = torch.arange(x.shape[1], device=x.device) + offset
            x = x + self.position(positions)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        return self.dropout(x)

    def _finish(self, x: Tensor) -> Tensor:
        return x if self.final_norm is None else self.final_norm(x)

    def _shared_terms(self, t: int | Tensor, s: int | Tensor, offset: Tensor | int | None) -> ScoreTerms | None:
        """The self-attention score terms every layer shares, made once: the causal mask, and the
        position bias when the stack has one T5 table; None when there is nothing to share."""
        first = self.layers[0].self_attn
        if not (first.causal or self.relative_shared):
            return None
        return first.score_terms(t, s, offset, bias=self.relative_shared)


def share_relative(layers: nn.ModuleList, attention: str) -> None:
    """Every layer's ``attention`` block uses the first layer's relative-position module (T5)."""
    first = getattr(layers[0], attention).relative
    for layer in layers[1:]:
        getattr(layer, attention).relative = first


def relative_aliases(config: ModelConfig, prefix: str, layers: int, attention: str = "self_attn") -> dict[str, str]:
    """State-dict keys of relative tables shared with the first layer's: {alias: source}."""
    if not config.relative_shared:
        return {}
    source = f"{prefix}.layers.0.{attention}.relative.embedding.weight"
    return {f"{prefix}.layers.{i}.{attention}.relative.embedding.weight": source for i in range(1, layers)}


class Encoder(_Stack):
    """A stack of encoder layers over token embeddings."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
        if config.relative_shared:
            share_relative(self.layers, "self_attn")

    def forward(
        self, x: Tensor, attention_mask: Tensor | None = None, need_weights: bool = False,
        positions: Tensor | None = None,
    ) -> tuple[Tensor, list[Tensor]]:  # fmt: skip
        """x (B, S, d) embeddings, attention_mask (B, S) 1 for tokens -> (B, S, d), per-layer weights.
        ``positions`` (B, S) overrides the default 0..S-1."""
        mask = None if attention_mask is None else padding_mask(attention_mask)  # (B, 1, 1, S)
        x = self._prepare(x, positions=positions)
        terms = self._shared_terms(x.shape[1], x.shape[1], None)
        weights: list[Tensor] = []
        for layer in self.layers:
            x, w = layer(x, mask, need_weights=need_weights, terms=terms)
            if w is not None:
                weights.append(w)
        return self._finish(x), weights


class Decoder(_Stack):
    """A stack of decoder layers with a per-layer self-attention cache."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_decoder_layers))
        if config.relative_shared:
            share_relative(self.layers, "self_attn")

    def cross_kv(self, memory: Tensor) -> list[KeyValue]:
        """Each layer's cross-attention keys and values (B, H, S, D) for a source (B, S, d)."""
        return [layer.cross_attn.project_kv(memory) for layer in self.layers]

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        cross_kv: list[KeyValue] | None = None,
        memory_mask: Tensor | None = None,
        past: list[Cache] | None = None,
    ) -> tuple[Tensor, list[KeyValue]]:
        """x (B, T, d) target embeddings -> (B, T, d) and each layer's present (k, v) cache.

        Positions continue from the cache: the new tokens sit at past_len .. past_len + T - 1
        (a :class:`CacheSlots` cache: its ``position`` .. position + T - 1).
        """
        if memory is None and cross_kv is None:
            raise ValueError("the decoder needs the source: pass memory or cross_kv")
        t = x.shape[1]
        offset: Tensor | int = 0  # absolute position of the first new token
        s = t
        if past is not None:
            first = past[0]
            if isinstance(first, CacheSlots):
                offset = first.position
                s = first.key.shape[2]
                past = share_slot_index(past, x.shape[0], t)  # type: ignore[arg-type]
            else:
                offset = first[0].shape[2]
                s = offset + t
        x = self._prepare(x, offset)
        terms = self._shared_terms(t, s, offset)
        mask = None if memory_mask is None else padding_mask(memory_mask)  # (B, 1, 1, S)
        presents: list[KeyValue] = []
        for i, layer in enumerate(self.layers):
            x, present = layer(
                x,
                memory=memory,
                cross_kv=None if cross_kv is None else cross_kv[i],
                memory_mask=mask,
                past=None if past is None else past[i],
                terms=terms,
            )
            presents.append(present)
        return self._finish(x), presents


class TransformerModel(nn.Module):
    """What every family's model is: a config, token embeddings scaled by √d_model when the config
    asks, and the state-dict keys that alias one tensor."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        nn.init.normal_(self.embed.weight, std=config.d_model**-0.5 if config.scale_embedding else 0.02)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0

    def embed_tokens(self, ids: Tensor) -> Tensor:
        """(B, T) token ids -> (B, T, d_model)."""
        x = self.embed(ids)
        return x * self.embed_scale if self.embed_scale != 1.0 else x

    def tied_aliases(self) -> dict[str, str]:
        """State-dict keys that are the same tensor as another key: {alias: source}."""
        return relative_aliases(self.config, "encoder", self.config.n_encoder_layers)


def build_model(config: ModelConfig, seed: int | None = None) -> TransformerModel:
    """The model the config describes (its family's model class), in eval mode; ``seed`` makes its
    random weights repeatable."""
    from edgeattn.runtime.families import family_of, resolve

    model_class = resolve(family_of(config).model)
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        model: TransformerModel = model_class(config)
    return model.eval()
