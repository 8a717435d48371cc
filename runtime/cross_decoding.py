"""Decoding states over an encoder-decoder's graphs (the seq2seq and speech families'): the source
(token ids, or a speech model's features) encoded and projected to cross-attention keys and values
once, then the decoder a token a row a step over a self-attention cache carried from step to step
(:class:`OnnxStepper`) or written in place (:class:`SlotStepper`). Torch-free: numpy and onnxruntime.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.exported_model import InputError
from edgeattn.runtime.slot_cache import LOGITS, SlotCache, cache_contract, ort_value
from edgeattn.runtime.specs import POSITION, SLOT_CACHE, cache_names

#: the graphs decoding runs besides the encoder (see the family records in edgeattn.runtime.families)
CROSS_KV, DECODER, DECODER_FIXED = "cross_kv", "decoder", "decoder_fixed"
#: the encoder's output, the cross projections' input, and the decoder's mask of the source's positions
ENCODER_OUTPUT, CROSS_INPUT, SOURCE_MASK = "last_hidden_state", "encoder_hidden_states", "encoder_attention_mask"


def cross_contract(encoder_graph: str, encoder_inputs: dict[str, str], n_layers: int) -> dict[str, Any]:
    """The graphs and feed names of an encoder-decoder's decoding, as a bundle carries them to the
    JS module (which types none of them): the encoder (its inputs by role), the cross projections,
    and the ``decoder_fixed`` graph with its cache written in place."""
    return {
        "encoder": {"graph": encoder_graph, "inputs": encoder_inputs, "output": ENCODER_OUTPUT},
        "cross": {"graph": CROSS_KV, "input": CROSS_INPUT},
        "decoder": {"graph": DECODER_FIXED, "ids": "input_ids", "mask": SOURCE_MASK, "position": POSITION,
                    "logits": LOGITS, "cache": cache_contract(n_layers)},
    }


def empty_cache(config: Any, rows: int) -> dict[str, np.ndarray]:
    """The ``decoder`` graph's self-attention cache of length 0 (its first step) for ``rows`` rows."""
    shape = (rows, config.n_heads, 0, config.head_dim)
    return {n: np.zeros(shape, np.float32) for n in cache_names("past", config.n_decoder_layers)}


class OnnxStepper:
    """Decoding state over the exported graphs: cross keys/values computed once (the runtime's
    ``source_state`` of the source: token ids and their mask, or a speech model's features), the
    self-attention cache carried from step to step. With IO binding the cache and cross
    keys/values stay on the session's device; only the new tokens and logits cross to the host.
    A step takes one token a row (B,) or several (B, T), and returns the last one's logits.
    ``source``, when given, is that state already computed (several decodings of one source)."""

    def __init__(
        self, model: Any, ids: np.ndarray, mask: np.ndarray | None, repeat: int, graph: str = DECODER,
        source: tuple[dict[str, np.ndarray], np.ndarray] | None = None,
    ) -> None:  # fmt: skip
        self.model = model
        self.session = model.sessions[graph]
        self.spec = model.specs[graph]
        cross, mask = model.source_state(ids, mask) if source is None else source
        if repeat > 1:
            mask = np.repeat(mask, repeat, axis=0)
            cross = {k: np.repeat(v, repeat, axis=0) for k, v in cross.items()}
        self.rows = mask.shape[0]
        self.fixed: dict[str, Any] = {SOURCE_MASK: mask, **cross}
        if self.bound:
            self.fixed = {k: self._to_device(v) for k, v in self.fixed.items()}
        self._start_cache()

    @property
    def bound(self) -> bool:
        """Whether the state lives in ``OrtValue``s run through IO binding."""
        return self.model.io_binding

    def _start_cache(self) -> None:
        past = empty_cache(self.model.config, self.rows)
        self.past: dict[str, Any] = {k: self._to_device(v) for k, v in past.items()} if self.bound else past

    def _to_device(self, array: np.ndarray) -> Any:
        return ort_value(array, self.model.device)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        ids = tokens.reshape(self.rows, -1).astype(np.int64)
        if not self.bound:
            feeds = {"input_ids": ids, **self.fixed, **self.past}
            outs = self.session.run(self.spec.output_names, feeds)
            res = dict(zip(self.spec.output_names, outs, strict=True))
            self.past = {p: res["present" + p[4:]] for p in self.past}
            return res[LOGITS][:, -1]
        binding = self.session.io_binding()
        binding.bind_ortvalue_input("input_ids", self._to_device(ids))
        for name, value in {**self.fixed, **self.past}.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_output(LOGITS, "cpu")
        for p in self.past:
            binding.bind_output("present" + p[4:], self.model.device, 0)
        self.session.run_with_iobinding(binding)
        outs = dict(zip(self.spec.output_names, binding.get_outputs(), strict=True))
        self.past = {p: outs["present" + p[4:]] for p in self.past}
        return outs[LOGITS].numpy()[:, -1]

    def reorder(self, index: np.ndarray) -> None:
        if np.array_equal(index, np.arange(self.rows)):
            return
        if not self.bound:
            self.past = {k: v[index] for k, v in self.past.items()}
            return
        # beam reordering gathers on the host; greedy and sampling never reorder
        self.past = {k: self._to_device(v.numpy()[index]) for k, v in self.past.items()}


class SlotStepper(OnnxStepper):
    """Decoding state over the ``decoder_fixed`` graph: each layer's cache is one buffer of
    ``capacity`` slots (a :class:`~edgeattn.runtime.slot_cache.SlotCache`), allocated once, that
    the graph's ScatterND writes each step's keys and values into. Always through IO binding; the
    cross keys/values and mask are bound once, not copied every step, on the CPU too."""

    def __init__(self, model: Any, ids: np.ndarray, mask: np.ndarray | None, repeat: int, capacity: int,
                 source: tuple[dict[str, np.ndarray], np.ndarray] | None = None) -> None:  # fmt: skip
        if capacity < 1:
            raise InputError(f"a cache needs at least one slot, got capacity={capacity}")
        self.capacity = capacity
        super().__init__(model, ids, mask, repeat, graph=DECODER_FIXED, source=source)
        self.position = 0
        self.binding = self.session.io_binding()
        for name, value in self.fixed.items():
            self.binding.bind_ortvalue_input(name, value)
        self.cache.bind(self.binding)
        self._width = 0

    bound = True

    @property
    def host(self) -> dict[str, np.ndarray]:
        """The caches as numpy arrays over the bound memory (on the CPU; empty on a device)."""
        return self.cache.host

    def _start_cache(self) -> None:
        c = self.model.config
        names = cache_names(SLOT_CACHE, c.n_decoder_layers)
        self.cache = SlotCache.zeros(names, (self.rows, c.n_heads, self.capacity, c.head_dim), np.float32,
                                     self.model.device)  # fmt: skip

    def step(self, tokens: np.ndarray) -> np.ndarray:
        ids = np.ascontiguousarray(tokens.reshape(self.rows, -1), dtype=np.int64)
        if self.position >= self.capacity:
            raise EdgeattnError(f"the decoder cache is full: all {self.capacity} slots hold earlier tokens")
        if self.position + ids.shape[1] > self.capacity:
            raise EdgeattnError(f"the decoder cache has {self.capacity - self.position} free slots of its "
                                f"{self.capacity}; {ids.shape[1]} new tokens do not fit")  # fmt: skip
        if self._width and ids.shape[1] != self._width:
            self.cache.bind(self.binding)  # the logits' shape changed
        self._width = ids.shape[1]
        self.binding.bind_cpu_input("input_ids", ids)
        self.binding.bind_cpu_input(POSITION, np.array([self.position], dtype=np.int64))
        self.session.run_with_iobinding(self.binding)
        self.position += ids.shape[1]
        # a copy: the bound output's memory is the session's to reuse at the next call
        return np.array(self.binding.get_outputs()[0].numpy()[:, -1])

    def rewind(self, position: int) -> None:
        """Make slot ``position`` the next one written (what later slots hold is masked until
        rewritten), for example to time the same step again."""
        if not 0 <= position < self.capacity:
            raise InputError(f"position {position} is outside the cache's {self.capacity} slots")
        self.position = position

    def reorder(self, index: np.ndarray) -> None:
        if not np.array_equal(index, np.arange(self.rows)):
            self.cache.reorder(index)
