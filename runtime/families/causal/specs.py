"""The causal family's graph: a decoder-only language model's prompt or next tokens over a cache of
fixed capacity written in place."""

from __future__ import annotations

from edgeattn.config import ModelConfig
from edgeattn.runtime.specs import (
    BATCH,
    CAPACITY,
    LOGITS_AT,
    PICKED,
    POSITION,
    POSITION_IDS,
    SLOT_CACHE,
    SLOT_UPDATED,
    TGT_LEN,
    GraphSpec,
    TensorSpec,
    cache_names,
)


def causal_decoder_spec(config: ModelConfig) -> GraphSpec:
    assert config.section is not None, "a decoder-only config has its causal section"
    c = config.section
    shape = (BATCH, c.n_kv_heads, CAPACITY, c.dim)
    names = cache_names(SLOT_CACHE, c.n_layers), cache_names(SLOT_UPDATED, c.n_layers)
    return GraphSpec(
        "causal_decoder",
        "a decoder-only language model's prompt or next tokens over a cache of fixed capacity: the new "
        "tokens' keys and values written at slots position .. position + tgt_len - 1, attention_mask marking "
        "the slots that hold real tokens (the new ones included), position_ids each new token's position "
        "among its row's real tokens; logits of the new tokens logits_at picks (bind each updated_* output to "
        "its cache_* input's buffer and the cache is written in place)",
        (
            TensorSpec("input_ids", "int64", (BATCH, TGT_LEN)),
            TensorSpec("attention_mask", "int64", (BATCH, CAPACITY)),
            TensorSpec(POSITION_IDS, "int64", (BATCH, TGT_LEN)),
            TensorSpec(POSITION, "int64", (1,)),
            TensorSpec(LOGITS_AT, "int64", (BATCH, PICKED)),
            *(TensorSpec(n, "float32", shape) for n in names[0]),
        ),
        (
            TensorSpec("logits", "float32", (BATCH, PICKED, c.vocab_size)),
            *(TensorSpec(n, "float32", shape) for n in names[1]),
        ),
    )
