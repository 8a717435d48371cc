"""The seq2seq family's decoding graphs: the cross keys and values (once per source), the decoder step
over a growing cache, and the same step over a cache of fixed capacity written in place."""

from __future__ import annotations

from edgeattn.config import ModelConfig
from edgeattn.runtime.specs import (
    BATCH,
    CAPACITY,
    PAST_LEN,
    POSITION,
    SLOT_CACHE,
    SLOT_UPDATED,
    SRC_LEN,
    TGT_LEN,
    TOTAL_LEN,
    GraphSpec,
    TensorSpec,
    cache_names,
)


def _kv(prefix: str, config: ModelConfig, length_axis: str) -> tuple[TensorSpec, ...]:
    shape = (BATCH, config.n_heads, length_axis, config.head_dim)
    return tuple(TensorSpec(n, "float32", shape) for n in cache_names(prefix, config.n_decoder_layers))


def cross_kv_spec(config: ModelConfig) -> GraphSpec:
    return GraphSpec(
        "cross_kv",
        "encoder hidden states -> every decoder layer's cross-attention keys and values, once per source",
        (TensorSpec("encoder_hidden_states", "float32", (BATCH, SRC_LEN, config.d_model)),),
        _kv("cross", config, SRC_LEN),
    )


def decoder_spec(config: ModelConfig) -> GraphSpec:
    return GraphSpec(
        "decoder",
        "one decoder step with a self-attention cache: new target ids after past_len cached positions "
        "-> logits and the present cache (past_len 0 is the first step)",
        (
            TensorSpec("input_ids", "int64", (BATCH, TGT_LEN)),
            TensorSpec("encoder_attention_mask", "int64", (BATCH, SRC_LEN)),
            *_kv("past", config, PAST_LEN),
            *_kv("cross", config, SRC_LEN),
        ),
        (
            TensorSpec("logits", "float32", (BATCH, TGT_LEN, config.vocab_size)),
            *_kv("present", config, TOTAL_LEN),
        ),
    )


def decoder_fixed_spec(config: ModelConfig) -> GraphSpec:
    return GraphSpec(
        "decoder_fixed",
        "one decoder step over a self-attention cache of fixed capacity: new target ids written at "
        "slots position .. position + tgt_len - 1 -> logits and the updated cache (bind each updated_* "
        "output to its cache_* input's buffer and the cache is written in place)",
        (
            TensorSpec("input_ids", "int64", (BATCH, TGT_LEN)),
            TensorSpec("encoder_attention_mask", "int64", (BATCH, SRC_LEN)),
            TensorSpec(POSITION, "int64", (1,)),
            *_kv(SLOT_CACHE, config, CAPACITY),
            *_kv("cross", config, SRC_LEN),
        ),
        (
            TensorSpec("logits", "float32", (BATCH, TGT_LEN, config.vocab_size)),
            *_kv(SLOT_UPDATED, config, CAPACITY),
        ),
    )
