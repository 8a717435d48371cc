"""An export directory loaded into ONNX Runtime sessions, with encode and greedy decoding.

Reads only what the export wrote (manifest and ONNX files); needs numpy and onnxruntime alone.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.manifest import check_file, manifest_config, read_manifest
from edgeattn.runtime.session import CPU, create_session
from edgeattn.runtime.specs import GraphSpec, TensorSpec, cache_names, graph_spec

log = logging.getLogger(__name__)


class InputError(EdgeattnError, ValueError):
    """A graph input of the wrong name, dtype, rank or size."""


def check_feeds(spec: GraphSpec, feeds: dict[str, np.ndarray]) -> None:
    """Refuse feeds that do not match the graph's spec, naming the input and the expected shape.

    Checks presence, dtype, rank, fixed sizes, and that every named axis (batch, src_len, ...)
    has one size across the inputs.
    """
    missing = [t.name for t in spec.inputs if t.name not in feeds]
    if missing:
        raise InputError(f"graph {spec.name!r} needs input(s) {', '.join(missing)}")
    unknown = sorted(set(feeds) - set(spec.input_names))
    if unknown:
        raise InputError(f"graph {spec.name!r} has no input(s) {', '.join(unknown)}")
    sizes: dict[str, tuple[int, str]] = {}
    for t in spec.inputs:
        value = feeds[t.name]
        expected = _shape_text(t)
        if not isinstance(value, np.ndarray):
            raise InputError(f"input {t.name!r} must be a numpy array {expected}, got {type(value).__name__}")
        if value.dtype != np.dtype(t.dtype):
            raise InputError(f"input {t.name!r} must have dtype {t.dtype}, got {value.dtype}")
        if value.ndim != len(t.axes):
            raise InputError(f"input {t.name!r} must have shape {expected}, got rank {value.ndim} {value.shape}")
        for axis, size in zip(t.axes, value.shape, strict=True):
            if isinstance(axis, int):
                if size != axis:
                    raise InputError(f"input {t.name!r} must have shape {expected}, got {value.shape}")
            elif axis in sizes and sizes[axis][0] != size:
                raise InputError(
                    f"input {t.name!r} has {axis}={size} but {sizes[axis][1]!r} has {axis}={sizes[axis][0]} "
                    f"(expected {expected})"
                )
            else:
                sizes.setdefault(axis, (size, t.name))


def _shape_text(t: TensorSpec) -> str:
    return "(" + ", ".join(str(a) for a in t.axes) + ")"


class ExportedModel:
    """The graphs of one export directory, checked against their manifest sha256, as sessions."""

    def __init__(
        self,
        export_dir: str | Path,
        providers: list[str] | tuple[str, ...] | None = (CPU,),
        threads: int | None = None,
        spinning: bool = True,
    ) -> None:
        self.export_dir = Path(export_dir)
        self.manifest = read_manifest(self.export_dir)
        self.config = manifest_config(self.manifest)
        self.specs: dict[str, GraphSpec] = {}
        self.sessions: dict[str, Any] = {}
        self._lock = threading.Lock()
        for name, entry in self.manifest["graphs"].items():
            path = check_file(self.export_dir, entry)
            self.specs[name] = graph_spec(name, self.config)
            self.sessions[name] = create_session(path, providers=providers, threads=threads, spinning=spinning)

    @property
    def graphs(self) -> list[str]:
        return list(self.sessions)

    def run(self, graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one graph after checking its feeds; returns outputs by name."""
        if graph not in self.sessions:
            raise EdgeattnError(f"this export has no {graph!r} graph (it has {', '.join(self.sessions)})")
        spec = self.specs[graph]
        check_feeds(spec, feeds)
        outputs = self.sessions[graph].run(spec.output_names, feeds)
        return dict(zip(spec.output_names, outputs, strict=True))

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Encoder outputs (``last_hidden_state`` (B, S, D), and ``logits`` with a head)."""
        if attention_mask is None:
            attention_mask = np.ones_like(input_ids, dtype=np.int64)
        return self.run("encoder", {"input_ids": input_ids, "attention_mask": attention_mask})

    def cross_kv(self, hidden: np.ndarray) -> dict[str, np.ndarray]:
        """Every decoder layer's cross-attention keys and values for one source."""
        return self.run("cross_kv", {"encoder_hidden_states": hidden})

    def empty_cache(self, batch: int) -> dict[str, np.ndarray]:
        """A self-attention cache of length 0 for the first decoder step."""
        c = self.config
        shape = (batch, c.n_heads, 0, c.head_dim)
        return {n: np.zeros(shape, np.float32) for n in cache_names("past", c.n_decoder_layers)}

    def greedy(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray | None = None,
        max_new_tokens: int = 20,
        stop_at_eos: bool = True,
    ) -> np.ndarray:
        """Greedy decoding with the cache: (B, S) source ids -> (B, N) tokens, pad after each EOS
        (with ``stop_at_eos=False``, every row runs all ``max_new_tokens`` steps).

        The encoder and the cross-attention projections run once; each step feeds one token.
        """
        c = self.config
        if attention_mask is None:
            attention_mask = np.ones_like(input_ids, dtype=np.int64)
        hidden = self.encode(input_ids, attention_mask)["last_hidden_state"]
        cross = self.cross_kv(hidden)
        b = input_ids.shape[0]
        past = self.empty_cache(b)
        token = np.full((b, 1), c.bos_id, dtype=np.int64)
        done = np.zeros(b, dtype=bool)
        out = []
        for _ in range(max_new_tokens):
            res = self.run("decoder", {"input_ids": token, "encoder_attention_mask": attention_mask, **past, **cross})
            nxt = res["logits"][:, -1].argmax(-1).astype(np.int64)
            if stop_at_eos:
                nxt = np.where(done, c.pad_id, nxt)
                done |= nxt == c.eos_id
            out.append(nxt)
            token = nxt[:, None]
            past = {p: res[p.replace("past", "present", 1)] for p in past}
            if done.all():
                break
        return np.stack(out, axis=1)
