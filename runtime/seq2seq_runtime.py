"""The encoder-decoder family's runtime: generation (greedy, beam, sampling), streaming, and their
text forms, over the exported encoder, cross_kv and decoder graphs.

Every call keeps its own decoding state (:class:`OnnxStepper`, or :class:`SlotStepper` over the
``decoder_fixed`` graph's cache written in place), so one model serves several threads.
Torch-free: numpy and onnxruntime (and ``tokenizers`` for text).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.encoder_runtime import ENCODER, SourceEncoding
from edgeattn.runtime.generate import GenerationOutput, generate, stream_positions
from edgeattn.runtime.layout import TOKENIZER
from edgeattn.runtime.model import InputError, batch_texts
from edgeattn.runtime.specs import POSITION, SLOT_CACHE, SLOT_UPDATED, cache_names
from edgeattn.runtime.tokenizer import TextTokenizer, TokenizerError

#: the graphs generation runs besides the encoder (see the family record in edgeattn.runtime.families)
CROSS_KV, DECODER, DECODER_FIXED = "cross_kv", "decoder", "decoder_fixed"



class Seq2SeqRuntime(SourceEncoding):
    """An encoder-decoder export (T5 family, edgeattn's own): generate and stream tokens or text."""

    def _attached(self) -> None:
        self._cache_slots = True

    # ------------------------------------------------------------- generation
    def empty_cache(self, rows: int) -> dict[str, np.ndarray]:
        """A self-attention cache of length 0 (the first decoder step) for ``rows`` rows."""
        return empty_cache(self.config, rows)

    def _decoding(
        self, input_ids: Any, attention_mask: Any, max_new_tokens: int, strategy: str, eos_id: int | None,
        options: dict[str, Any],
    ) -> dict[str, Any]:  # fmt: skip
        """Checked settings and inputs as the keyword arguments of the search functions."""
        if not self.family.generates_with(self.sessions):
            raise EdgeattnError(
                "generation needs the encoder, cross_kv and decoder graphs; export with --graphs decoder"
            )
        cfg = self.generation_config(max_new_tokens, strategy, options)
        if max_new_tokens > self.config.max_len:
            raise InputError(f"max_new_tokens={max_new_tokens} exceeds the model's max_len {self.config.max_len}")
        ids, mask = self.check_source(input_ids, attention_mask)
        c = self.config
        return {
            "make": lambda n: self.stepper(ids, mask, n, capacity=cfg.max_new_tokens),
            "batch": ids.shape[0],
            "bos_id": c.bos_id,
            "eos_id": c.eos_id if eos_id is None else eos_id,
            "pad_id": c.pad_id,
            "cfg": cfg,
        }

    @property
    def cache_slots(self) -> bool:
        """Whether generation runs the ``decoder_fixed`` graph (a cache of fixed capacity written in
        place) rather than ``decoder`` (a cache grown by concatenation every step): where the export
        has it, unless set False."""
        return self._cache_slots and DECODER_FIXED in self.sessions

    @cache_slots.setter
    def cache_slots(self, value: bool) -> None:
        self._cache_slots = bool(value)

    def source_state(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[dict[str, np.ndarray],
                                                                                       np.ndarray]:  # fmt: skip
        """A checked source's cross-attention keys and values (the encoder and cross_kv graphs, once)
        and the mask of its positions the decoder attends to."""
        hidden = self.run(ENCODER, {"input_ids": input_ids, "attention_mask": attention_mask})["last_hidden_state"]
        return self.run(CROSS_KV, {"encoder_hidden_states": hidden}), attention_mask

    def stepper(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, repeat: int = 1, capacity: int | None = None
    ) -> OnnxStepper:
        """A decoding state for checked inputs: the encoder and cross projections run here, once.
        With a ``capacity`` (the most steps it will take) and :attr:`cache_slots`, its cache has
        that many slots, allocated here and written in place."""
        if capacity is not None and self.cache_slots:
            return SlotStepper(self, input_ids, attention_mask, repeat, capacity)
        return OnnxStepper(self, input_ids, attention_mask, repeat)

    def generate(
        self,
        input_ids: Any,
        attention_mask: Any = None,
        max_new_tokens: int = 32,
        strategy: str = "greedy",
        eos_id: int | None = None,
        **options: Any,
    ) -> GenerationOutput:
        """Generate for a batch of sources of different lengths (padding marked by the mask).

        ``strategy``: ``greedy``, ``beam`` (``num_beams``, ``length_penalty``) or ``sample``
        (``temperature``, ``top_k``, ``top_p``, ``seed``). Each row stops at ``eos_id``
        (default: the model's). Returns tokens (B, N) padded with ``pad_id`` and per-row scores.
        """
        return generate(**self._decoding(input_ids, attention_mask, max_new_tokens, strategy, eos_id, options))

    def stream(
        self,
        input_ids: Any,
        attention_mask: Any = None,
        max_new_tokens: int = 32,
        strategy: str = "greedy",
        eos_id: int | None = None,
        **options: Any,
    ) -> Iterator[np.ndarray]:
        """Generation that yields its tokens (B,) position by position as they are settled: greedy and
        sampling every step; beam search once every beam that could still win agrees on them (the
        positions joined are :meth:`generate`'s tokens)."""
        yield from stream_positions(
            **self._decoding(input_ids, attention_mask, max_new_tokens, strategy, eos_id, options)
        )

    def greedy(
        self, input_ids: Any, attention_mask: Any = None, max_new_tokens: int = 20, stop_at_eos: bool = True
    ) -> np.ndarray:
        """Greedy tokens (B, N); with ``stop_at_eos=False`` every row runs all steps."""
        out = self.generate(input_ids, attention_mask, max_new_tokens, eos_id=None if stop_at_eos else -1)
        return out.tokens

    # ------------------------------------------------------------------- text
    def generate_text(
        self, texts: Any, max_new_tokens: int | None = None, *, truncate: bool = False, **options: Any
    ) -> list[str]:
        """Tokenize ``texts`` (one string or a list), generate, and decode the answers (needs the
        export's tokenizer). ``max_new_tokens`` defaults to twice the longest input plus 8; a text
        longer than the model takes is an error unless ``truncate``."""
        return [answer for answer, _ in self.generate_answers(texts, max_new_tokens, truncate=truncate, **options)]

    def generate_answers(
        self, texts: Any, max_new_tokens: int | None = None, *, truncate: bool = False, **options: Any
    ) -> list[tuple[str, np.ndarray]]:
        """As :meth:`generate_text`, with each answer's tokens (up to, not including, EOS)."""
        ids, mask = self._text_source(texts, truncate)
        steps = max_new_tokens or self._default_steps(ids.shape[1])
        out = self.generate(ids, mask, steps, **options)
        assert self.tokenizer is not None
        rows = [_until_eos(row, self.config.eos_id) for row in out.tokens]
        return [(self.tokenizer.decode(row), row) for row in rows]

    def stream_text(
        self, text_in: str, max_new_tokens: int | None = None, *, truncate: bool = False, **options: Any
    ) -> Iterator[str]:
        """Generation for one text that yields the answer's text as it grows (any strategy; see
        :meth:`stream`): each piece is what the tokens so far add to the decoded answer (a sub-word
        piece may add nothing until its word is complete), so the pieces join to
        :meth:`generate_text`'s answer."""
        ids, mask = self._text_source([text_in], truncate)
        steps = max_new_tokens or self._default_steps(ids.shape[1])
        assert self.tokenizer is not None
        tokens: list[int] = []
        shown = ""
        for step in self.stream(ids, mask, steps, **options):
            token = int(step[0])
            if token == self.config.eos_id:
                break
            tokens.append(token)
            decoded = self.tokenizer.decode(tokens)
            if decoded.startswith(shown) and len(decoded) > len(shown):
                yield decoded[len(shown) :]
                shown = decoded

    def _default_steps(self, width: int) -> int:
        """New tokens when none are asked for: twice the longest source plus 8, within max_len."""
        return min(self.config.max_len, 2 * width + 8)

    def _text_source(self, texts: Any, truncate: bool) -> tuple[np.ndarray, np.ndarray]:
        """(ids, mask) of texts through the export's tokenizer, right-padded."""
        if self.tokenizer is None:
            where = self.export_dir or "this model"
            raise EdgeattnError(f"{where} has no {TOKENIZER}; pass token ids to generate() instead")
        if isinstance(self.tokenizer, TextTokenizer):
            batch = self.text_batch(texts, truncate)
            return batch.ids, batch.mask
        try:
            encoded = [self.tokenizer.encode(t) for t in batch_texts(texts)]
        except TokenizerError as exc:
            raise InputError(str(exc)) from exc
        width = max(len(e) for e in encoded)
        ids = np.full((len(encoded), width), self.config.pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, e in enumerate(encoded):
            ids[i, : len(e)] = e
            mask[i, : len(e)] = 1
        return ids, mask




def empty_cache(config: Any, rows: int) -> dict[str, np.ndarray]:
    """The ``decoder`` graph's self-attention cache of length 0 (its first step) for ``rows`` rows."""
    shape = (rows, config.n_heads, 0, config.head_dim)
    return {n: np.zeros(shape, np.float32) for n in cache_names("past", config.n_decoder_layers)}


def _until_eos(row: np.ndarray, eos_id: int) -> np.ndarray:
    """A generated row up to (not including) its first EOS."""
    ends = np.flatnonzero(row == eos_id)
    return row[: ends[0]] if ends.size else row




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
        self.fixed: dict[str, Any] = {"encoder_attention_mask": mask, **cross}
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
        import onnxruntime as ort

        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.model.device, 0)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        ids = tokens.reshape(self.rows, -1).astype(np.int64)
        if not self.bound:
            feeds = {"input_ids": ids, **self.fixed, **self.past}
            outs = self.session.run(self.spec.output_names, feeds)
            res = dict(zip(self.spec.output_names, outs, strict=True))
            self.past = {p: res["present" + p[4:]] for p in self.past}
            return res["logits"][:, -1]
        binding = self.session.io_binding()
        binding.bind_ortvalue_input("input_ids", self._to_device(ids))
        for name, value in {**self.fixed, **self.past}.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_output("logits", "cpu")
        for p in self.past:
            binding.bind_output("present" + p[4:], self.model.device, 0)
        self.session.run_with_iobinding(binding)
        outs = dict(zip(self.spec.output_names, binding.get_outputs(), strict=True))
        self.past = {p: outs["present" + p[4:]] for p in self.past}
        return outs["logits"].numpy()[:, -1]

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
    ``capacity`` slots, allocated once and bound as both the cache input and the updated-cache
    output, so the graph's ScatterND writes each step's keys and values into it in place (the
    export checks that nothing else reads the cache input). Always through IO binding; on the CPU
    the buffers are numpy arrays the session writes into."""

    def __init__(self, model: Any, ids: np.ndarray, mask: np.ndarray | None, repeat: int, capacity: int,
                 source: tuple[dict[str, np.ndarray], np.ndarray] | None = None) -> None:  # fmt: skip
        if capacity < 1:
            raise InputError(f"a cache needs at least one slot, got capacity={capacity}")
        self.capacity = capacity
        self.on_host = model.device == "cpu"
        super().__init__(model, ids, mask, repeat, graph=DECODER_FIXED, source=source)
        self.position = 0
        self.binding = self.session.io_binding()
        for name, value in {**self.fixed, **self.slots}.items():
            self.binding.bind_ortvalue_input(name, value)
        self._bind_outputs()

    def _bind_outputs(self) -> None:
        """Logits to the host, each updated cache into its own buffer (again whenever the tokens a
        step takes change: ONNX Runtime keeps the logits buffer of the last run's shape)."""
        self.binding.clear_binding_outputs()
        self.binding.bind_output("logits", "cpu")  # the first output bound, the first get_outputs() gives
        for name, value in self.slots.items():
            self.binding.bind_ortvalue_output(SLOT_UPDATED + name[len(SLOT_CACHE) :], value)
        self._width = 0

    #: the cross keys/values and mask are bound once, not copied every step, on the CPU too
    bound = True

    def _start_cache(self) -> None:
        c = self.model.config
        shape = (self.rows, c.n_heads, self.capacity, c.head_dim)
        # zeros, not garbage: unwritten slots are masked, but a NaN there would still reach the sums
        zeros = {n: np.zeros(shape, np.float32) for n in cache_names(SLOT_CACHE, c.n_decoder_layers)}
        self.slots: dict[str, Any] = {n: self._to_device(a) for n, a in zeros.items()}
        #: the caches as numpy arrays over the same memory (on the CPU; empty on a device)
        self.host = zeros if self.on_host else {}

    def _to_device(self, array: np.ndarray) -> Any:
        import onnxruntime as ort

        if self.on_host:  # an OrtValue over the array's own memory (a contiguous array is not copied)
            return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
        return super()._to_device(array)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        ids = np.ascontiguousarray(tokens.reshape(self.rows, -1), dtype=np.int64)
        if self.position >= self.capacity:
            raise EdgeattnError(f"the decoder cache is full: all {self.capacity} slots hold earlier tokens")
        if self.position + ids.shape[1] > self.capacity:
            raise EdgeattnError(f"the decoder cache has {self.capacity - self.position} free slots of its "
                                f"{self.capacity}; {ids.shape[1]} new tokens do not fit")  # fmt: skip
        if self._width and ids.shape[1] != self._width:
            self._bind_outputs()
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
        if np.array_equal(index, np.arange(self.rows)):
            return
        for name, value in self.slots.items():
            if self.on_host:
                self.host[name][:] = self.host[name][index]
            else:  # beam reordering gathers on the host; greedy and sampling never reorder
                value.update_inplace(np.ascontiguousarray(value.numpy()[index]))


