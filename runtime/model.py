"""An export directory loaded into ONNX Runtime sessions: encode, classify, tag, generate, stream.

Reads only what the export wrote (manifest, ONNX files, tokenizer); needs numpy and onnxruntime
alone. Inputs are checked before any session runs. Sessions are shared and safe to call from
several threads: every call keeps its own decoding state.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.config import ModelConfig
from edgeattn.errors import EdgeattnError
from edgeattn.runtime import text
from edgeattn.runtime.engines import EngineChoice, choose_engine, engine_emulated, standard_only
from edgeattn.runtime.generate import GenerationConfig, GenerationOutput, generate, stream_positions
from edgeattn.runtime.layout import TOKENIZER, TRANSPOSED_SUFFIX, WEIGHTS, optimized_cache_file
from edgeattn.runtime.manifest import Manifest, Pooling, check_file, read_manifest
from edgeattn.runtime.onnx_bytes import ExternalTensor, external_data_entries, external_tensors
from edgeattn.runtime.precisions import FP32, PRECISIONS
from edgeattn.runtime.providers import OPENVINO, Provider, provider_name
from edgeattn.runtime.safety import UnsafeFileError, check_entries, check_external_data
from edgeattn.runtime.session import CPU, CUDA, Spinning, create_session, pick_providers
from edgeattn.runtime.specs import (
    POSITION,
    SLOT_CACHE,
    SLOT_UPDATED,
    GraphSpec,
    TensorSpec,
    cache_names,
    encoder_feeds,
    graph_spec,
)
from edgeattn.runtime.tokenizer import TextBatch, TextTokenizer, TokenizerError, WordTokenizer, load_tokenizer

log = logging.getLogger(__name__)


#: Widest beam search an export runs: each beam is a row of the decoder's batch.
MAX_BEAMS = 64


class InputError(EdgeattnError, ValueError):
    """A model input of the wrong type, dtype, rank, size or value."""


def check_feeds(spec: GraphSpec, feeds: dict[str, Any]) -> None:
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


#: The graphs of an encoder-decoder that run once per source rather than once per token.
ONCE_PER_SOURCE = ("attention", "encoder", "cross_kv")


class ExportedModel:
    """The graphs of one export directory as ONNX Runtime sessions.

    Each file's sha256 is checked against the manifest before a session is created.
    ``providers`` None lets the runtime choose each graph's engine and say why
    (:mod:`edgeattn.runtime.engines`: CUDA when this onnxruntime has it, else OpenVINO where it
    runs here, for the encoder graphs of an export without decoders that it runs whole, else
    CPU; logged, and kept in ``engines``); a requested provider that is missing gives a warning
    and the CPU. ``precision`` selects which exported files run (``fp32``, or a reduced precision
    the export holds). ``optimized_cache`` is a directory where
    ONNX Runtime's optimised graphs are kept between loads. On CUDA, float32 stays full float32
    unless ``tf32``; ``io_binding`` (default: on with CUDA) keeps caches on the device.
    ``spinning`` is how ONNX Runtime's intra-op threads wait for work (see
    :data:`edgeattn.runtime.session.Spinning`). ``memory_arena`` (True / False for every graph)
    trades peak memory for speed (see :func:`edgeattn.runtime.session.create_session`); by default
    the graphs an encoder-decoder runs once per source (``encoder``, ``cross_kv``, ``attention``)
    go without an arena, which would otherwise keep their largest batch's activations for good,
    and every other graph has one. Sessions are created on
    first use: a model builds only the graphs its calls need. :meth:`from_graphs` builds one from
    graphs that are not (yet) an export directory.
    """

    def __init__(
        self,
        export_dir: str | Path,
        providers: list[Provider] | tuple[Provider, ...] | None = None,
        threads: int | None = None,
        precision: str = FP32,
        spinning: bool | Spinning = "run",
        optimized_cache: str | Path | None = None,
        io_binding: bool | None = None,
        tf32: bool = False,
        memory_arena: bool | None = None,
    ) -> None:
        export_dir = Path(export_dir)
        manifest = read_manifest(export_dir)
        config = manifest.config
        checked: set[tuple[str, str]] = set()
        paths: dict[str, tuple[Path, str]] = {}
        for name in manifest.graphs:
            entry = manifest.entry(name, precision)
            path = check_file(export_dir, entry, checked)
            listed = {d.file for d in entry.external_data}
            for data in check_external_data(path):
                if data.name not in listed:
                    raise UnsafeFileError(f"{path} keeps data in {data.name}, which the manifest does not list")
            paths[name] = (path, entry.sha256)
        record = PRECISIONS.get(precision)  # None: a precision a newer edgeattn wrote, run as its file is
        if providers is None:
            engines = {name: choose_engine(name, path, "decoder" in paths, optimized_cache is not None, precision)
                       for name, (path, _) in paths.items()}  # fmt: skip
            for name, engine in engines.items():
                log.info("%s graph on %s", name, engine.describe())
            if record is not None and (emulated := engine_emulated(record)) is not None:
                log.warning("%s: %s", precision, emulated)
        else:
            picked = EngineChoice(tuple(pick_providers(providers)), "requested", requested=True)  # one warning
            engines = dict.fromkeys(paths, picked)
            if record and record.engine and record.engine not in [provider_name(p) for p in picked.providers]:
                log.warning("the %s graphs are %s; on %s they run in float32", precision, record.summary,
                            provider_name(picked.providers[0]))  # fmt: skip
            if OPENVINO in [provider_name(p) for p in picked.providers]:
                fused = [name for name, (path, _) in paths.items() if not standard_only(path)]
                if fused:
                    log.warning("OpenVINO runs standard ONNX operators: the %s graphs %s hold ONNX Runtime's fused "
                                "ones, which OpenVINO hands back to ONNX Runtime's CPU provider. For OpenVINO load "
                                "fp32, or int8-static exported with --static-form plain",
                                precision, ", ".join(fused))  # fmt: skip
        shared_by_graph = shared_initializers(export_dir, {name: path for name, (path, _) in paths.items()})
        #: every weight the sessions share, by initializer name
        self._shared = {n: v for values in shared_by_graph.values() for n, v in values.items()}

        def arena(name: str) -> bool:
            if memory_arena is not None:
                return memory_arena
            return not (config.is_seq2seq and name in ONCE_PER_SOURCE)

        def maker(name: str) -> Callable[[], Any]:
            path, sha = paths[name]

            def make() -> Any:
                cache = None
                if optimized_cache is not None:
                    Path(optimized_cache).mkdir(parents=True, exist_ok=True)
                    cache = Path(optimized_cache) / optimized_cache_file(sha, name)
                shared = None if cache is not None else shared_by_graph[name]  # a cached graph holds its own weights
                return create_session(path, providers=engines[name].providers, threads=threads, spinning=spinning,
                                      optimized_cache=cache, tf32=tf32, initializers=shared,
                                      memory_arena=arena(name))  # fmt: skip

            return make

        sessions = LazySessions({name: maker(name) for name in paths})
        tokenizer = None
        if manifest.tokenizer is not None:
            tokenizer = load_tokenizer(check_file(export_dir, manifest.tokenizer))
        self._attach(config, sessions, precision, io_binding, tokenizer, manifest.labels, manifest.pooling)
        self.engines = engines
        self.export_dir: Path | None = export_dir
        self.manifest: Manifest | None = manifest

    @classmethod
    def from_graphs(
        cls,
        config: ModelConfig,
        graphs: dict[str, bytes | Path],
        precision: str = FP32,
        providers: list[Provider] | tuple[Provider, ...] | None = (CPU,),
        threads: int | None = None,
        spinning: bool | Spinning = "run",
    ) -> ExportedModel:
        """A model over ``graphs`` (serialised ONNX models, or files) by graph name, with no export
        directory or manifest behind it: what the accuracy gate measures candidate graphs with."""
        self = cls.__new__(cls)
        for name, graph in graphs.items():
            if isinstance(graph, bytes):
                check_entries(external_data_entries(graph), None, f"the {name} graph")
            else:
                check_external_data(graph)
        sessions = {
            name: create_session(graph, providers=providers, threads=threads, spinning=spinning)
            for name, graph in graphs.items()
        }
        self._attach(config, sessions, precision, None, None)
        self.export_dir, self.manifest = None, None
        return self

    @classmethod
    def from_sessions(
        cls,
        config: ModelConfig,
        sessions: Mapping[str, Any],
        precision: str = FP32,
        tokenizer: WordTokenizer | TextTokenizer | None = None,
        labels: list[str] | None = None,
        pooling: Pooling | None = None,
    ) -> ExportedModel:
        """A model over objects that run its graphs as ONNX Runtime sessions do (``run(output_names,
        feeds)`` and ``get_providers()``), for example graphs served by another process."""
        self = cls.__new__(cls)
        self._attach(config, sessions, precision, False, tokenizer, labels, pooling)
        self.export_dir, self.manifest = None, None
        return self

    def _attach(
        self, config: ModelConfig, sessions: Mapping[str, Any], precision: str, io_binding: bool | None,
        tokenizer: WordTokenizer | TextTokenizer | None, labels: list[str] | None = None,
        pooling: Pooling | None = None,
    ) -> None:  # fmt: skip
        if not sessions:
            raise EdgeattnError("a model needs at least one graph")
        self.config = config
        self.precision = precision
        self.sessions = sessions
        #: the providers each graph of a loaded export directory runs on, and why (see
        #: :mod:`edgeattn.runtime.engines`); empty for graphs or sessions handed over directly
        self.engines: dict[str, EngineChoice] = {}
        self.specs: dict[str, GraphSpec] = {name: graph_spec(name, config) for name in sessions}
        first = sessions["encoder"] if "encoder" in sessions else next(iter(sessions.values()))
        self.providers: list[str] = first.get_providers()
        self.device = "cuda" if self.providers[0] == CUDA else "cpu"
        self.io_binding = self.device == "cuda" if io_binding is None else io_binding
        self.tokenizer = tokenizer
        self._cache_slots = True
        #: label names by output index (classification heads), when the export has them
        self.labels = labels
        #: how :meth:`embed` pools token vectors
        self.pooling = pooling or Pooling()

    @property
    def graphs(self) -> list[str]:
        return list(self.sessions)

    # ----------------------------------------------------------------- graphs
    def run(self, graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one graph after checking its feeds; returns outputs by name."""
        if graph not in self.sessions:
            raise EdgeattnError(f"this export has no {graph!r} graph (it has {', '.join(self.sessions)})")
        spec = self.specs[graph]
        check_feeds(spec, feeds)
        outputs = self.sessions[graph].run(spec.output_names, feeds)
        return dict(zip(spec.output_names, outputs, strict=True))

    def check_source(self, input_ids: Any, attention_mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Validated (input_ids, attention_mask) as int64 (B, S) arrays, or an InputError."""
        ids = _int_matrix(input_ids, "input_ids")
        if attention_mask is None:
            mask = np.ones_like(ids)
        else:
            mask = _int_matrix(attention_mask, "attention_mask")
            if mask.shape != ids.shape:
                raise InputError(
                    f"attention_mask has shape {mask.shape} but input_ids has {ids.shape}; both are (batch, src_len)"
                )
            if not np.isin(mask, (0, 1)).all():
                raise InputError("attention_mask must hold only 0 (padding) and 1 (token)")
            if (mask.sum(axis=1) == 0).any():
                raise InputError(f"attention_mask rows {np.flatnonzero(mask.sum(axis=1) == 0).tolist()} have no token")
        c = self.config
        if ids.shape[1] > c.max_len:
            raise InputError(f"input_ids has {ids.shape[1]} tokens; this model takes at most {c.max_len} (max_len)")
        bad = (ids < 0) | (ids >= c.vocab_size)
        if bad.any():
            raise InputError(
                f"input_ids holds {int(ids[bad][0])}, outside the vocabulary (0..{c.vocab_size - 1}) "
                f"at position {tuple(int(i) for i in np.argwhere(bad)[0])}"
            )
        return ids, mask

    # ---------------------------------------------------------------- encoder
    def encoder_feeds(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None) -> dict[str, Any]:
        """Checked encoder feeds; ``token_type_ids`` (B, S) only for models with token types
        (zeros when not given)."""
        ids, mask = self.check_source(input_ids, attention_mask)
        types = None
        if token_type_ids is not None:
            if not self.config.token_types:
                raise InputError("this model has no token types; leave token_type_ids out")
            types = _int_matrix(token_type_ids, "token_type_ids")
            if types.shape != ids.shape:
                raise InputError(f"token_type_ids has shape {types.shape} but input_ids has {ids.shape}")
            if ((types < 0) | (types >= self.config.token_types)).any():
                raise InputError(f"token_type_ids must lie in 0..{self.config.token_types - 1}")
        return encoder_feeds(self.specs["encoder"].input_names, ids, mask, types)

    def encode(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None) -> np.ndarray:
        """Encoder hidden states (B, S, d_model)."""
        return self.run("encoder", self.encoder_feeds(input_ids, attention_mask, token_type_ids))["last_hidden_state"]

    def _logits(self, input_ids: Any, attention_mask: Any, token_type_ids: Any, head: str) -> np.ndarray:
        if self.config.head != head:
            raise EdgeattnError(f"this model has no {head}-classification head (head={self.config.head!r})")
        return self.run("encoder", self.encoder_feeds(input_ids, attention_mask, token_type_ids))["logits"]

    def classify(
        self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None, *, truncate: bool = False
    ) -> Any:
        """Texts (a string or a list of strings, tokenized by the export's tokenizer): one
        :class:`~edgeattn.runtime.text.Classification` each (label, probability, every label's
        probability). Token ids (B, S): the logits (B, num_labels)."""
        if not _is_text(input_ids):
            return self._logits(input_ids, attention_mask, token_type_ids, "sequence")
        batch = self.text_batch(input_ids, truncate)
        logits = self._logits(batch.ids, batch.mask, self._types(batch), "sequence")
        return text.classifications(logits, text.label_names(self.labels, logits.shape[-1]))

    def tag(
        self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None, *, truncate: bool = False,
        aggregation: str = "simple",
    ) -> Any:  # fmt: skip
        """Texts: the entities of each (a list of :class:`~edgeattn.runtime.text.Entity`: type,
        score, character span into the text; B-/I- tags merged as the ``simple`` aggregation of
        transformers' pipeline merges them; ``aggregation="first"`` labels each word by its first
        piece). Token ids (B, S): the logits (B, S, num_labels)."""
        if not _is_text(input_ids):
            return self._logits(input_ids, attention_mask, token_type_ids, "token")
        if aggregation not in text.AGGREGATIONS:
            raise InputError(f"aggregation {aggregation!r} is not one of {', '.join(text.AGGREGATIONS)}")
        batch = self.text_batch(input_ids, truncate)
        logits = self._logits(batch.ids, batch.mask, self._types(batch), "token")
        labels = text.label_names(self.labels, logits.shape[-1])
        texts = batch_texts(input_ids)
        return [
            text.entities(logits[i], t, batch.offsets[i], batch.special[i], labels, batch.words[i], aggregation)
            for i, t in enumerate(texts)
        ]

    def embed(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None, *, truncate: bool = False
              ) -> np.ndarray:  # fmt: skip
        """One vector per text (or per row of token ids): token vectors pooled as the export says
        (a sentence-embedding folder's pooling; else the mean over real tokens), L2-normalised unless
        the pooling says otherwise. (B, d_model) float32."""
        if _is_text(input_ids):
            batch = self.text_batch(input_ids, truncate)
            feeds = self.encoder_feeds(batch.ids, batch.mask, self._types(batch))
        else:
            feeds = self.encoder_feeds(input_ids, attention_mask, token_type_ids)
        hidden = self.run("encoder", feeds)["last_hidden_state"]
        return text.pool(hidden, feeds["attention_mask"], self.pooling)

    def text_batch(self, texts: Any, truncate: bool = False) -> TextBatch:
        """``texts`` tokenized by the export's Hugging Face tokenizer into one padded batch."""
        if not isinstance(self.tokenizer, TextTokenizer):
            where = self.export_dir or "this model"
            raise EdgeattnError(f"{where} has no Hugging Face {TOKENIZER}; pass token ids instead")
        texts = batch_texts(texts)
        try:
            return self.tokenizer.batch(texts, self.config.max_len, self.config.pad_id, truncate)
        except TokenizerError as exc:
            raise InputError(str(exc)) from exc

    def _types(self, batch: TextBatch) -> np.ndarray | None:
        return batch.type_ids if self.config.token_types else None

    # ------------------------------------------------------------- generation
    def empty_cache(self, rows: int) -> dict[str, np.ndarray]:
        """A self-attention cache of length 0 (the first decoder step) for ``rows`` rows."""
        c = self.config
        shape = (rows, c.n_heads, 0, c.head_dim)
        return {n: np.zeros(shape, np.float32) for n in cache_names("past", c.n_decoder_layers)}

    def _decoding(
        self, input_ids: Any, attention_mask: Any, max_new_tokens: int, strategy: str, eos_id: int | None,
        options: dict[str, Any],
    ) -> dict[str, Any]:  # fmt: skip
        """Checked settings and inputs as the keyword arguments of the search functions."""
        if not {"encoder", "cross_kv", "decoder"} <= set(self.sessions):
            raise EdgeattnError(
                "generation needs the encoder, cross_kv and decoder graphs; export with --graphs decoder"
            )
        unknown = sorted(set(options) - set(GenerationConfig.__dataclass_fields__))
        if unknown:
            raise InputError(f"unknown generation option(s) {', '.join(unknown)}")
        cfg = GenerationConfig(max_new_tokens=max_new_tokens, strategy=strategy, **options)  # type: ignore[arg-type]
        if max_new_tokens > self.config.max_len:
            raise InputError(f"max_new_tokens={max_new_tokens} exceeds the model's max_len {self.config.max_len}")
        if cfg.strategy == "beam" and cfg.num_beams > MAX_BEAMS:
            raise InputError(f"num_beams={cfg.num_beams} is over {MAX_BEAMS}: each beam is a decoder batch row")
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
        return self._cache_slots and "decoder_fixed" in self.sessions

    @cache_slots.setter
    def cache_slots(self, value: bool) -> None:
        self._cache_slots = bool(value)

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


def _until_eos(row: np.ndarray, eos_id: int) -> np.ndarray:
    """A generated row up to (not including) its first EOS."""
    ends = np.flatnonzero(row == eos_id)
    return row[: ends[0]] if ends.size else row


class LazySessions(Mapping[str, Any]):
    """ONNX Runtime sessions by graph name, each created the first time it is asked for (once, also
    under threads): a model loads only the graphs its calls use (generation never builds the
    attention graph's session)."""

    def __init__(self, makers: dict[str, Callable[[], Any]]) -> None:
        self._makers = makers
        self._made: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> Any:
        if name not in self._makers:
            raise KeyError(name)
        session = self._made.get(name)
        if session is None:
            with self._lock:
                session = self._made.get(name)
                if session is None:
                    session = self._made[name] = self._makers[name]()
        return session

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __contains__(self, name: object) -> bool:  # asking does not build the session
        return name in self._makers

    def __len__(self) -> int:
        return len(self._makers)

    @property
    def created(self) -> list[str]:
        """The graphs whose sessions exist so far."""
        return list(self._made)


def shared_initializers(export_dir: Path, graphs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Weights that several of ``graphs`` keep in the export's checkpoint under the same name and
    bytes (a shared embedding, relative-position tables), as ONNX Runtime values over one read-only
    map of the checkpoint, by the graph that uses them: handed to each session
    (``SessionOptions.add_initializer``), they are held in memory once, not once per session."""
    import onnxruntime as ort

    users: dict[tuple[str, str, str], list[str]] = {}
    tensors: dict[tuple[str, str, str], ExternalTensor] = {}
    for graph, path in graphs.items():
        for t in external_tensors(path.read_bytes()):
            if t.pairs.get("location") != WEIGHTS or t.name.endswith(TRANSPOSED_SUFFIX) or t.data_type not in _NUMPY:
                continue
            key = (t.name, t.pairs.get("offset", "0"), t.pairs.get("length", ""))
            tensors[key] = t
            users.setdefault(key, []).append(graph)
    shared = {key: names for key, names in users.items() if len(names) > 1}
    values: dict[str, dict[str, Any]] = {graph: {} for graph in graphs}
    if not shared:
        return values
    mapped = np.memmap(export_dir / WEIGHTS, dtype=np.uint8, mode="r")
    for key, names in shared.items():
        t = tensors[key]
        offset, length = int(t.pairs.get("offset", "0")), int(t.pairs["length"])
        array = mapped[offset : offset + length].view(_NUMPY[t.data_type]).reshape(t.dims)
        value = ort.OrtValue.ortvalue_from_numpy(array)
        for graph in names:
            values[graph][t.name] = value
    return values


#: ONNX element type -> numpy dtype, for weights shared between sessions
_NUMPY = {1: np.float32, 10: np.float16, 7: np.int64}


def batch_texts(value: Any) -> list[str]:
    """One text as a batch of one; a list or tuple of texts as a list."""
    return [value] if isinstance(value, str) else list(value)


def _is_text(value: Any) -> bool:
    """A string, or a non-empty list or tuple of strings."""
    if isinstance(value, str):
        return True
    return isinstance(value, list | tuple) and len(value) > 0 and all(isinstance(v, str) for v in value)


def _int_matrix(value: Any, name: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        try:
            value = np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise InputError(f"{name} must be a (batch, src_len) integer array: {exc}") from exc
    if value.dtype.kind not in "iu":
        raise InputError(f"{name} must hold integers (int64), got dtype {value.dtype}")
    if value.ndim != 2:
        raise InputError(f"{name} must have shape (batch, src_len), got {value.shape}")
    if value.shape[0] == 0 or value.shape[1] == 0:
        raise InputError(f"{name} must have at least one row and one token, got shape {value.shape}")
    return value.astype(np.int64, copy=False)


class OnnxStepper:
    """Decoding state over the exported graphs: cross keys/values computed once, the
    self-attention cache carried from step to step. With IO binding the cache and cross
    keys/values stay on the session's device; only the new tokens and logits cross to the host."""

    def __init__(
        self, model: ExportedModel, ids: np.ndarray, mask: np.ndarray, repeat: int, graph: str = "decoder"
    ) -> None:
        self.model = model
        self.session = model.sessions[graph]
        self.spec = model.specs[graph]
        hidden = model.run("encoder", {"input_ids": ids, "attention_mask": mask})["last_hidden_state"]
        cross = model.run("cross_kv", {"encoder_hidden_states": hidden})
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
        past = self.model.empty_cache(self.rows)
        self.past: dict[str, Any] = {k: self._to_device(v) for k, v in past.items()} if self.bound else past

    def _to_device(self, array: np.ndarray) -> Any:
        import onnxruntime as ort

        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.model.device, 0)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        ids = tokens.reshape(self.rows, 1).astype(np.int64)
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

    def __init__(self, model: ExportedModel, ids: np.ndarray, mask: np.ndarray, repeat: int, capacity: int) -> None:
        if capacity < 1:
            raise InputError(f"a cache needs at least one slot, got capacity={capacity}")
        self.capacity = capacity
        self.on_host = model.device == "cpu"
        super().__init__(model, ids, mask, repeat, graph="decoder_fixed")
        self.position = 0
        self.binding = self.session.io_binding()
        for name, value in {**self.fixed, **self.slots}.items():
            self.binding.bind_ortvalue_input(name, value)
        self.binding.bind_output("logits", "cpu")  # the first output bound, the first get_outputs() gives
        for name, value in self.slots.items():
            self.binding.bind_ortvalue_output(SLOT_UPDATED + name[len(SLOT_CACHE) :], value)

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
        if self.position >= self.capacity:
            raise EdgeattnError(f"the decoder cache is full: all {self.capacity} slots hold earlier tokens")
        ids = np.ascontiguousarray(tokens.reshape(self.rows, 1), dtype=np.int64)
        self.binding.bind_cpu_input("input_ids", ids)
        self.binding.bind_cpu_input(POSITION, np.array([self.position], dtype=np.int64))
        self.session.run_with_iobinding(self.binding)
        self.position += 1
        return self.binding.get_outputs()[0].numpy()[:, -1]

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


def load(
    export_dir: str | Path,
    providers: list[Provider] | tuple[Provider, ...] | None = None,
    threads: int | None = None,
    precision: str = FP32,
    **options: Any,
) -> ExportedModel:
    """Load an export directory for inference; see :class:`ExportedModel`."""
    return ExportedModel(export_dir, providers=providers, threads=threads, precision=precision, **options)
