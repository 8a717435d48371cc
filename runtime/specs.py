"""One small spec per exported graph: its file, inputs and outputs with dtypes and named axes.

The exporter names the ONNX inputs and dynamic axes from these specs, the manifest stores them,
the runtime checks its feeds against them, the verifier draws its test inputs from them, and the
tests read them. Which graphs a model has is its family's say (:mod:`edgeattn.runtime.families`).
Torch-free: it needs only the config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeattn.config import ModelConfig

#: Named dynamic axes used across every graph.
BATCH, SRC_LEN, TGT_LEN, PAST_LEN, TOTAL_LEN = "batch", "src_len", "tgt_len", "past_len", "total_len"
#: The slots of a fixed-capacity self-attention cache (the ``decoder_fixed`` graph), and the input
#: that says how many are filled.
CAPACITY, POSITION = "capacity", "position"

#: Sizes of the example inputs traced at export; verification uses other sizes on purpose.
EXPORT_SIZES = {"batch": 2, "src_len": 8, "tgt_len": 3, "past_len": 5, "capacity": 11, "picked": 4, "frames": 16}

#: The encoder input of models with token types (segments).
TOKEN_TYPE_IDS = "token_type_ids"

#: The decoder_fixed graph's cache inputs, and the outputs a runtime binds to the same buffers.
SLOT_CACHE, SLOT_UPDATED = "cache", "updated"

#: The causal_decoder graph's inputs besides ids, mask and cache: each new token's position, and
#: which new tokens' logits it returns (``picked`` of them per row).
POSITION_IDS, LOGITS_AT, PICKED = "position_ids", "logits_at", "picked"


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: name, element type, and axes (a name is dynamic, an int fixed)."""

    name: str
    dtype: str
    axes: tuple[str | int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.axes)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorSpec:
        return cls(data["name"], data["dtype"], tuple(data["shape"]))

    @property
    def dynamic(self) -> dict[int, str]:
        """{axis index: axis name} of the dynamic axes."""
        return {i: a for i, a in enumerate(self.axes) if isinstance(a, str)}


@dataclass(frozen=True)
class GraphSpec:
    """What one exported graph takes and returns."""

    name: str
    description: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        """torch.onnx-style {tensor name: {axis index: axis name}} for every input and output."""
        return {t.name: t.dynamic for t in (*self.inputs, *self.outputs) if t.dynamic}

    def with_cache_dtype(self, dtype: str) -> GraphSpec:
        """This spec with its in-place caches (``cache_*`` inputs, ``updated_*`` outputs) in ``dtype``."""

        def cast(tensors: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
            return tuple(TensorSpec(t.name, dtype, t.axes) if is_in_place_cache(t.name) else t for t in tensors)

        return GraphSpec(self.name, self.description, cast(self.inputs), cast(self.outputs))

    def to_dict(self) -> dict[str, Any]:
        return {
            "description": self.description,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }


def is_in_place_cache(name: str) -> bool:
    """Whether ``name`` is an in-place cache input (``cache_*``) or its updated output (``updated_*``)."""
    return name.startswith((SLOT_CACHE + "_", SLOT_UPDATED + "_"))


def cache_names(prefix: str, n_layers: int) -> list[str]:
    """``prefix_key_0, prefix_value_0, prefix_key_1, ...`` for per-layer key/value tensors."""
    return [f"{prefix}_{kind}_{i}" for i in range(n_layers) for kind in ("key", "value")]


def _kv(prefix: str, config: ModelConfig, length_axis: str) -> tuple[TensorSpec, ...]:
    shape = (BATCH, config.n_heads, length_axis, config.head_dim)
    return tuple(TensorSpec(n, "float32", shape) for n in cache_names(prefix, config.n_decoder_layers))


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


def encoder_feeds(
    input_names: list[str], ids: np.ndarray, mask: np.ndarray, token_type_ids: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """The encoder graph's feeds for checked (B, S) int64 arrays: token types (zeros unless given)
    only where the graph takes them."""
    feeds = {"input_ids": ids, "attention_mask": mask}
    if TOKEN_TYPE_IDS in input_names:
        feeds[TOKEN_TYPE_IDS] = np.zeros_like(ids) if token_type_ids is None else token_type_ids
    return feeds


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


def causal_decoder_spec(config: ModelConfig) -> GraphSpec:
    assert config.causal is not None, "a decoder-only config has its causal section"
    c = config.causal
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


def graph_spec(name: str, config: ModelConfig) -> GraphSpec:
    """The spec of graph ``name`` for this config (see :func:`edgeattn.runtime.families.graph_spec`)."""
    from edgeattn.runtime.families import graph_spec as spec_of

    return spec_of(name, config)


def __getattr__(name: str) -> Any:
    if name == "GRAPH_NAMES":  # every graph any family exports, from the family registry
        from edgeattn.runtime.families import all_graph_names

        return all_graph_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
