"""Scaled dot-product attention, masks, and multi-head attention with a key/value cache.

Mask convention: a boolean mask is True where a query may attend a key; a floating mask is
added to the scores (0 to keep, a large negative number or -inf to drop). Masks broadcast
against the scores, shaped (B, H, T, S). Every size is read from tensors at run time, so the
same code traces to graphs whose batch and sequence axes stay dynamic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgeattn.config import ModelConfig
from edgeattn.positional import RelativePosition, build_relative

KeyValue = tuple[Tensor, Tensor]


@dataclass(frozen=True)
class CacheSlots:
    """A self-attention cache of fixed capacity, written in place of a growing one.

    ``key`` and ``value`` (B, H, C, D) hold C slots, of which the first ``position`` (an int64
    tensor of one element) are filled; a call writes its T new keys and values into slots
    position .. position + T - 1 and attends over all C slots, those not yet written masked out.
    Exported, the write is one ``ScatterND`` whose data input is the cache input, so a runtime that
    binds the updated cache to the same buffer as the cache it fed updates it in place.
    """

    key: Tensor
    value: Tensor
    position: Tensor
    #: the write's (rows, heads, slots) indices when a stack made them once for all its layers
    index: tuple[Tensor, Tensor, Tensor] | None = None

    def write(self, k: Tensor, v: Tensor) -> KeyValue:
        """The caches with the new keys/values (B, H, T, D) written at position .. position + T - 1."""
        index = self.index if self.index is not None else slot_index(k.shape[0], k.shape[1], k.shape[2], self.position)
        return self.key.index_put(index, k), self.value.index_put(index, v)


def slot_index(
    batch: int | Tensor, heads: int | Tensor, t: int | Tensor, position: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Index tensors (rows (B, 1, 1), heads (1, H, 1), slots (1, 1, T)) of a write of T new keys
    at slots position .. position + T - 1 of every row and head."""
    device = position.device
    rows = torch.arange(batch, device=device)[:, None, None]
    head = torch.arange(heads, device=device)[None, :, None]
    slots = (position + torch.arange(t, device=device))[None, None, :]
    return rows, head, slots


def share_slot_index(caches: list[CacheSlots], batch: int | Tensor, t: int | Tensor) -> list[CacheSlots]:
    """The caches with one write index, made once, instead of one per layer (all share a position)."""
    first = caches[0]
    index = slot_index(batch, first.key.shape[1], t, first.position)
    return [replace(c, index=index) for c in caches]


Cache = KeyValue | CacheSlots


@dataclass(frozen=True)
class AttentionCall:
    """Everything one attention call has computed before its core, for a replacement kernel."""

    x: Tensor  # the block's input (B, T, d_model)
    q_in: Tensor  # projected queries (B, T, H * D)
    q: Tensor  # per-head queries (B, H, T, D)
    kv_in: tuple[Tensor, Tensor] | None  # this call's projected keys/values (B, S_new, H * D), if any
    k: Tensor  # every key the queries see (B, H, S, D): static, past + new, or every cache slot
    v: Tensor
    static_kv: KeyValue | None  # precomputed cross-attention keys/values
    past: Cache | None  # the self-attention cache before this call
    mask: Tensor | None  # key mask (B, 1, 1, S); the kernel adds ``causal`` to it
    bias: Tensor | None  # position term, broadcasting to (B, H, T, S)
    causal: Tensor | None  # causal self-attention's mask (T, S), unwritten slots masked too; else None


@dataclass(frozen=True)
class ScoreTerms:
    """What an attention block adds to its scores besides the key mask: a position term
    broadcasting to (B, H, T, S) and, for causal self-attention, the causal mask (T, S) (over a
    slot cache, the unwritten slots masked too). A stack makes them once for all its layers."""

    bias: Tensor | None
    causal: Tensor | None


AttentionKernel = Callable[["MultiHeadAttention", AttentionCall], tuple[Tensor, KeyValue]]


def padding_mask(attention_mask: Tensor) -> Tensor:
    """(B, S) with 1/True for real tokens -> boolean key mask (B, 1, 1, S)."""
    return attention_mask.bool()[:, None, None, :]


def causal_mask(
    q_len: int | Tensor, k_len: int | Tensor, device: torch.device | None = None, offset: Tensor | int | None = None
) -> Tensor:
    """Boolean (T, S) mask where query i, at absolute position offset + i (offset S - T unless
    given: the queries are the last keys), sees keys 0 .. offset + i."""
    k_pos = torch.arange(k_len, device=device)
    q_pos = torch.arange(q_len, device=device) + ((k_len - q_len) if offset is None else offset)
    return k_pos[None, :] <= q_pos[:, None]  # (T, S)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of boolean masks (broadcasting); None entries are ignored."""
    out: Tensor | None = None
    for mask in masks:
        if mask is None:
            continue
        out = mask if out is None else out & mask
    return out


def additive_mask(keep: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask as a bias to add to scores: 0 where kept, the dtype's lowest value elsewhere."""
    return torch.zeros_like(keep, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)


def _mask_parts(mask: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(additive bias, boolean 'row has at least one key') for a boolean or additive mask."""
    floor = torch.finfo(dtype).min
    if mask.dtype == torch.bool:
        keep = mask
        additive = additive_mask(keep, dtype)
    else:
        additive = mask.to(dtype).clamp(min=floor)
        keep = additive > floor / 2
    return additive, keep.any(dim=-1, keepdim=True)


def topk_keep(scores: Tensor, fraction: float, keep: Tensor | None) -> Tensor:
    """Boolean mask keeping the ceil(fraction * valid keys) largest scores of each query row."""
    floor = torch.finfo(scores.dtype).min
    valid = torch.ones_like(scores) if keep is None else keep.to(scores.dtype).expand_as(scores)
    k = torch.ceil(valid.sum(dim=-1, keepdim=True) * fraction).clamp(min=1)  # (B, H, T, 1)
    if keep is not None:
        scores = scores.masked_fill(~keep, floor)
    ranked = scores.sort(dim=-1, descending=True).values
    kth = ranked.gather(-1, k.long() - 1)
    return scores >= kth


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
    topk: float | None = None,
    dropout: nn.Module | None = None,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q Kᵀ · scale + bias + mask) V.

    q: (B, H, T, D), k and v: (B, H, S, D); ``bias`` (position terms) and ``mask`` broadcast to
    (B, H, T, S). ``scale`` defaults to 1/√D. A query row whose keys are all masked attends to
    nothing and returns zeros. ``topk`` keeps only that fraction of each row's largest scores.
    Returns the output (B, H, T, D) and, when asked, the weights (B, H, T, S).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, T, S)
    if bias is not None:
        scores = scores + bias
    row_valid: Tensor | None = None
    keep: Tensor | None = None
    if mask is not None:
        additive, row_valid = _mask_parts(mask, scores.dtype)
        scores = scores + additive
        keep = mask if mask.dtype == torch.bool else additive > torch.finfo(scores.dtype).min / 2
    if topk is not None:
        selected = topk_keep(scores, topk, keep)
        scores = scores.masked_fill(~selected, torch.finfo(scores.dtype).min)
    weights = F.softmax(scores, dim=-1)
    attended = weights if dropout is None else dropout(weights)
    out = torch.matmul(attended, v)  # (B, H, T, D)
    if row_valid is not None:  # (..., T, 1): zero the rows with no key on the output, D wide, not on the S-wide weights
        valid = row_valid.to(out.dtype)
        out = out * valid
        weights = weights * valid if need_weights else weights
    return out, (weights if need_weights else None)


class MultiHeadAttention(nn.Module):
    """Multi-head attention for self-attention (with a key/value cache) and cross-attention.

    Self-attention: ``forward(x, past=(k, v))`` appends the new tokens' keys and values to the
    cache and returns the whole (present) cache, so decoding one token at a time gives the same
    result as recomputing the prefix; ``past=CacheSlots(...)`` writes them into a cache of fixed
    capacity instead and returns the updated one. Cross-attention: ``forward(x, memory=m)`` or, with keys and
    values projected once per source by :meth:`project_kv`, ``forward(x, static_kv=(k, v))``.
    """

    def __init__(self, config: ModelConfig, *, cross: bool = False, causal: bool = False) -> None:
        super().__init__()
        d = config.d_model
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        inner = self.n_heads * self.head_dim  # d_model, unless the config sets d_kv
        self.cross = cross
        self.causal = causal
        self.scale = 1.0 / math.sqrt(self.head_dim) if config.attention_scaled else 1.0
        self.topk = config.attention_topk
        self.q_proj = nn.Linear(d, inner, bias=config.bias)
        self.k_proj = nn.Linear(d, inner, bias=config.bias)
        self.v_proj = nn.Linear(d, inner, bias=config.bias)
        self.out_proj = nn.Linear(inner, d, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.relative: RelativePosition | None = None if cross else build_relative(config, bidirectional=not causal)
        #: An optional replacement for the attention core (after the projections), for example a
        #: fused kernel an exporter substitutes: ``kernel(module, AttentionCall)`` returns the
        #: attended values (B, T, H * D) before ``out_proj`` and the present keys/values.
        self.kernel: AttentionKernel | None = None

    def score_terms(
        self, t: int | Tensor, s: int | Tensor, offset: Tensor | int | None, q: Tensor | None = None, bias: bool = True
    ) -> ScoreTerms:
        """The position bias and causal mask of T queries over S keys, the first query at absolute
        position ``offset`` (None: the queries are the last keys). ``q`` (B, H, T, D) is read only
        by a position term over the queries (Shaw's, never T5's); ``bias=False`` leaves the
        position term to each block."""
        causal = causal_mask(t, s, device=self.q_proj.weight.device, offset=offset) if self.causal else None
        return ScoreTerms(self._position_bias(q, t, s, offset) if bias else None, causal)

    def _position_bias(
        self, q: Tensor | None, t: int | Tensor, s: int | Tensor, offset: Tensor | int | None
    ) -> Tensor | None:
        if self.relative is None:
            return None
        device = self.q_proj.weight.device
        k_pos = torch.arange(s, device=device)
        q_pos = torch.arange(t, device=device) + ((s - t) if offset is None else offset)
        return self.relative(q, q_pos, k_pos) * (self.scale if self.relative.scaled else 1.0)

    def _split(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def _merge(self, out: Tensor) -> Tensor:
        """(B, H, T, D) attended values -> (B, T, H * D)."""
        out = out.transpose(1, 2)  # (B, T, H, D)
        # sizes read from the tensor reshaped itself: exported, ONNX Runtime folds the shape to a constant
        return out.reshape(out.shape[0], out.shape[1], self.n_heads * self.head_dim)

    def project_kv(self, memory: Tensor) -> KeyValue:
        """Keys and values (B, H, S, D) of a source sequence (B, S, d_model)."""
        return self._split(self.k_proj(memory)), self._split(self.v_proj(memory))

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        static_kv: KeyValue | None = None,
        past: Cache | None = None,
        mask: Tensor | None = None,
        terms: ScoreTerms | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, KeyValue]:
        """Attend from ``x`` (B, T, d_model).

        ``mask`` broadcasts to (B, H, T, S); for causal self-attention the causal part is added
        here. ``terms``: the position bias and causal mask as a stack made them once for every
        layer (:meth:`score_terms`); without them the block makes its own. Returns the output
        (B, T, d_model), the weights if asked, and the keys/values used (for self-attention, the
        present cache including ``past``).
        """
        q_in = self.q_proj(x)  # (B, T, H * D)
        q = self._split(q_in)  # (B, H, T, D)
        kv_in: tuple[Tensor, Tensor] | None = None  # this call's projected keys/values (B, S_new, H * D)
        if static_kv is not None:
            k, v = static_kv
        else:
            source = x if memory is None else memory
            kv_in = (self.k_proj(source), self.v_proj(source))
            k, v = self._split(kv_in[0]), self._split(kv_in[1])
            if isinstance(past, CacheSlots) and memory is None:
                k, v = past.write(k, v)  # (B, H, C, D)
            elif past is not None and memory is None:
                k = torch.cat([past[0], k], dim=2)  # (B, H, P + T, D)
                v = torch.cat([past[1], v], dim=2)
        t, s = q.shape[2], k.shape[2]
        # absolute position of the first query: after the filled slots, or the queries are the last keys
        offset = past.position if isinstance(past, CacheSlots) and static_kv is None and memory is None else None
        if terms is None:
            terms = self.score_terms(t, s, offset, q)
        elif terms.bias is None and self.relative is not None:
            terms = replace(terms, bias=self._position_bias(q, t, s, offset))
        if self.kernel is not None and not need_weights:
            call = AttentionCall(
                x, q_in, q, kv_in, k, v, static_kv, past if memory is None else None, mask, terms.bias, terms.causal
            )
            out, present = self.kernel(self, call)
            return self.out_proj(out), None, present
        bias = terms.bias
        if self.causal:
            mask = combine_masks(mask, terms.causal)
        out, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            scale=self.scale,
            topk=self.topk,
            dropout=self.dropout,
            need_weights=need_weights,
        )
        return self.out_proj(self._merge(out)), weights, (k, v)


def torch_sdpa_kernel(mha: MultiHeadAttention, call: AttentionCall) -> tuple[Tensor, KeyValue]:
    """A :attr:`MultiHeadAttention.kernel` running ``torch.nn.functional.scaled_dot_product_attention``
    (PyTorch's fused kernels), for eager speed comparisons. Unlike the default core it has no
    top-k, and a query row with every key masked gives NaN rather than zeros."""
    if mha.topk is not None:
        raise ValueError("the SDPA kernel has no top-k sparse attention")
    q, k, v = call.q, call.k, call.v
    keep = combine_masks(call.mask, call.causal)
    attn_mask: Tensor | None = keep
    if call.bias is not None:
        attn_mask = call.bias if keep is None else call.bias.masked_fill(~keep, float("-inf"))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=mha.dropout.p if mha.training else 0.0, scale=mha.scale
    )
    return mha._merge(out), (k, v)
