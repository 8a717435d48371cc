"""Decoder-only language models (GPT-2, the Llama family, Qwen2 / Qwen3 / Qwen3-MoE, Phi-3, Gemma 2 / 3,
Mistral, SmolLM3) in one readable file.

One frozen config, :class:`CausalLMConfig` (the decoder-only family's own section of knobs, not
new flat fields of ``ModelConfig``), drives one module, :class:`CausalLM`: token embeddings (and
learned positions for GPT-2), pre-norm blocks of self-attention and a feed-forward, a final norm,
and a language-model head (tied to the embedding or its own). Attention is grouped-query
(``n_kv_heads`` key/value heads shared by ``n_heads // n_kv_heads`` query heads each), with rotary
positions in either layout (``rotate-half`` as Llama writes it, ``interleaved`` pairs), Llama 3's
frequency scaling, and Qwen3's RMS norm of queries and keys per head. Rows of a batch may be
padded on either side: positions count each row's real tokens, so a row's logits equal its
logits alone.

The key/value cache and the exported graphs come with the family's registration
(``edgeattn.runtime.families``); this module is the eager model they are checked against.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgeattn.attention import CacheSlots, KeyValue
from edgeattn.config import ModelConfig
from edgeattn.errors import ConfigError
from edgeattn.families.causal.config import CausalLMConfig, RopeLayout
from edgeattn.model import TransformerModel
from edgeattn.rope import rope_frequencies

__all__ = ["CausalLM", "CausalLMConfig", "RopeLayout"]

#: what one layer takes beside its input: the additive attention mask and the rotation's (cos, sin)
LayerInput = tuple[Tensor, tuple[Tensor, Tensor] | None]

class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _norm(config: CausalLMConfig, dim: int) -> nn.Module:
    return RMSNorm(dim, config.norm_eps) if config.norm == "rmsnorm" else nn.LayerNorm(dim, eps=config.norm_eps)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: RopeLayout) -> Tensor:
    """Rotary positions on the first ``2 * cos.shape[-1]`` dimensions of ``x`` (B, H, T, D); cos and
    sin are (B, 1, T, D_rot / 2)."""
    rot = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    if layout == "rotate-half":
        a, b = x_rot[..., : rot // 2], x_rot[..., rot // 2 :]
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    else:
        a, b = x_rot[..., 0::2], x_rot[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    return torch.cat([out, x_pass], dim=-1)


class CausalSelfAttention(nn.Module):
    """Grouped-query causal self-attention with rotary positions."""

    def __init__(self, config: CausalLMConfig) -> None:
        super().__init__()
        c, d = config, config.dim
        self.config = config
        self.q_proj = nn.Linear(c.d_model, c.n_heads * d, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.d_model, c.n_kv_heads * d, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.d_model, c.n_kv_heads * d, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.n_heads * d, c.d_model, bias=c.out_bias)
        if c.qk_norm:
            self.q_norm, self.k_norm = RMSNorm(d, c.norm_eps), RMSNorm(d, c.norm_eps)

    def forward(self, x: Tensor, mask: Tensor, rope: tuple[Tensor, Tensor] | None,
                cache: CacheSlots | None = None) -> tuple[Tensor, KeyValue]:  # fmt: skip
        """(B, T, d_model) -> the output and the keys and values attended over: the T new ones, or
        with ``cache`` every slot, the new ones written at the cache's position."""
        c = self.config
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, c.n_heads, c.dim).transpose(1, 2)  # (B, H, T, D)
        k = self.k_proj(x).view(b, t, c.n_kv_heads, c.dim).transpose(1, 2)  # (B, KV, T, D)
        v = self.v_proj(x).view(b, t, c.n_kv_heads, c.dim).transpose(1, 2)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rotate(q, *rope, c.rope_layout), rotate(k, *rope, c.rope_layout)
        kept = (k, v) if cache is None else cache.write(k, v)  # (B, KV, S, D): S = T, or the C slots
        group = c.n_heads // c.n_kv_heads
        # each key/value head's query heads side by side (B, KV, group * T, D): no copy of the cache per group
        q = q.reshape(b, c.n_kv_heads, group * t, c.dim)
        scores = q @ kept[0].transpose(-1, -2)  # (B, KV, group * T, S)
        scores = scores * c.attn_scale if c.attn_scale else scores / math.sqrt(c.dim)
        if c.attn_softcap:
            scores = torch.tanh(scores / c.attn_softcap) * c.attn_softcap
        scores = scores.view(b, c.n_kv_heads, group, t, -1) + mask[:, :, None]  # mask (B, 1, T, S)
        weights = torch.softmax(scores, dim=-1).view(b, c.n_kv_heads, group * t, -1)
        out = (weights @ kept[1]).view(b, c.n_heads, t, c.dim)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, c.n_heads * c.dim)), kept


class FeedForward(nn.Module):
    """act(gate(x)) * up(x) -> down when gated (SwiGLU), else act(up(x)) -> down (GPT-2)."""

    def __init__(self, config: CausalLMConfig) -> None:
        super().__init__()
        c = config
        if c.gated:
            self.gate_proj = nn.Linear(c.d_model, c.d_ff, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.d_model, c.d_ff, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.d_ff, c.d_model, bias=c.mlp_bias)
        self.gated = c.gated
        self.act = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[c.activation]

    def forward(self, x: Tensor) -> Tensor:
        up = self.up_proj(x)
        return self.down_proj(self.act(self.gate_proj(x)) * up if self.gated else self.act(up))


class Experts(nn.Module):
    """A mixture of gated feed-forwards (Qwen3-MoE's sparse block): the router's softmax over
    ``n_experts``, each token sent to its top ``experts_per_token`` (their weights normalised to sum
    to 1 with ``norm_topk``), the experts' outputs summed by those weights. The experts' weights
    are stacked: ``gate_proj`` and ``up_proj`` (E, expert_d_ff, d_model), ``down_proj`` (E, d_model,
    expert_d_ff)."""

    def __init__(self, config: CausalLMConfig) -> None:
        super().__init__()
        c = config
        self.router = nn.Linear(c.d_model, c.n_experts, bias=False)
        self.gate_proj = nn.Parameter(torch.empty(c.n_experts, c.expert_d_ff, c.d_model))
        self.up_proj = nn.Parameter(torch.empty(c.n_experts, c.expert_d_ff, c.d_model))
        self.down_proj = nn.Parameter(torch.empty(c.n_experts, c.d_model, c.expert_d_ff))
        for weight in (self.gate_proj, self.up_proj, self.down_proj):
            nn.init.normal_(weight, std=0.02)
        self.top, self.normalize = c.experts_per_token, c.norm_topk
        self.act = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[c.activation]

    def routing(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(weights, experts) (N, experts_per_token) of tokens ``x`` (N, d_model)."""
        probs = torch.softmax(self.router(x), dim=-1, dtype=torch.float32)
        weights, chosen = probs.topk(self.top, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), chosen

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.routing(flat)
        out = torch.zeros_like(flat)
        for e in chosen.unique().tolist():
            rows, rank = (chosen == e).nonzero(as_tuple=True)
            h = flat[rows]
            y = F.linear(self.act(F.linear(h, self.gate_proj[e])) * F.linear(h, self.up_proj[e]), self.down_proj[e])
            out.index_add_(0, rows, y * weights[rows, rank, None])
        return out.view_as(x)


class Block(nn.Module):
    """x + attn(norm(x)), then x + ff(norm(x)); with ``sandwich_norm`` each branch normed again
    before it is added (Gemma's post-attention and post-feed-forward norms). The feed-forward is
    a mixture of experts where the config says so for ``layer``."""

    def __init__(self, config: CausalLMConfig, layer: int = 0) -> None:
        super().__init__()
        self.norm1, self.attn = _norm(config, config.d_model), CausalSelfAttention(config)
        self.norm2 = _norm(config, config.d_model)
        self.ff = Experts(config) if config.experts(layer) else FeedForward(config)
        if config.sandwich_norm:
            self.attn_out_norm, self.ff_out_norm = _norm(config, config.d_model), _norm(config, config.d_model)
        self.sandwich = config.sandwich_norm

    def forward(self, x: Tensor, mask: Tensor, rope: tuple[Tensor, Tensor] | None,
                cache: CacheSlots | None = None) -> tuple[Tensor, KeyValue]:  # fmt: skip
        attended, kept = self.attn(self.norm1(x), mask, rope, cache)
        x = x + (self.attn_out_norm(attended) if self.sandwich else attended)
        fed = self.ff(self.norm2(x))
        return x + (self.ff_out_norm(fed) if self.sandwich else fed), kept


def positions_of(attention_mask: Tensor) -> Tensor:
    """Each token's position among its row's real tokens (padding on either side): (B, T) int64."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class CausalLM(TransformerModel):
    """input_ids (B, T), attention_mask (B, T) -> next-token logits (B, T, vocab)."""

    def __init__(self, config: ModelConfig | CausalLMConfig) -> None:
        if isinstance(config, CausalLMConfig):
            config = config.model_config()
        if config.section is None:
            raise ConfigError(f"a CausalLM needs a decoder-only config, got architecture={config.architecture!r}")
        super().__init__(config)
        c = self.lm = config.section
        if c.position == "learned":
            self.pos_embed = nn.Embedding(c.max_len, c.d_model)
        else:
            inv_freq, self.rope_factor = rope_frequencies(c)  # rope_factor: YaRN's and LongRoPE's cos/sin scale
            self.register_buffer("inv_freq", inv_freq, persistent=False)
            if c.local_rope_theta:  # the sliding layers' own rotation (Gemma 3)
                self.register_buffer("inv_freq_local", rope_frequencies(c.local_rope())[0], persistent=False)
        self.layers = nn.ModuleList(Block(c, i) for i in range(c.n_layers))
        self.norm = _norm(c, c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def tied_aliases(self) -> dict[str, str]:
        """State-dict keys that are the same tensor as another key: {alias: source}."""
        return {"lm_head.weight": "embed.weight"} if self.lm.tie_embeddings else {}

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                cache: list[CacheSlots] | None = None, logits_at: Tensor | None = None,
                ) -> Tensor | tuple[Tensor, list[KeyValue]]:  # fmt: skip
        """Next-token logits (B, T, vocab) of ``input_ids`` (B, T).

        Without ``cache``, ``attention_mask`` (B, T) marks the real tokens. With ``cache`` (a
        :class:`~edgeattn.attention.CacheSlots` per layer, (B, KV, C, D) slots, the new tokens
        written at its position), ``attention_mask`` (B, C) marks the slots that hold real tokens,
        the new ones included, and the updated caches are returned too. ``position_ids`` default to
        each row's count of real tokens before each one (the mask's running sum without a cache).
        ``logits_at`` (B, N) picks the new tokens whose logits are computed (default: all T): a
        prompt's last one, say, instead of the whole vocabulary at every prompt position.
        """
        x, per_layer = self.layer_inputs(input_ids, attention_mask, position_ids, cache)
        kept = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, *per_layer[i], None if cache is None else cache[i])
            kept.append(kv)
        if logits_at is not None:  # (B, N, d_model): the picked tokens alone reach the head
            x = x.gather(1, logits_at[:, :, None].expand(-1, -1, x.shape[-1]))
        logits = self.lm_head(self.norm(x))
        if self.lm.logit_softcap:
            logits = torch.tanh(logits / self.lm.logit_softcap) * self.lm.logit_softcap
        return logits if cache is None else (logits, kept)

    def layer_inputs(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                     cache: list[CacheSlots] | None = None) -> tuple[Tensor, list[LayerInput]]:
        """What the layers take (arguments as :meth:`forward`'s): the embedded tokens (B, T, d_model)
        and each layer's additive attention mask (B, 1, T, S) and rotation's (cos, sin) (None for
        learned positions, added to the embeddings, and for NoPE layers). A sliding layer's mask
        also hides the slots more than its window back, counted in real tokens by the mask (the
        running sum of the mask up to each slot: a real token's position)."""
        b, t = input_ids.shape
        c = self.lm
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            if cache is not None:
                raise ConfigError("a call with a cache needs position_ids")
            position_ids = positions_of(attention_mask)
        x = self.embed(input_ids)  # (B, T, d_model)
        if c.embed_scale != 1.0:
            x = x * torch.tensor(c.embed_scale, dtype=x.dtype)
        ropes: dict[str | None, tuple[Tensor, Tensor] | None] = {None: None}
        if c.position == "learned":
            x = x + self.pos_embed(position_ids)
        else:
            for kind, inv_freq, factor in (("global", self.inv_freq, self.rope_factor),
                                           ("local", getattr(self, "inv_freq_local", None), 1.0)):  # fmt: skip
                if inv_freq is not None:
                    angles = position_ids[:, None, :, None].float() * inv_freq  # (B, 1, T, D_rot / 2)
                    ropes[kind] = angles.cos() * factor, angles.sin() * factor
        start = cache[0].position if cache is not None else 0
        slots = attention_mask.shape[1]
        query_at = (start + torch.arange(t, device=x.device))[:, None]  # the slot each new token is written to
        causal = torch.arange(slots, device=x.device)[None, :] <= query_at  # (T, S)
        allowed = causal[None] & attention_mask.bool()[:, None, :]  # (B, T, S)
        low = torch.finfo(x.dtype).min
        masks = {0: torch.zeros(b, 1, t, slots, dtype=x.dtype).masked_fill(~allowed[:, None], low)}
        for window in {c.window(i) for i in range(c.n_layers)} - {0}:
            slot_positions = attention_mask.long().cumsum(-1) - 1  # (B, S): each slot's real-token position
            query_positions = slot_positions[:, query_at[:, 0]]  # (B, T): the new tokens' own count
            near = query_positions[:, :, None] - slot_positions[:, None, :] < window  # (B, T, S)
            masks[window] = torch.zeros(b, 1, t, slots, dtype=x.dtype).masked_fill(~(allowed & near)[:, None], low)
        return x, [(masks[c.window(i)], ropes[c.rope_of(i)]) for i in range(c.n_layers)]

    def empty_cache(self, batch: int, capacity: int) -> list[CacheSlots]:
        """Every layer's cache of ``capacity`` zeroed slots, to be written from slot 0."""
        c = self.lm
        shape = (batch, c.n_kv_heads, capacity, c.dim)
        position = torch.zeros(1, dtype=torch.int64)
        return [CacheSlots(torch.zeros(shape), torch.zeros(shape), position) for _ in range(c.n_layers)]

    @torch.no_grad()
    def greedy(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int, stop_at_eos: bool = True,
               prompt_logits: Callable[[int, np.ndarray], None] | None = None, prompt_columns: int = 0,
               ) -> Tensor:  # fmt: skip
        """Greedy continuations (B, max_new_tokens) of prompts padded on either side: the prompt in
        one call, then a token a step, over one cache of prompt + max_new_tokens slots; with
        ``stop_at_eos``, ``pad_id`` after each row's first EOS.

        With ``prompt_logits(column, logits)``, the prompt is read ``prompt_columns`` columns a
        call (0: whole) and each call's logits after every one of its tokens, (B, columns, vocab)
        from ``column`` on, are given to it: teacher forcing in the same pass (``max_new_tokens``
        may then be 0)."""
        b, s = input_ids.shape
        cache = self.empty_cache(b, s + max_new_tokens)
        slots = torch.cat([attention_mask.long(), torch.zeros(b, max_new_tokens, dtype=torch.int64)], dim=1)
        positions = positions_of(attention_mask)
        last = (attention_mask.long() * torch.arange(s)).argmax(-1)  # each row's last real token
        if prompt_logits is None:  # prefill: slots 0 .. s - 1, the logits of each row's last real token alone
            logits, kept = self(input_ids, slots, positions, cache, logits_at=last[:, None])
            step_logits = logits[:, 0]  # (B, vocab)
        else:
            step_logits = torch.zeros(b, self.lm.vocab_size)
            width = prompt_columns or s
            for start in range(0, s, width):
                end = min(s, start + width)
                logits, kept = self(input_ids[:, start:end], slots, positions[:, start:end], cache)
                prompt_logits(start, logits.numpy())
                here = (last >= start) & (last < end)  # rows whose last real token is in this call
                step_logits[here] = logits[here, last[here] - start]
                cache = [CacheSlots(k, v, torch.tensor([end])) for k, v in kept]
        if max_new_tokens == 0:
            return torch.zeros(b, 0, dtype=torch.int64)
        nxt = positions.max(dim=1, keepdim=True).values
        out = []
        for step in range(max_new_tokens):
            token = step_logits.argmax(-1, keepdim=True)  # (B, 1)
            out.append(token)
            if step == max_new_tokens - 1:
                break
            nxt = nxt + 1
            slots[:, s + step] = 1
            cache = [CacheSlots(k, v, torch.tensor([s + step])) for k, v in kept]
            logits, kept = self(token, slots, nxt, cache)
            step_logits = logits[:, -1]
        tokens = torch.cat(out, dim=1)
        if stop_at_eos:
            ended = (tokens == self.config.eos_id).long().cumsum(1) - (tokens == self.config.eos_id).long()
            tokens = tokens.masked_fill(ended > 0, self.config.pad_id)
        return tokens
