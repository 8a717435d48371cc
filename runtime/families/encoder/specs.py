"""The encoder family's graphs: one attention block, and the token encoder (ids and mask in, hidden
states and a head's logits out). The seq2seq family's encoder is this one."""

from __future__ import annotations

from edgeattn.config import ModelConfig
from edgeattn.runtime.specs import BATCH, SRC_LEN, TGT_LEN, TOKEN_TYPE_IDS, GraphSpec, TensorSpec


def attention_spec(config: ModelConfig) -> GraphSpec:
    d = config.d_model
    return GraphSpec(
        "attention",
        "one multi-head attention block (the first encoder layer's); key length may differ from query length",
        (
            TensorSpec("query", "float32", (BATCH, TGT_LEN, d)),
            TensorSpec("key", "float32", (BATCH, SRC_LEN, d)),
            TensorSpec("value", "float32", (BATCH, SRC_LEN, d)),
            TensorSpec("key_padding_mask", "int64", (BATCH, SRC_LEN)),
        ),
        (TensorSpec("attention_output", "float32", (BATCH, TGT_LEN, d)),),
    )


def encoder_spec(config: ModelConfig) -> GraphSpec:
    outputs = [TensorSpec("last_hidden_state", "float32", (BATCH, SRC_LEN, config.d_model))]
    if config.head == "sequence":
        outputs.append(TensorSpec("logits", "float32", (BATCH, config.num_labels)))
    elif config.head == "token":
        outputs.append(TensorSpec("logits", "float32", (BATCH, SRC_LEN, config.num_labels)))
    inputs = [
        TensorSpec("input_ids", "int64", (BATCH, SRC_LEN)),
        TensorSpec("attention_mask", "int64", (BATCH, SRC_LEN)),
    ]
    if config.token_types:
        inputs.append(TensorSpec(TOKEN_TYPE_IDS, "int64", (BATCH, SRC_LEN)))
    return GraphSpec(
        "encoder",
        "token ids + attention mask"
        + (" + token types" if config.token_types else "")
        + " -> encoder hidden states"
        + (" and classification logits" if config.head != "none" else ""),
        tuple(inputs),
        tuple(outputs),
    )
