"""An export directory loaded into ONNX Runtime sessions: the core every family's runtime is built on.

:func:`load` returns the runtime of the export's family (:mod:`edgeattn.runtime.families`): an
:class:`~edgeattn.runtime.families.encoder.runtime.EncoderRuntime` (encode, classify, tag, embed) or a
:class:`~edgeattn.runtime.families.seq2seq.runtime.Seq2SeqRuntime` (generate, stream, and their text
forms). This core checks the files, chooses each graph's engine, creates sessions lazily, reads
each graph's spec from the manifest, and checks every feed against it. Reads only what the export
wrote (manifest, ONNX files, tokenizer); needs numpy and onnxruntime alone. Sessions are shared
and safe to call from several threads.
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
from edgeattn.runtime.engines import EngineChoice, choose_engine, engine_emulated, standard_only
from edgeattn.runtime.families import FAMILIES, Family, family_of, get_family, resolve
from edgeattn.runtime.generate import GenerationConfig
from edgeattn.runtime.layout import TOKENIZER, TRANSPOSED_SUFFIX, WEIGHTS, optimized_cache_file
from edgeattn.runtime.manifest import EmbeddingPooling, Manifest, ManifestError, check_file, read_manifest
from edgeattn.runtime.onnx_bytes import ExternalTensor, external_data_entries, file_external_tensors
from edgeattn.runtime.precisions import FP32, PRECISIONS
from edgeattn.runtime.providers import OPENVINO, Provider, provider_name
from edgeattn.runtime.safety import UnsafeFileError, check_entries, check_external_data
from edgeattn.runtime.session import CPU, CUDA, Spinning, create_session, pick_providers
from edgeattn.runtime.specs import SLOT_CACHE, GraphSpec, TensorSpec
from edgeattn.runtime.tokenizer import TextBatch, TextTokenizer, TokenizerError, WordTokenizer, load_tokenizer

log = logging.getLogger(__name__)


#: Widest beam search a runtime runs: each beam is a row of the decoding graph's batch.
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


def check_stored_spec(stored: GraphSpec, expected: GraphSpec) -> None:
    """Refuse a graph whose manifest spec does not take the inputs this version feeds it or lacks an
    output it reads (outputs this version does not list are fine: they are returned too)."""
    where = f"the {stored.name} graph's manifest spec"
    if {t.name: t for t in stored.inputs} != {t.name: t for t in expected.inputs}:
        raise ManifestError(f"{where} takes {_names(stored.inputs)}; this edgeattn feeds it {_names(expected.inputs)}")
    outputs = {t.name: t for t in stored.outputs}
    for t in expected.outputs:
        if outputs.get(t.name) != t:
            raise ManifestError(f"{where} lacks the output {t.name} {t.dtype} {_shape_text(t)} this edgeattn reads")


def _names(tensors: tuple[TensorSpec, ...]) -> str:
    return ", ".join(f"{t.name} {t.dtype} {_shape_text(t)}" for t in tensors) or "nothing"


def runtime_class(family: Family) -> type[ExportedModel]:
    """The runtime class :func:`load` returns for ``family``'s exports."""
    return resolve(family.runtime)


class ExportedModel:
    """The graphs of one export directory as ONNX Runtime sessions (the core of every family's
    runtime; constructed directly, it builds the export's family runtime).

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
    the graphs a family runs once per source (an encoder-decoder's encoder, cross_kv and
    attention) go without an arena, which would otherwise keep their largest batch's activations
    for good, and every other graph has one. ``prepacking`` False keeps float32 weights mapped
    rather than repacked into memory (see :func:`edgeattn.runtime.session.create_session`: the
    export's own checks of a large model). Sessions are created on
    first use: a model builds only the graphs its calls need. :meth:`from_graphs` builds one from
    graphs that are not (yet) an export directory.
    """

    def __new__(cls, export_dir: str | Path | None = None, *args: Any, **kwargs: Any) -> ExportedModel:
        if cls is ExportedModel and export_dir is not None:  # the family's runtime
            cls = runtime_class(get_family(read_manifest(Path(export_dir)).family_name))
        return super().__new__(cls)

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
        prepacking: bool = True,
    ) -> None:
        export_dir = Path(export_dir)
        manifest = read_manifest(export_dir)
        config = manifest.config
        family = get_family(manifest.family_name)
        if family is not family_of(config):
            raise ManifestError(f"{export_dir}: the manifest says family {family.name!r} but its config's architecture "
                                f"{config.architecture!r} is the {family_of(config).name!r} family's")  # fmt: skip
        checked: set[tuple[str, str]] = set()
        paths: dict[str, tuple[Path, str]] = {}
        in_checkpoint: list[str] = []  # the graphs that keep weights in the export's checkpoint
        for name in manifest.graphs:
            entry = manifest.entry(name, precision)
            path = check_file(export_dir, entry, checked)
            listed = {d.file for d in entry.external_data}
            for data in check_external_data(path):
                if data.name not in listed:
                    raise UnsafeFileError(f"{path} keeps data in {data.name}, which the manifest does not list")
            paths[name] = (path, entry.sha256)
            if WEIGHTS in listed:
                in_checkpoint.append(name)
        record = PRECISIONS.get(precision)  # None: a precision a newer edgeattn wrote, run as its file is
        if providers is None:
            generates = family.generates_with(paths)
            engines = {name: choose_engine(family.graphs.get(name), path, generates, optimized_cache is not None,
                                           precision)
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
        shared_by_graph = {name: {} for name in paths} | shared_initializers(
            export_dir, {name: paths[name][0] for name in in_checkpoint})  # fmt: skip
        #: every weight the sessions share, by initializer name
        self._shared = {n: v for values in shared_by_graph.values() for n, v in values.items()}

        def arena(name: str) -> bool:
            if memory_arena is not None:
                return memory_arena
            role = family.graphs.get(name)
            return not (role is not None and role.once_per_source)

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
                                      memory_arena=arena(name), prepacking=prepacking)  # fmt: skip

            return make

        sessions = LazySessions({name: maker(name) for name in paths})
        tokenizer = None
        if manifest.tokenizer is not None:
            tokenizer = load_tokenizer(check_file(export_dir, manifest.tokenizer))
        specs = {name: manifest.graphs[name].spec for name in paths}
        self.export_dir: Path | None = export_dir
        self.manifest: Manifest | None = manifest
        self._attach(config, sessions, precision, io_binding, tokenizer, manifest.labels, manifest.pooling, specs)
        self.engines = engines

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
        self = object.__new__(cls._for_config(config))
        for name, graph in graphs.items():
            if isinstance(graph, bytes):
                check_entries(external_data_entries(graph), None, f"the {name} graph")
            else:
                check_external_data(graph)
        sessions = {
            name: create_session(graph, providers=providers, threads=threads, spinning=spinning)
            for name, graph in graphs.items()
        }
        self.export_dir, self.manifest = None, None
        self._attach(config, sessions, precision, None, None)
        return self

    @classmethod
    def from_sessions(
        cls,
        config: ModelConfig,
        sessions: Mapping[str, Any],
        precision: str = FP32,
        tokenizer: WordTokenizer | TextTokenizer | None = None,
        labels: list[str] | None = None,
        pooling: EmbeddingPooling | None = None,
    ) -> ExportedModel:
        """A model over objects that run its graphs as ONNX Runtime sessions do (``run(output_names,
        feeds)`` and ``get_providers()``), for example graphs served by another process."""
        self = object.__new__(cls._for_config(config))
        self.export_dir, self.manifest = None, None
        self._attach(config, sessions, precision, False, tokenizer, labels, pooling)
        return self

    @classmethod
    def _for_config(cls, config: ModelConfig) -> type[ExportedModel]:
        """``cls``, or the family's runtime when ``cls`` is this core."""
        return runtime_class(family_of(config)) if cls is ExportedModel else cls

    def _attach(
        self, config: ModelConfig, sessions: Mapping[str, Any], precision: str, io_binding: bool | None,
        tokenizer: WordTokenizer | TextTokenizer | None, labels: list[str] | None = None,
        pooling: EmbeddingPooling | None = None, specs: dict[str, GraphSpec] | None = None,
    ) -> None:  # fmt: skip
        if not sessions:
            raise EdgeattnError("a model needs at least one graph")
        self.config = config
        #: the model family (:mod:`edgeattn.runtime.families`) whose graphs these are
        self.family = family_of(config)
        self.precision = precision
        self.sessions = sessions
        #: the providers each graph of a loaded export directory runs on, and why (see
        #: :mod:`edgeattn.runtime.engines`); empty for graphs or sessions handed over directly
        self.engines: dict[str, EngineChoice] = {}
        #: each graph's spec: as the manifest stores it (checked against what this version feeds and
        #: reads), else as the family's role gives it
        self.specs: dict[str, GraphSpec] = {}
        for name in sessions:
            role = self.family.graphs.get(name)
            expected = role.spec(config) if role is not None else None
            stored = (specs or {}).get(name)
            if stored is not None and expected is not None:
                check_stored_spec(stored, expected)
            if stored is None and expected is None:
                raise EdgeattnError(f"a {self.family.name} model has no {name!r} graph, and no spec was given for it")
            self.specs[name] = stored or expected  # type: ignore[assignment]
        primary = self.family.primary_graph
        first = sessions[primary] if primary in sessions else next(iter(sessions.values()))
        self.providers: list[str] = first.get_providers()
        self.device = "cuda" if self.providers[0] == CUDA else "cpu"
        self.io_binding = self.device == "cuda" if io_binding is None else io_binding
        self.tokenizer = tokenizer
        #: label names by output index (classification heads), when the export has them
        self.labels = labels
        #: how an encoder's ``embed`` pools token vectors
        self.pooling = pooling or EmbeddingPooling()
        self._attached()

    def _attached(self) -> None:
        """A family runtime's own state, set up once the sessions are attached."""

    @property
    def graphs(self) -> list[str]:
        return list(self.sessions)

    def __getattr__(self, name: str) -> Any:
        """A method of another family's runtime is not this one's: say whose it is."""
        family = self.__dict__.get("family")
        if family is not None and not name.startswith("_"):
            for other in FAMILIES.values():
                if other is not family and callable(getattr(runtime_class(other), name, None)):
                    raise AttributeError(
                        f"{type(self).__name__!r} object has no attribute {name!r}: {name}() is for {other.name} "
                        f"exports ({other.summary}); this is a {family.name} export, which does "
                        f"{', '.join(family.tasks)}"
                    )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ----------------------------------------------------------------- graphs
    def run(self, graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one graph after checking its feeds; returns outputs by name. A graph whose cache is
        written in place runs as a runtime runs it: each ``updated_*`` output bound to a copy of its
        ``cache_*`` input (slots it does not write keep what they held)."""
        if graph not in self.sessions:
            raise EdgeattnError(f"this export has no {graph!r} graph (it has {', '.join(self.sessions)})")
        spec = self.specs[graph]
        check_feeds(spec, feeds)
        role = self.family.graphs.get(graph)
        if role is not None and role.in_place:
            return self._run_in_place(graph, feeds)
        outputs = self.sessions[graph].run(spec.output_names, feeds)
        return dict(zip(spec.output_names, outputs, strict=True))

    def _run_in_place(self, graph: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from edgeattn.runtime.slot_cache import SlotCache, updated_name

        spec, session = self.specs[graph], self.sessions[graph]
        caches_in = [name for name in spec.input_names if name.startswith(SLOT_CACHE + "_")]
        dtype = input_dtype(session, caches_in[0]) if caches_in else np.float32  # one type for every cache
        cache = SlotCache({name: np.array(feeds[name], dtype=dtype) for name in caches_in}, self.device)
        binding = session.io_binding()
        # a bound array must outlive the run
        kept = {name: np.ascontiguousarray(feeds[name]) for name in spec.input_names if name not in cache.values}
        for name, array in kept.items():
            binding.bind_cpu_input(name, array)
        others = [name for name in spec.output_names if name not in {updated_name(c) for c in caches_in}]
        cache.bind(binding, others)
        session.run_with_iobinding(binding)
        out = dict(zip(others, (v.numpy() for v in binding.get_outputs()[: len(others)]), strict=True))
        out.update({updated_name(name): array for name, array in cache.arrays().items()})
        return {name: out[name] for name in spec.output_names}

    def generation_config(self, max_new_tokens: int, strategy: str, options: dict[str, Any]) -> GenerationConfig:
        """Checked decoding settings: options the search knows, and no wider beam than :data:`MAX_BEAMS`."""
        unknown = sorted(set(options) - set(GenerationConfig.__dataclass_fields__))
        if unknown:
            raise InputError(f"unknown generation option(s) {', '.join(unknown)}")
        cfg = GenerationConfig(max_new_tokens=max_new_tokens, strategy=strategy, **options)  # type: ignore[arg-type]
        if cfg.strategy == "beam" and cfg.num_beams > MAX_BEAMS:
            raise InputError(f"num_beams={cfg.num_beams} is over {MAX_BEAMS}: each beam is a batch row")
        return cfg

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

    def put(self, name: str, session: Any) -> None:
        """Run ``session`` as graph ``name`` (another file of that graph: a target bundle's)."""
        with self._lock:
            self._makers.setdefault(name, lambda: session)
            self._made[name] = session


def shared_initializers(export_dir: Path, graphs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Weights that several of ``graphs`` keep in the export's checkpoint under the same name and
    bytes (a shared embedding, relative-position tables), as ONNX Runtime values over one read-only
    map of the checkpoint, by the graph that uses them: handed to each session
    (``SessionOptions.add_initializer``), they are held in memory once, not once per session."""
    import onnxruntime as ort

    users: dict[tuple[str, str, str], list[str]] = {}
    tensors: dict[tuple[str, str, str], ExternalTensor] = {}
    for graph, path in graphs.items():
        for t in file_external_tensors(path):
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


#: ONNX Runtime's type names of the caches' element types a graph may take, as numpy's
_CACHE_TYPES = {"tensor(float16)": np.float16, "tensor(int8)": np.int8}


def input_dtype(session: Any, name: str) -> type:
    """The numpy dtype of a session's cache input ``name``: float16 or int8 where the graph takes
    it so (an fp16 graph's in-place caches, a cache kept in int8), else float32."""
    kind = next((i.type for i in session.get_inputs() if i.name == name), "")
    return _CACHE_TYPES.get(kind, np.float32)


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




def load(
    export_dir: str | Path,
    providers: list[Provider] | tuple[Provider, ...] | None = None,
    threads: int | None = None,
    precision: str = FP32,
    **options: Any,
) -> ExportedModel:
    """Load an export directory for inference: the runtime of its family (see :class:`ExportedModel`)."""
    return ExportedModel(export_dir, providers=providers, threads=threads, precision=precision, **options)
