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
EXPORT_SIZES = {"batch": 2, "src_len": 8, "tgt_len": 3, "past_len": 5, "capacity": 11, "picked": 4, "frames": 16,
                "height": 64, "width": 96}

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


def encoder_feeds(
    input_names: list[str], ids: np.ndarray, mask: np.ndarray, token_type_ids: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """The encoder graph's feeds for checked (B, S) int64 arrays: token types (zeros unless given)
    only where the graph takes them."""
    feeds = {"input_ids": ids, "attention_mask": mask}
    if TOKEN_TYPE_IDS in input_names:
        feeds[TOKEN_TYPE_IDS] = np.zeros_like(ids) if token_type_ids is None else token_type_ids
    return feeds


def graph_spec(name: str, config: ModelConfig) -> GraphSpec:
    """The spec of graph ``name`` for this config (see :func:`edgeattn.runtime.families.graph_spec`)."""
    from edgeattn.runtime.families import graph_spec as spec_of

    return spec_of(name, config)


def __getattr__(name: str) -> Any:
    if name == "GRAPH_NAMES":  # every graph any family exports, from the family registry
        from edgeattn.runtime.families import all_graph_names

        return all_graph_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
