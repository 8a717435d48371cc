"""The export directory's ``manifest.json``: its typed schema, the one reader and writer, and file hashes.

The manifest is a tree of dataclasses (:class:`Manifest` at the root). Reading validates it: the
format version, every required key, and the type of every value, naming the place of the first
problem (``graphs.encoder.precisions.int8.sha256``). Keys this version does not know are ignored.
Torch-free: the exporter writes it, the runtime, the verifier, ``inspect`` and the benchmark read it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from edgeattn.config import ModelConfig
from edgeattn.errors import ConfigError, EdgeattnError
from edgeattn.runtime.layout import MANIFEST, external_data_file, previous_prefix
from edgeattn.runtime.precisions import FP32, Verdict
from edgeattn.runtime.specs import GraphSpec, TensorSpec

FORMAT_VERSION = 1

#: Keys every ONNX file of an export carries in its ``metadata_props``.
META_CONFIG = "edgeattn.config"
META_GRAPH = "edgeattn.graph"
META_PRECISION = "edgeattn.precision"
META_VERSION = "edgeattn.version"
META_FORMAT = "edgeattn.format_version"
META_SPEC = "edgeattn.spec"


class ManifestError(EdgeattnError):
    """An export directory whose manifest is missing, malformed or does not match its files."""


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------- schema
@dataclass(kw_only=True)
class DataFile:
    """A file that holds a graph's external weights."""

    file: str
    sha256: str
    bytes: int


@dataclass(kw_only=True)
class FileEntry:
    """A file of the export, its sha256 and size; ``bytes`` counts this file alone."""

    file: str
    sha256: str
    bytes: int
    external_data: list[DataFile] = field(default_factory=list)

    OMIT_EMPTY: ClassVar[frozenset[str]] = frozenset({"external_data"})

    @property
    def total_bytes(self) -> int:
        """This file and its external data."""
        return self.bytes + sum(d.bytes for d in self.external_data)

    @classmethod
    def describe(cls, path: Path, shared: list[DataFile] | None = None, **fields: Any) -> Any:
        """The entry of ``path`` as it is on disk now (its external-data file too, when there is one,
        and ``shared``: files of the export it keeps other weights in)."""
        data = path.with_name(external_data_file(path.name))
        extra = [DataFile(file=data.name, sha256=sha256_file(data), bytes=data.stat().st_size)] if data.exists() else []
        extra += shared or []
        return cls(file=path.name, sha256=sha256_file(path), bytes=path.stat().st_size, external_data=extra, **fields)

    def as_data(self) -> DataFile:
        """This file as the external data of a graph."""
        return DataFile(file=self.file, sha256=self.sha256, bytes=self.bytes)


@dataclass(kw_only=True)
class Parity:
    """A graph's float32 parity against eager PyTorch (the verifier's summary)."""

    cases: int
    max_abs: float
    max_rel: float
    passed: bool
    atol: float
    rtol: float
    #: cases where float32 eager strayed itself and the graph was judged against float64 eager
    float64_cases: int = 0

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"float64_cases"})


@dataclass(kw_only=True)
class GreedyParity:
    """Greedy decoding through the graphs against eager PyTorch."""

    rows: int
    tokens: int
    mismatched_rows: list[int]
    passed: bool


@dataclass(kw_only=True)
class Variant(FileEntry):
    """A graph at a precision other than fp32."""

    precision: str
    degraded: bool = False
    #: what the graph was made from
    source: str | None = None
    #: the converter's settings (free-form: each converter records its own)
    quantization: dict[str, Any] | None = None
    fused_operators: dict[str, int] | None = None
    attention_blocks: int | None = None
    attention_fused: int | None = None
    not_fused_because: str | None = None
    #: float32 parity, for precisions held to it
    parity: Parity | None = None
    #: how the graph keeps its in-place key/value cache where its precision asks for int8 (the
    #: element type, its scales and what they were measured on, or why it stayed float32)
    kv_cache: dict[str, Any] | None = None

    OMIT_EMPTY: ClassVar[frozenset[str]] = frozenset(
        {"external_data", "source", "quantization", "fused_operators", "attention_blocks", "attention_fused",
         "not_fused_because", "parity", "kv_cache"}
    )  # fmt: skip


@dataclass(kw_only=True)
class GraphEntry(FileEntry):
    """One exported graph: its fp32 file, spec, parity, and its other precisions."""

    role: str
    opset: int
    precision: str = FP32
    description: str = ""
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    parity: Parity | None = None
    precisions: dict[str, Variant] = field(default_factory=dict)

    OMIT_EMPTY: ClassVar[frozenset[str]] = frozenset({"external_data", "precisions"})

    @classmethod
    def of_spec(cls, path: Path, spec: GraphSpec, opset: int, shared: list[DataFile] | None = None) -> GraphEntry:
        """The entry of a freshly exported fp32 graph (``shared``: see :meth:`FileEntry.describe`)."""
        return cls.describe(path, shared, role=spec.name, opset=opset, description=spec.description,
                            inputs=list(spec.inputs), outputs=list(spec.outputs))  # fmt: skip

    @property
    def spec(self) -> GraphSpec:
        """The graph's inputs and outputs as the export wrote them."""
        return GraphSpec(self.role, self.description, tuple(self.inputs), tuple(self.outputs))

    def at(self, precision: str) -> FileEntry:
        """The file entry at ``precision``: this entry for fp32, else one of its variants."""
        if precision == self.precision:
            return self
        if precision not in self.precisions:
            have = ", ".join(sorted({self.precision, *self.precisions}))
            raise ManifestError(f"graph {self.role!r} was not exported at precision {precision!r} (it has {have})")
        return self.precisions[precision]


@dataclass(kw_only=True)
class GateRecord:
    """The accuracy gate's figures for one precision."""

    metrics: dict[str, dict[str, float]]
    thresholds: dict[str, float]
    passed: bool
    failures: list[Verdict]
    degraded: bool = False
    #: what the held-out data were, in words
    heldout: str = ""

    OMIT_EMPTY: ClassVar[frozenset[str]] = frozenset({"heldout"})


@dataclass(kw_only=True)
class EmbeddingPooling:
    """How an embedding model turns its token vectors into one vector per text."""

    #: "mean" over real tokens, "cls" (the first token) or "max" over real tokens
    mode: str = "mean"
    #: divide by the L2 norm afterwards
    normalize: bool = True


@dataclass
class ImportCheck:
    """How an imported checkpoint was checked against transformers' own reading of its folder."""

    #: the transformers version that read the folder ("" where the check was left out)
    transformers: str
    #: the check's line (the largest difference and its tolerance), or why it was left out
    result: str
    #: None where the check was left out
    passed: bool | None


@dataclass(kw_only=True)
class Manifest:
    """What an export directory holds."""

    format_version: int = FORMAT_VERSION
    edgeattn_version: str
    created: str
    #: where the model came from, in words
    source: str
    task: str | None = None
    #: the model family (``edgeattn.runtime.families``); exports written before families were
    #: recorded have none, and their config's architecture says it
    family: str | None = None
    #: the tools and versions that exported the graphs
    exporter: dict[str, str] = field(default_factory=dict)
    config: ModelConfig
    weights: FileEntry | None = None
    tokenizer: FileEntry | None = None
    graphs: dict[str, GraphEntry] = field(default_factory=dict)
    gates: dict[str, GateRecord] = field(default_factory=dict)
    greedy_parity: GreedyParity | None = None
    #: the architecture an imported checkpoint had (``BertForTokenClassification``)
    architecture: str | None = None
    #: label names by output index, for models with a classification head
    labels: list[str] | None = None
    #: how ``embed`` pools, for embedding models
    pooling: EmbeddingPooling | None = None
    #: the absolute path of the folder an imported checkpoint came from (the benchmark's peers
    #: run on it when it is still there; the runtime never reads it)
    source_folder: str | None = None
    #: a language model's chat template (``chat_template.json``: the template and its special tokens)
    chat_template: FileEntry | None = None
    #: the tokens that end a language model's answer (end of text, end of turn)
    stop_ids: list[int] | None = None
    #: a family's own settings its runtime reads (``settings.json``; a speech model's features and
    #: decoding settings)
    settings: FileEntry | None = None
    #: an imported checkpoint's check against transformers
    import_check: ImportCheck | None = None

    OMIT_EMPTY: ClassVar[frozenset[str]] = frozenset({"family", "architecture", "labels", "pooling", "source_folder",
                                                      "chat_template", "stop_ids", "settings",
                                                      "import_check"})  # fmt: skip
    #: keys a version-1 manifest may lack (older writers left them out until they had a value)
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"gates", "greedy_parity"})

    @property
    def family_name(self) -> str:
        """The model family's name: as recorded, else the one of the config's architecture."""
        from edgeattn.runtime.families import family_of

        return self.family or family_of(self.config).name

    def entry(self, graph: str, precision: str = FP32) -> FileEntry:
        """The file entry of ``graph`` at ``precision``."""
        if graph not in self.graphs:
            raise ManifestError(f"this export has no {graph!r} graph (it has {', '.join(self.graphs)})")
        return self.graphs[graph].at(precision)

    def to_json(self) -> dict[str, Any]:
        return _encode(self)

    @classmethod
    def from_json(cls, data: Any, where: str = MANIFEST) -> Manifest:
        """A manifest from parsed JSON, validated; ManifestError names the first problem."""
        if not isinstance(data, dict):
            raise ManifestError(f"{where} must hold a JSON object")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ManifestError(f"{where} has format_version {version!r}; this edgeattn reads version {FORMAT_VERSION}")
        if not isinstance(data.get("graphs"), dict) or not data["graphs"]:
            raise ManifestError(f"{where} lists no graphs")
        return _decode_dataclass(cls, data, _Place(where))

    def write(self, export_dir: str | Path) -> Path:
        """Write ``manifest.json`` (indented JSON) into ``export_dir``."""
        path = Path(export_dir) / MANIFEST
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        return path


def read_manifest(export_dir: str | Path) -> Manifest:
    """Load and validate ``export_dir/manifest.json``."""
    from edgeattn.runtime.safety import member_path

    export_dir = Path(export_dir)
    path = export_dir / MANIFEST
    if not export_dir.is_dir():
        waiting = sorted(export_dir.parent.glob(previous_prefix(export_dir.name) + "*"))
        if not export_dir.exists() and waiting:
            raise ManifestError(
                f"{export_dir} is missing: a writer was killed while swapping it; its previous version waits in "
                f"{waiting[-1]} (the next edgeattn export or quantize of it restores it, or rename it back)"
            )
        raise ManifestError(f"{export_dir} is not a directory (expected an edgeattn export)")
    if not path.is_file() and not path.is_symlink():
        raise ManifestError(f"{export_dir} has no {MANIFEST}; is it an edgeattn export directory?")
    member_path(export_dir, MANIFEST)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path} is not readable JSON: {exc}") from exc
    return Manifest.from_json(data, str(path))


def check_file(export_dir: Path, entry: FileEntry | DataFile, checked: set[tuple[str, str]] | None = None) -> Path:
    """The path of a manifest file entry after checking it is a regular file inside ``export_dir``
    (see :func:`edgeattn.runtime.safety.member_path`) and its sha256 matches. ``checked`` holds the
    (file, sha256) pairs already hashed in this load (a checkpoint several graphs keep weights in
    is hashed once); files hashed here are added to it."""
    from edgeattn.runtime.safety import member_path

    path = member_path(export_dir, entry.file)
    if checked is None or (entry.file, entry.sha256) not in checked:
        digest = sha256_file(path)
        if digest != entry.sha256:
            raise ManifestError(
                f"{path} does not match its manifest sha256 (file changed or corrupted since export): "
                f"{digest[:16]}… != {entry.sha256[:16]}…"
            )
        if checked is not None:
            checked.add((entry.file, entry.sha256))
    for extra in getattr(entry, "external_data", []):
        check_file(export_dir, extra, checked)
    return path


# ------------------------------------------------------------------------------------ the codec
T = TypeVar("T")


class _Place:
    """Where in the manifest a value sits, for error messages."""

    def __init__(self, file: str, path: tuple[str, ...] = ()) -> None:
        self.file, self.path = file, path

    def __truediv__(self, key: str) -> _Place:
        return _Place(self.file, (*self.path, str(key)))

    def error(self, message: str) -> ManifestError:
        return ManifestError(f"{self.file}: {'.'.join(self.path) or 'top level'} {message}")


def _encode(value: Any) -> Any:
    if isinstance(value, ModelConfig):
        return value.to_dict()
    if isinstance(value, TensorSpec):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        omit = getattr(value, "OMIT_EMPTY", frozenset())
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.name in omit and (item is None or item == [] or item == {}):
                continue
            out[f.name] = _encode(item)
        return out
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value


@typing.no_type_check
def _decode(tp: Any, value: Any, where: _Place) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise where.error("must not be null")
        choices = [a for a in args if a is not type(None)]
        for inner in choices[:-1]:
            try:
                return _decode(inner, value, where)
            except ManifestError:
                continue
        return _decode(choices[-1], value, where)
    if value is None:
        raise where.error("must not be null")
    if tp is bool:
        if not isinstance(value, bool):
            raise where.error(f"must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise where.error(f"must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise where.error(f"must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise where.error(f"must be a string, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise where.error(f"must be a list, got {type(value).__name__}")
        return [_decode(args[0], v, where / str(i)) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise where.error(f"must be an object, got {type(value).__name__}")
        return {k: _decode(args[1], v, where / k) for k, v in value.items()}
    if tp is ModelConfig:
        try:
            return ModelConfig.from_dict(value)
        except ConfigError as exc:
            raise where.error(f"is not a valid model config: {exc}") from exc
    if tp is TensorSpec:
        spec = _decode_dataclass(_TensorJson, value, where)
        return TensorSpec(spec.name, spec.dtype, tuple(spec.shape))
    if tp is Verdict:
        if isinstance(value, str):  # written as "graph metric measured < limit" before verdicts were values
            return _legacy_verdict(value, where)
        return _decode_dataclass(Verdict, value, where)
    if dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, value, where)
    raise TypeError(f"no manifest decoding for {tp!r}")  # pragma: no cover - a schema bug, not a user error


@dataclass(kw_only=True)
class _TensorJson:
    name: str
    dtype: str
    shape: list[str | int]


def _legacy_verdict(text: str, where: _Place) -> Verdict:
    parts = text.split()
    if len(parts) == 5 and parts[3] == "<":
        try:
            return Verdict(parts[0], parts[1], float(parts[2]), float(parts[4]))
        except ValueError:
            pass
    raise where.error(f"is not a gate verdict: {text!r}")


def _decode_dataclass(cls: type[T], value: Any, where: _Place) -> T:
    if not isinstance(value, dict):
        raise where.error(f"must be an object, got {type(value).__name__}")
    hints = typing.get_type_hints(cls)
    optional = getattr(cls, "OPTIONAL", frozenset()) | getattr(cls, "OMIT_EMPTY", frozenset())
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in value:
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if f.name in optional and has_default:
                continue
            raise where.error(f"lacks {f.name!r}")
        kwargs[f.name] = _decode(hints[f.name], value[f.name], where / f.name)
    return cls(**kwargs)
