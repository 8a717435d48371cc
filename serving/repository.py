"""A Triton Inference Server model repository from an export directory.

```
<repo>/
  README.md                        how to start it, call it, and run it on KServe
  kserve.yaml                      a KServe InferenceService for the repository
  <name>_<graph>/                  one ONNX Runtime backend model per graph the task needs
    config.pbtxt                   from the graph's spec: names, types, -1 for dynamic axes
    1/model.onnx (+ model.onnx.data)
    warmup/                        data files of the warm-up requests
  <name>/                          the task end to end (Python backend): text in, answers out
    config.pbtxt
    1/model.py, 1/edgeattn.json, 1/tokenizer.json, 1/vendor/edgeattn/...
  <name>_stream/                   models that generate: the answer streamed (decoupled mode)
```
The end-to-end model calls the graph models through Triton (business logic scripting) by
default, or runs the same ONNX files in its own process (``graphs: "in-process"``), which needs
no ONNX Runtime backend. A language model's graph writes its cache in place between steps, which
a stateless graph model cannot hold: its end-to-end models carry the export itself
(``1/export/``: the files of the served precision and their manifest) and always run it in
process. The end-to-end model carries the torch-free part of edgeattn with it, so the server's
Python needs only numpy, onnxruntime and tokenizers (and jinja2 for a chat template). Torch-free.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

import edgeattn
from edgeattn.errors import ConfigError, EdgeattnError
from edgeattn.exporters.rowwise import row_independent
from edgeattn.runtime.families import task_family
from edgeattn.runtime.layout import TRITON_SETTINGS, WEIGHTS, external_data_file
from edgeattn.runtime.manifest import DataFile, FileEntry, Manifest, check_file, read_manifest
from edgeattn.runtime.precisions import FP32, get_precision
from edgeattn.runtime.specs import GraphSpec, graph_spec
from edgeattn.serving.tasks import TRITON_TYPES, ServedTensor, generates, own_task, task_inputs, task_of, task_outputs
from edgeattn.serving.vendoring import vendor

log = logging.getLogger(__name__)

KINDS = ("cpu", "gpu")
ACCELERATORS = ("cuda", "tensorrt")
#: Where the end-to-end model's graphs run.
GRAPH_MODES = ("bls", "in-process")
#: Where an end-to-end model that carries its export keeps it (in its version directory).
CARRIED_EXPORT = "export"
#: Sequence length of the warm-up requests.
WARMUP_LEN = 16
_NUMPY_TYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32}

MODEL_PY = '''"""Triton Python-backend model written by edgeattn: the task end to end (see edgeattn.json)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "vendor"))

from edgeattn.serving.triton_backend import TritonPythonModel  # noqa: E402,F401
'''


@dataclass(frozen=True)
class RepositoryOptions:
    """How the repository serves: which precision, batching, instances and hardware."""

    precision: str = FP32
    max_batch_size: int = 8
    instances: int = 1
    kind: str = "cpu"
    accelerator: str | None = None
    fp16: bool = False
    max_queue_delay_us: int = 1000
    #: let Triton gather concurrent requests into one batch (off: each request runs alone)
    dynamic_batching: bool = True
    #: the model name clients call (default: the export directory's name)
    name: str | None = None
    #: the served task (default: what the model's head says)
    task: str | None = None
    #: where the end-to-end model's graphs run (default: "bls", or "in-process" for graphs that
    #: keep state in place, which only it can run)
    graphs: str | None = None
    #: keep ONNX Runtime's one activation scale per batch in dynamic int8 graphs (faster; a row's
    #: answer then depends on the rows batched with it)
    per_tensor_scales: bool = False

    def check(self) -> None:
        record = get_precision(self.precision)
        if record.engine is not None:
            raise ConfigError(f"{self.precision} is {record.summary}; a Triton repository runs ONNX Runtime's CPU or "
                              "CUDA provider, where those graphs are fp32: serve --precision fp32")  # fmt: skip
        if self.max_batch_size < 0:
            raise ConfigError(f"--max-batch-size must be 0 (no batching) or more, not {self.max_batch_size}")
        if self.instances < 1:
            raise ConfigError(f"--instances must be at least 1, not {self.instances}")
        if self.kind not in KINDS:
            raise ConfigError(f"--kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.accelerator is not None and self.accelerator not in ACCELERATORS:
            raise ConfigError(f"--accelerator must be one of {', '.join(ACCELERATORS)}, not {self.accelerator!r}")
        if self.accelerator is not None and self.kind != "gpu":
            raise ConfigError(f"--accelerator {self.accelerator} needs --kind gpu")
        if self.fp16 and self.accelerator != "tensorrt":
            raise ConfigError(
                "--fp16 sets TensorRT's precision mode and needs --accelerator tensorrt; for float16 graphs on "
                "the CUDA provider export --precision fp16 and serve it with --precision fp16"
            )
        if self.graphs is not None and self.graphs not in GRAPH_MODES:
            raise ConfigError(f"graphs must be one of {', '.join(GRAPH_MODES)}, not {self.graphs!r}")
        if self.name is not None and not _valid_name(self.name):
            raise ConfigError(f"model name {self.name!r} may hold only letters, digits, '.', '_' and '-'")


def _valid_name(name: str) -> bool:
    return bool(name) and all(c.isalnum() or c in "._-" for c in name)


def graphs_for(task: str) -> list[str]:
    """The graphs a served task runs (its family's say)."""
    return list(task_family(task).task_graphs(task))


def carried_path(name: str) -> str:
    """Where the end-to-end model ``name`` keeps the export it runs, relative to the repository."""
    return f"{name}/1/{CARRIED_EXPORT}"


def carries_export(task: str) -> bool:
    """Whether ``task``'s graphs keep state written in place between calls (a language model's
    cache), or its family's served task runs the export itself (a speech model's features and
    decoding settings are the export's), so that only the end-to-end model, running them in its own
    process, can serve them."""
    family = task_family(task)
    own = own_task(task)
    return bool(own is not None and own.carries_export) or any(family.role(g).in_place for g in graphs_for(task))


def graph_mode(task: str, options: RepositoryOptions) -> str:
    """Where the end-to-end model of ``task`` runs its graphs, as ``options`` ask and the task allows."""
    if not carries_export(task):
        return options.graphs or "bls"
    if options.graphs == "bls":
        raise ConfigError(f"a {task_family(task).name} model's graphs run inside the end-to-end model, which "
                          "carries its export (a cache written in place between steps, which Triton's ONNX Runtime "
                          "backend cannot keep between calls, or settings only the export holds): "
                          "drop --graphs bls")  # fmt: skip
    return "in-process"


# -------------------------------------------------------------------------------- config.pbtxt
def _quote(text: str) -> str:
    return json.dumps(text)


def _tensor(name: str, triton_type: str, dims: list[int] | tuple[int, ...], optional: bool = False) -> str:
    extra = " optional: true" if optional else ""
    return f"  {{ name: {_quote(name)} data_type: {triton_type} dims: [ {', '.join(map(str, dims))} ]{extra} }}"


def _block(key: str, items: list[str]) -> str:
    return f"{key} [\n" + ",\n".join(items) + "\n]"


def _dims(axes: tuple[str | int, ...], batched: bool) -> list[int]:
    """A spec tensor's Triton dims: -1 for named (dynamic) axes; the batch axis left to max_batch_size."""
    rest = axes[1:] if batched else axes
    return [-1 if isinstance(a, str) else int(a) for a in rest]


def _common(options: RepositoryOptions, gpu_capable: bool) -> list[str]:
    lines = []
    if options.max_batch_size > 0 and options.dynamic_batching:
        lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {options.max_queue_delay_us} }}")
    kind = "KIND_GPU" if options.kind == "gpu" and gpu_capable else "KIND_CPU"
    lines.append(f"instance_group [ {{ count: {options.instances} kind: {kind} }} ]")
    return lines


def graph_config(model_name: str, spec: GraphSpec, options: RepositoryOptions, warmup: list[str]) -> str:
    """The config.pbtxt of one graph served by the ONNX Runtime backend."""
    batched = options.max_batch_size > 0
    lines = [
        f"name: {_quote(model_name)}",
        'backend: "onnxruntime"',
        f"max_batch_size: {options.max_batch_size}",
        _block("input", [_tensor(t.name, TRITON_TYPES[t.dtype], _dims(t.axes, batched)) for t in spec.inputs]),
        _block("output", [_tensor(t.name, TRITON_TYPES[t.dtype], _dims(t.axes, batched)) for t in spec.outputs]),
        *_common(options, gpu_capable=True),
    ]
    if options.accelerator == "tensorrt":
        mode = "FP16" if options.fp16 else "FP32"
        lines.append(
            'optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" '
            f'parameters {{ key: "precision_mode" value: "{mode}" }} '
            'parameters { key: "max_workspace_size_bytes" value: "1073741824" } } ] } }'
        )
    if warmup:
        lines.append(_block("model_warmup", warmup))
    return "\n".join(lines) + "\n"


def _served(tensors: tuple[ServedTensor, ...], batched: bool) -> list[str]:
    return [_tensor(t.name, t.triton_type, t.dims if batched else (-1, *t.dims), t.optional) for t in tensors]


def task_config(model_name: str, task: str, config: object, options: RepositoryOptions, decoupled: bool) -> str:
    """The config.pbtxt of the end-to-end Python-backend model."""
    graphs = graph_mode(task, options)
    lines = [
        f"name: {_quote(model_name)}",
        'backend: "python"',
        f"max_batch_size: {options.max_batch_size}",
        _block("input", _served(task_inputs(task), options.max_batch_size > 0)),
        _block("output", _served(task_outputs(task, config), options.max_batch_size > 0)),
        *_common(options, gpu_capable=False),
        f'parameters {{ key: "graphs" value: {{ string_value: "{graphs}" }} }}',
    ]
    if decoupled:
        lines.append("model_transaction_policy { decoupled: true }")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- warm-up
def _warmup(spec: GraphSpec, model_dir: Path, batched: bool) -> list[str]:
    """One warm-up request at real shapes (source of WARMUP_LEN tokens, one cached position), its
    mask of ones written under ``model_dir/warmup``."""
    sizes = {"src_len": WARMUP_LEN, "tgt_len": 1, "past_len": 1, "total_len": 2}
    inputs = []
    for t in spec.inputs:
        dims = [sizes.get(a, 1) if isinstance(a, str) else int(a) for a in (t.axes[1:] if batched else t.axes)]
        if not batched:
            dims[0] = 1
        if "mask" in t.name:
            data = np.ones(dims, _NUMPY_TYPES[t.dtype])
            (model_dir / "warmup").mkdir(exist_ok=True)
            (model_dir / "warmup" / t.name).write_bytes(data.tobytes())
            source = f"input_data_file: {_quote(t.name)}"
        elif t.dtype.startswith("float"):
            source = "random_data: true"
        else:
            source = "zero_data: true"
        inputs.append(
            f"    inputs {{ key: {_quote(t.name)} value: {{ data_type: {TRITON_TYPES[t.dtype]} "
            f"dims: [ {', '.join(map(str, dims))} ] {source} }} }}"
        )
    batch = "batch_size: 1\n" if batched else ""
    return ['  {\n    name: "real shapes"\n    ' + batch + "\n".join(inputs) + "\n  }"]


# ------------------------------------------------------------------------------------ the writer
def _copy_graph(src: Path, dst_dir: Path, per_tensor_scales: bool) -> dict[str, int] | None:
    """The graph as one self-contained ONNX file (its weights beside it when they are large),
    whatever layout the export keeps them in. Dynamic int8 graphs get one activation scale per
    row unless ``per_tensor_scales`` (see :mod:`edgeattn.exporters.rowwise`); returns what changed."""
    model = onnx.load(str(src), load_external_data=True)
    changed = None if per_tensor_scales else _rows_alone(model)
    dst_dir.mkdir(parents=True)
    large = model.ByteSize() > (1 << 30)
    onnx.save_model(model, str(dst_dir / "model.onnx"), save_as_external_data=large,
                    all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=1024)  # fmt: skip
    return changed


def _dynamic_int8(model: onnx.ModelProto) -> bool:
    """Whether ``model`` quantises activations on the fly, one scale a tensor (ONNX Runtime's dynamic int8)."""
    return any(n.op_type == "DynamicQuantizeLinear" for n in model.graph.node)


def _rows_alone(model: onnx.ModelProto) -> dict[str, int] | None:
    """``model`` rewritten in place so that each row's dynamic int8 activations get their own scale
    (see :mod:`edgeattn.exporters.rowwise`): what changed, or None where it quantises none."""
    if not _dynamic_int8(model):
        return None
    changed = row_independent(model)
    onnx.checker.check_model(model)
    return changed


@dataclass
class Repository:
    """What :func:`write_repository` wrote."""

    path: Path
    #: the end-to-end model clients call
    name: str
    task: str
    #: every model of the repository, by name: "onnxruntime" or "python"
    models: dict[str, str]


def write_repository(export_dir: str | Path, repo: str | Path, options: RepositoryOptions) -> Repository:
    """Write a Triton model repository serving the export at ``options.precision``."""
    options.check()
    export_dir, repo = Path(export_dir), Path(repo)
    manifest = read_manifest(export_dir)
    config = manifest.config
    task = task_of(config, options.task, manifest.task)
    carried = carries_export(task)
    graph_mode(task, options)  # refuses bls where the graphs keep state
    name = options.name or _clean_name(export_dir.resolve().name)
    needed = graphs_for(task)
    missing = [g for g in needed if g not in manifest.graphs]
    if missing:
        raise EdgeattnError(f"task {task!r} needs the {', '.join(missing)} graph(s), which {export_dir} lacks")
    if manifest.tokenizer is None and not carried:  # a carried export reads its own inputs (images)
        raise EdgeattnError(f"{export_dir} has no tokenizer: the served model takes text")
    if repo.exists() and any(repo.iterdir()):
        raise EdgeattnError(f"{repo} is not empty; choose a new directory for the repository")
    repo.mkdir(parents=True, exist_ok=True)
    models: dict[str, str] = {}
    batched = options.max_batch_size > 0
    graph_models = {}
    checked: set[tuple[str, str]] = set()  # the checkpoint several graphs read is hashed once
    rewritten: dict[str, dict[str, int]] = {}
    for graph in [] if carried else needed:
        entry = manifest.entry(graph, options.precision)
        src = check_file(export_dir, entry, checked)
        model_name = f"{name}_{graph}"
        model_dir = repo / model_name
        changed = _copy_graph(src, model_dir / "1", options.per_tensor_scales)
        if changed:
            rewritten[graph] = changed
        spec = graph_spec(graph, config)
        warmup = _warmup(spec, model_dir, batched)
        (model_dir / "config.pbtxt").write_text(graph_config(model_name, spec, options, warmup), encoding="utf-8")
        models[model_name] = "onnxruntime"
        graph_models[graph] = model_name
    variants = [(name, False)] + ([(f"{name}_stream", True)] if generates(task) else [])
    if carried:  # one copy, which the streaming model reads too
        rewritten = carry_export(export_dir, manifest, options.precision, needed, repo / carried_path(name),
                                 options.per_tensor_scales)  # fmt: skip
    for model_name, decoupled in variants:
        _write_task_model(repo / model_name, export_dir, manifest, task, graph_models, options, decoupled, rewritten,
                          carried_path(name) if carried else None)  # fmt: skip
        (repo / model_name / "config.pbtxt").write_text(
            task_config(model_name, task, config, options, decoupled), encoding="utf-8"
        )
        models[model_name] = "python"
    (repo / "README.md").write_text(_readme(name, task, models, options, bool(rewritten), carried), encoding="utf-8")
    (repo / "kserve.yaml").write_text(_kserve(name), encoding="utf-8")
    log.info("wrote Triton repository %s: %s", repo, ", ".join(models))
    return Repository(repo, name, task, models)


def _clean_name(text: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in text).strip("._-")
    return cleaned or "model"


def _write_task_model(model_dir: Path, export_dir: Path, manifest: Manifest, task: str, graph_models: dict[str, str],
                      options: RepositoryOptions, decoupled: bool, rewritten: dict[str, dict[str, int]],
                      export: str | None = None) -> None:  # fmt: skip
    version = model_dir / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text(MODEL_PY, encoding="utf-8")
    if manifest.tokenizer is not None:
        shutil.copy2(check_file(export_dir, manifest.tokenizer), version / "tokenizer.json")
    settings = {
        "task": task,
        "precision": options.precision,
        "config": manifest.config.to_dict(),
        "labels": manifest.labels,
        "pooling": None if manifest.pooling is None else {"mode": manifest.pooling.mode,
                                                          "normalize": manifest.pooling.normalize},
        "graph_models": graph_models,
        #: the export the model runs itself, relative to the repository (graphs that keep state)
        "export": export,
        "decoupled": decoupled,
        "row_independent_int8": rewritten,
        "edgeattn_version": edgeattn.__version__,
    }  # fmt: skip
    (version / TRITON_SETTINGS).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    vendor(version / "vendor")  # what the backend imports, found from its imports


def carry_export(export_dir: Path, manifest: Manifest, precision: str, graphs: list[str], dst: Path,
                 per_tensor_scales: bool) -> dict[str, dict[str, int]]:  # fmt: skip
    """The export's files that serving ``graphs`` at ``precision`` reads (each checked against its
    sha256), written to ``dst`` with a manifest trimmed to them. Dynamic int8 graphs get one
    activation scale per row unless ``per_tensor_scales`` (their manifest entries describe the
    rewritten files); returns what changed, by graph."""
    carried = Manifest.from_json(manifest.to_json())  # a copy to trim
    carried.graphs = {g: carried.graphs[g] for g in graphs}
    dst.mkdir(parents=True)
    checked: set[tuple[str, str]] = set()
    copied: set[str] = set()
    rewritten: dict[str, dict[str, int]] = {}

    def copy(entry: FileEntry | DataFile) -> None:
        if entry.file not in copied:
            shutil.copy2(check_file(export_dir, entry, checked), dst / entry.file)
            copied.add(entry.file)

    for graph, base in carried.graphs.items():
        entry = base.at(precision)  # ManifestError where the export lacks it
        base.precisions = {} if entry is base else {precision: entry}
        src = check_file(export_dir, entry, checked)
        if not per_tensor_scales and _dynamic_int8(onnx.load(str(src), load_external_data=False)):
            model = onnx.load(str(src), load_external_data=True)  # the weights only where they are rewritten
            rewritten[graph] = _rows_alone(model) or {}
            path = dst / entry.file
            onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=external_data_file(entry.file), size_threshold=1024)  # fmt: skip
            fresh = FileEntry.describe(path)
            entry.sha256, entry.bytes, entry.external_data = fresh.sha256, fresh.bytes, fresh.external_data
            entry.quantization = {**(entry.quantization or {}), "activation_scales": "per row (edgeattn triton)"}
            copied.update([entry.file, *(d.file for d in fresh.external_data)])
            continue
        copy(entry)
        for data in entry.external_data:
            copy(data)
    if not any(d.file == WEIGHTS for g in carried.graphs.values() for d in g.at(precision).external_data):
        carried.weights = None  # no carried graph reads the checkpoint
    carried.gates = {p: gate for p, gate in carried.gates.items() if p == precision}
    for extra in (carried.tokenizer, carried.chat_template, carried.weights, carried.settings):
        if extra is not None:
            copy(extra)
    carried.write(dst)
    return rewritten


def _readme(name: str, task: str, models: dict[str, str], options: RepositoryOptions, rows: bool,
            carried: bool) -> str:  # fmt: skip
    listing = "\n".join(f"- `{m}` ({backend})" for m, backend in models.items())
    own = own_task(task)
    sends, example = "`text` (strings, one per row)", '"your text"'
    if own is not None:
        outputs = ", ".join(t.name for t in own.outputs(None))
        sends, example = own.sends, own.example
    else:
        outputs = {"classify": "label, score, probabilities", "tag": "entities (JSON)", "embed": "embedding",
                   "encode": "last_hidden_state, attention_mask", "generate": "answer, tokens",
                   "complete": "answer, tokens"}[task]  # fmt: skip
    stream = (
        f"\n`{name}_stream` streams the answer as it grows (decoupled mode: call it over gRPC streaming, "
        "one request, one response per piece of text).\n"
        if generates(task)
        else ""
    )
    if task == "complete":
        stream += CHAT
    where = CARRIED.format(name=name, precision=options.precision) if carried else IN_PROCESS.format(name=name)
    packages = "numpy onnxruntime tokenizers" + (" jinja2" if carried and own is None else "")
    packages += "".join(f" {p}" for p in (own.packages if own is not None else ()))
    first = own.inputs[0].name if own is not None else "text"
    return f"""# Triton repository for `{name}` ({task}, {options.precision})

Written by edgeattn {edgeattn.__version__}. Models:

{listing}

Clients call `{name}` with {sends} and get {outputs}.{stream}
{where}
{ROWS if rows else ""}
## Start it
```bash
docker run --rm -p 8000:8000 -p 8001:8001 -p 8002:8002 -v $PWD:/models \\
  nvcr.io/nvidia/tritonserver:24.08-py3 \\
  bash -c "pip install {packages} && tritonserver --model-repository /models"
```
The Python-backend model carries edgeattn's torch-free runtime (`1/vendor`); the server's Python needs
{packages.replace(" ", ", ")}.

## Call it
```python
import numpy as np, tritonclient.http as http
client = http.InferenceServerClient("localhost:8000")
text = http.InferInput("{first}", [1, 1], "BYTES")
text.set_data_from_numpy(np.array([[{example}]], dtype=object))
print(client.infer("{name}", [text]).as_numpy("{outputs.split(",")[0]}"))
```

## KServe
`kserve.yaml` is an `InferenceService` for this repository: copy the repository to the storage it
names (`storageUri`) and `kubectl apply -f kserve.yaml`.
"""


IN_PROCESS = """The graph models serve the ONNX graphs alone (their config names every tensor; -1 marks a dynamic axis).
Without the ONNX Runtime backend (or to keep everything in one process) set the `graphs` parameter of
`{name}/config.pbtxt` to `"in-process"` and start only it:
`tritonserver --model-repository /models --model-control-mode explicit --load-model {name}`."""

CARRIED = """The end-to-end model runs the graphs itself (a language model's graph writes its cache in
place between decoding steps, which a stateless graph model cannot keep; a speech model's features
and decoding settings are its export's): each end-to-end model (and each of its instances) loads the
export into its own process from `{name}/1/export/` (the export's files at {precision}, each checked
against the sha256 its trimmed manifest records)."""

CHAT = """
A request may also send `chat` (BOOL: each text is a conversation, a JSON list of
`{"role": ..., "content": ...}` messages or one user message, rendered by the model's chat template),
`stop` (BYTES: a JSON list of stop strings, or one), and the decoding settings `max_new_tokens`,
`strategy`, `num_beams`, `temperature`, `top_k`, `top_p`, `seed`, `repetition_penalty`.
"""

ROWS = """
The int8 graphs quantise each row's activations with that row's own scale (ONNX Runtime's dynamic
int8 takes one scale for the whole batch), so an answer does not change with the requests Triton
batches it with; `edgeattn triton --per-tensor-scales` keeps the faster batch-wide scale.
"""


def _kserve(name: str) -> str:
    service = name.lower().replace("_", "-").replace(".", "-")
    return f"""apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata:
  name: {service}
spec:
  predictor:
    model:
      modelFormat:
        name: triton
      runtimeVersion: 24.08-py3
      storageUri: s3://your-bucket/{name}-repository
      args: ["--strict-model-config=false"]
      resources:
        limits:
          cpu: "2"
          memory: 4Gi
"""
