"""The mobile target: an export's graphs as ONNX Runtime's ORT format for a phone or a small board,
with the operator config of a reduced-operator build, proven to load and to answer as the export
does before anything is written.

```
<out>/
  bundle.json                              what the bundle holds: files and their sha256, every graph's
                                           inputs and outputs, the config, the checks and their figures
  <graph>[.<precision>].ort                one file per graph and precision (ORT format, no external data)
  required_operators_and_types.config      for ``build.sh --minimal_build --include_ops_by_config``
  tokenizer.json, chat_template.json,      as the export holds them (settings.json: a speech model's
  settings.json                            features and decoding settings)
```

The ORT files come from ONNX Runtime's own converter (``convert_onnx_models_to_ort``: optimised
once, for ARM, in the fixed style, so the device applies no optimisation of its own). A config
taken from those files alone can miss a kernel that ONNX Runtime's optimiser asks for when the
device loads a file with optimisation on (onnxruntime#23018), so each file is also loaded here
with optimisation off and on (x86's NCHWc layout left out, as on ARM), what the optimiser leaves
is read back, and the config is written over all of them; the operators only the optimiser asked
for are named in ``bundle.json``. Every file then runs beside the export's own ONNX graph at the
same precision on inputs of sizes never traced (batch 1 and a padded batch of 3): float32 within
``1e-4 + 1e-5·|ref|``; a reduced precision's kernels are the same but fused once for ARM, which can
round an activation to the next quantisation step, so there every output row's cosine to the
export's must be at least 0.999 (a MiniLM-shaped int8 encoder: 0.999986, 1.9e-2 apart at most),
far inside what the accuracy gate allows against float32. Torch-free (onnx and ONNX Runtime's
tools).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgeattn import __version__
from edgeattn.errors import ExportError
from edgeattn.exporters.outdir import check_output_dir, move_into_place
from edgeattn.exporters.sampling import sample_inputs
from edgeattn.host import loggers_at
from edgeattn.runtime.families import family_of
from edgeattn.runtime.layout import graph_file, partial_prefix
from edgeattn.runtime.manifest import Manifest, check_file, read_manifest, sha256_file
from edgeattn.runtime.precisions import FP32, PRECISIONS
from edgeattn.runtime.session import CPU, create_session
from edgeattn.runtime.specs import graph_spec
from edgeattn.tables import table_lines

log = logging.getLogger(__name__)

TARGET = "mobile"
BUNDLE = "bundle.json"
CONFIG = "required_operators_and_types.config"
#: FlatBuffers (the ORT format) address at most 2 GB, and an ORT file holds its weights itself
ORT_LIMIT = (1 << 31) - 1
#: The size ONNX Runtime's CI holds an Android arm64 minimal build with no operators under
#: (bytes); each kernel the config names adds to it (ONNX Runtime publishes no figure per kernel)
MINIMAL_BUILD_BYTES = 1_595_392
ATOL, RTOL = 1e-4, 1e-5
#: the worst output row's cosine a reduced-precision ORT file must keep to the export's graph
REDUCED_COSINE = 0.999
#: ONNX Runtime's tools log each config they write at INFO on loggers of their own
_TOOL_LOGGERS = ("ort_format_model.utils", "convert_onnx_models_to_ort")
#: ONNX Runtime's layout transformer for x86 (NCHWc); it never runs on ARM
X86_ONLY_OPTIMIZERS = ["NchwcTransformer"]


@dataclass
class OrtFile:
    """One ORT-format file of the bundle and what was proven of it."""

    file: str
    graph: str
    precision: str
    sha256: str
    bytes: int
    #: kernels it needs (``domain;opset;op``), as converted and as loaded with optimisation off and on
    operators: list[str]
    #: those only the optimiser asked for when the file was loaded (in the config too)
    runtime_added: list[str]
    #: against the export's ONNX graph at the same precision
    max_abs: float
    worst_cosine: float
    cases: int
    passed: bool


@dataclass
class MobileBundle:
    """What :func:`package_mobile` wrote."""

    path: Path
    files: list[OrtFile] = field(default_factory=list)
    #: every kernel the config names
    operators: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def table(self) -> str:
        """A plain-text table: each file, its size, kernels, and its answers against the export."""
        rows = [("file", "MB", "kernels", "added at load", "max abs err", "worst cosine", "result")]
        for f in self.files:
            rows.append((f.file, f"{f.bytes / 1e6:.2f}", str(len(f.operators)), str(len(f.runtime_added)),
                         f"{f.max_abs:.2e}", f"{f.worst_cosine:.6f}", "ok" if f.passed else "FAIL"))  # fmt: skip
        lines = table_lines(rows)
        lines.append(f"config: {len(self.operators)} kernels in {CONFIG}; files {self.total_bytes / 1e6:.2f} MB; a "
                     f"minimal arm64 build starts under {MINIMAL_BUILD_BYTES / 1e6:.2f} MB before kernels")  # fmt: skip
        return "\n".join(lines)


def cpu_precisions(manifest: Manifest, asked: list[str] | None = None) -> list[str]:
    """The precisions to package: those asked for (each held by the export and made for the CPU
    provider), else every such one the export holds."""
    held = [FP32, *dict.fromkeys(p for g in manifest.graphs.values() for p in g.precisions)]

    def runs_on_cpu(name: str) -> bool:
        record = PRECISIONS.get(name)
        return record is not None and record.provider in ("cpu", "any") and record.engine is None

    if asked is None:
        return [p for p in held if runs_on_cpu(p)]
    for name in asked:
        if name not in held:
            raise ExportError(f"the export holds no {name!r} graphs (it has {', '.join(held)}); add them with "
                              f"edgeattn quantize")  # fmt: skip
        if not runs_on_cpu(name):
            record = PRECISIONS.get(name)
            what = record.summary if record else "a precision this edgeattn does not know"
            raise ExportError(f"{name} is {what}; the target's ONNX Runtime runs on the CPU: package fp32, "
                              "int8, int8-static or int4")  # fmt: skip
    return list(dict.fromkeys(asked))


def package_mobile(export_dir: str | Path, out_dir: str | Path, precisions: list[str] | None = None,
                   force: bool = False, progress: bool = False) -> MobileBundle:  # fmt: skip
    """Write the mobile bundle of ``export_dir`` (every graph at ``precisions``, default every
    CPU precision it holds) to ``out_dir``; raises :class:`ExportError` when a graph cannot be
    converted, loaded or does not answer as the export does, leaving ``out_dir`` as it was."""
    export_dir, out_dir = Path(export_dir), Path(out_dir)
    manifest = read_manifest(export_dir)
    chosen = cpu_precisions(manifest, precisions)
    check_output_dir(out_dir, force)
    parent = out_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=partial_prefix(out_dir.name), dir=parent))
    try:
        with tempfile.TemporaryDirectory(prefix="edgeattn-mobile-") as work_name, _quiet_tools():
            work = Path(work_name)
            staged = _stage(export_dir, manifest, chosen, work / "onnx")
            _convert(work / "onnx", tmp)
            bundle = MobileBundle(out_dir)
            loaded: dict[str, list[Path]] = {}
            jobs = list(staged.items())
            for (graph, precision), source in _bar(jobs, progress):
                ort_path = tmp / graph_file(graph, precision).replace(".onnx", ".ort")
                loaded[ort_path.name] = _load_both_ways(ort_path, work / "loaded")
                parity = _parity(manifest, graph, precision, source, ort_path)
                bundle.files.append(OrtFile(ort_path.name, graph, precision, sha256_file(ort_path),
                                            ort_path.stat().st_size, [], [], **parity))  # fmt: skip
            _write_config(tmp, bundle, loaded)
            for extra in (manifest.tokenizer, manifest.chat_template, manifest.settings):
                if extra is not None:
                    shutil.copy2(check_file(export_dir, extra), tmp / extra.file)
            (tmp / BUNDLE).write_text(json.dumps(_describe(bundle, manifest, export_dir), indent=2) + "\n",
                                      encoding="utf-8")  # fmt: skip
        failed = [f for f in bundle.files if not f.passed]
        if failed:
            raise ExportError("the ORT files do not answer as the export does:\n" + bundle.table())
        move_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("wrote the mobile bundle %s:\n%s", out_dir, bundle.table())
    return bundle


def _bar(jobs: list[Any], progress: bool) -> Any:
    """``jobs`` with a progress bar where asked and tqdm is installed (it comes with the export extra)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return jobs
    return tqdm(jobs, desc="mobile", unit="file", disable=not progress)


def _quiet_tools() -> contextlib.AbstractContextManager[None]:
    """ONNX Runtime's tools' INFO lines held back unless edgeattn's own log is at DEBUG."""
    import onnxruntime.tools.convert_onnx_models_to_ort  # noqa: F401 - its loggers set their level on import

    return loggers_at(_TOOL_LOGGERS, logging.DEBUG if log.isEnabledFor(logging.DEBUG) else logging.WARNING)


def _stage(export_dir: Path, manifest: Manifest, precisions: list[str], work: Path) -> dict[tuple[str, str], Path]:
    """Every graph at every precision as one self-contained ONNX file (its weights inside, as the
    ORT format keeps them), each source file checked against its sha256."""
    work.mkdir(parents=True)
    checked: set[tuple[str, str]] = set()
    staged = {}
    for graph in manifest.graphs:
        for precision in precisions:
            if precision != FP32 and precision not in manifest.graphs[graph].precisions:
                log.info("no %s %s graph in the export; left out", precision, graph)
                continue
            src = check_file(export_dir, manifest.entry(graph, precision), checked)
            model = onnx.load(str(src), load_external_data=True)
            if model.ByteSize() > ORT_LIMIT:
                raise ExportError(f"the {precision} {graph} graph is {model.ByteSize() / 1e9:.2f} GB; an ORT-format "
                                  "file holds its weights itself and at most 2 GB: package a smaller precision "
                                  "(int8, int4)")  # fmt: skip
            rewritten = eight_bit_tables(model)
            if rewritten:
                log.info("%s %s: %d 4-bit embedding table(s) kept as 8-bit values with the same scales (an ORT "
                         "file holds no 4-bit tensor)", graph, precision, rewritten)  # fmt: skip
            path = work / graph_file(graph, precision)
            onnx.save_model(model, str(path))
            staged[(graph, precision)] = path
    return staged


def eight_bit_tables(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s GatherBlockQuantized nodes over signed 4-bit tables (which ONNX Runtime
    1.32 writes into an ORT file and then cannot load: "Unsupported tensor data type") into
    standard operators over the same values held as int8: the rows gathered, cast, scaled by their
    blocks' scales (gathered too); the same products as the 4-bit node's. Returns how many."""
    from onnx import TensorProto, helper, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    count = 0
    for node in list(model.graph.node):
        if node.op_type != "GatherBlockQuantized" or node.input[0] not in inits:
            continue
        table = inits[node.input[0]]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        zero_points = len(node.input) > 3 and node.input[3]
        if table.data_type != TensorProto.INT4 or zero_points or attrs.get("gather_axis", 0) != 0 \
                or attrs.get("quantize_axis", 1) != 1 or len(table.dims) != 2:  # fmt: skip
            raise ExportError(f"{node.name}: an ORT file holds no 4-bit tensor, and only signed 4-bit tables "
                              "gathered by row with no zero points are rewritten to 8 bits: package int8")  # fmt: skip
        values = numpy_helper.to_array(table).astype(np.int8)
        block, width = int(attrs.get("block_size", 128)), int(table.dims[1])
        base = f"{node.name or node.output[0]}_int8"
        model.graph.initializer.remove(table)
        model.graph.initializer.extend([
            numpy_helper.from_array(values, f"{base}_table"),
            numpy_helper.from_array(np.array([width // block, block], np.int64), f"{base}_blocks"),
            numpy_helper.from_array(np.array([width], np.int64), f"{base}_width"),
        ])  # fmt: skip
        indices, scales = node.input[1], node.input[2]
        where = list(model.graph.node).index(node)
        model.graph.node.remove(node)
        nodes = [
            helper.make_node("Gather", [f"{base}_table", indices], [f"{base}_rows"], axis=0),
            helper.make_node("Cast", [f"{base}_rows"], [f"{base}_float"], to=TensorProto.FLOAT),
            helper.make_node("Shape", [indices], [f"{base}_lead"]),
            helper.make_node("Concat", [f"{base}_lead", f"{base}_blocks"], [f"{base}_by_block"], axis=0),
            helper.make_node("Reshape", [f"{base}_float", f"{base}_by_block"], [f"{base}_blocked"]),
            helper.make_node("Gather", [scales, indices], [f"{base}_scales"], axis=0),
            helper.make_node("Unsqueeze", [f"{base}_scales", f"{base}_last"], [f"{base}_scale"]),
            helper.make_node("Mul", [f"{base}_blocked", f"{base}_scale"], [f"{base}_scaled"]),
            helper.make_node("Concat", [f"{base}_lead", f"{base}_width"], [f"{base}_shape"], axis=0),
            helper.make_node("Reshape", [f"{base}_scaled", f"{base}_shape"], [node.output[0]]),
        ]  # fmt: skip
        model.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), f"{base}_last"))
        for k, new in enumerate(nodes):
            new.name = f"{base}_{new.op_type}_{k}"
            model.graph.node.insert(where + k, new)
        count += 1
    return count


def _convert(onnx_dir: Path, out: Path) -> None:
    """ONNX Runtime's converter over ``onnx_dir``: ORT files (fixed optimisation, for ARM) and the
    config with types, into ``out`` (its printing goes to the debug log)."""
    from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort

    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            convert_onnx_models_to_ort(onnx_dir, output_dir=out, optimization_styles=[OptimizationStyle.Fixed],
                                       target_platform="arm", enable_type_reduction=True)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the converter raises whatever ONNX Runtime raised
        raise ExportError(f"ONNX Runtime's ORT converter failed: {exc}") from exc
    finally:
        log.debug("%s", said.getvalue())


def _load_both_ways(ort_path: Path, work: Path) -> list[Path]:
    """``ort_path`` loaded with optimisation off and on as a device loads it; the graphs each load
    leaves, saved as ORT files under ``work`` (what kernels a session asks for)."""
    import onnxruntime as ort

    work.mkdir(exist_ok=True)
    saved = []
    for level, label in ((ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "off"),
                         (ort.GraphOptimizationLevel.ORT_ENABLE_ALL, "on")):  # fmt: skip
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        options.log_severity_level = 3
        options.add_session_config_entry("session.save_model_format", "ORT")
        options.add_session_config_entry("session.qdqisint8allowed", "1")  # as on ARM, as the converter did
        if label == "on":  # a file with saved runtime optimisations replays them (ours hold none: fixed style)
            options.add_session_config_entry("session.enable_saved_runtime_optimizations", "1")
        target = work / f"{ort_path.stem}.{label}.ort"
        options.optimized_model_filepath = str(target)
        try:
            ort.InferenceSession(str(ort_path), options, providers=[CPU], disabled_optimizers=X86_ONLY_OPTIMIZERS)
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime's own message names the node and kernel
            raise ExportError(f"{ort_path.name} does not load in ONNX Runtime with optimisation {label}: "
                              f"{exc}") from exc  # fmt: skip
        saved.append(target)
    return saved


def _operators(models: list[Path], work: Path) -> set[str]:
    """The kernels (``domain;opset;op``) ``models`` need, read by ONNX Runtime's own tools."""
    from onnxruntime.tools.ort_format_model import create_config_from_models
    from onnxruntime.tools.reduced_build_config_parser import parse_config

    config = work / "operators.config"
    create_config_from_models(models, config, False)
    required, _ = parse_config(str(config), False)
    return {f"{domain};{opset};{op}" for domain, by_opset in required.items() for opset, ops in by_opset.items()
            for op in ops}  # fmt: skip


def _write_config(out: Path, bundle: MobileBundle, loaded: dict[str, list[Path]]) -> None:
    """The config over the converted files and what each load left (with types), replacing the
    converter's; each file's kernels and those only its loads asked for, recorded."""
    from onnxruntime.tools.ort_format_model import create_config_from_models

    everything = [out / f.file for f in bundle.files] + [p for paths in loaded.values() for p in paths]
    create_config_from_models(everything, out / CONFIG, True)
    text = (out / CONFIG).read_text(encoding="utf-8").splitlines()
    kept = [line for line in text if not line.startswith("#")]  # the generated comment names temporary paths
    header = f"# written by edgeattn {__version__} from the bundle's files, as converted and as loaded with optimisation off and on"  # noqa: E501
    (out / CONFIG).write_text("\n".join([header, *kept]) + "\n", encoding="utf-8")
    with tempfile.TemporaryDirectory() as scratch:
        bundle.operators = sorted(_operators(everything, Path(scratch)))
        for f in bundle.files:
            own = _operators([out / f.file], Path(scratch))
            at_load = _operators(loaded[f.file], Path(scratch))
            f.operators = sorted(own | at_load)
            f.runtime_added = sorted(at_load - own)
        configured = _configured(out / CONFIG)
        missing = sorted(set(bundle.operators) - configured)
        if missing:  # the config is written over every file; a gap here is a bug to report
            raise ExportError(f"{CONFIG} leaves out kernels the files need: {', '.join(missing)}")


def _configured(config: Path) -> set[str]:
    """The kernels a config names (``domain;opset;op``)."""
    from onnxruntime.tools.reduced_build_config_parser import parse_config

    required, _ = parse_config(str(config), True)
    return {f"{domain};{opset};{op}" for domain, by_opset in required.items() for opset, ops in by_opset.items()
            for op in ops}  # fmt: skip


def _parity(manifest: Manifest, graph: str, precision: str, source: Path, ort_path: Path) -> dict[str, Any]:
    """The ORT file against the export's ONNX graph at the same precision, on fresh inputs of sizes
    never traced: worst absolute error, worst cosine of an output row, pass/fail (float32 within
    ``ATOL + RTOL·|ref|``, a reduced precision at ``REDUCED_COSINE`` or more)."""
    config = manifest.config
    spec = graph_spec(graph, config)
    sizes = family_of(config).role(graph).sizes(config)[:3]
    reference, device = create_session(source), create_session(ort_path)
    record = PRECISIONS.get(precision)
    exact = record is not None and record.float32_parity
    rng = np.random.default_rng(7)
    pairs = []
    for case in sizes:
        feeds = sample_inputs(spec, config, case, rng)
        names = spec.output_names
        pairs += zip(reference.run(names, feeds), device.run(names, feeds), strict=True)
    return {**compare_outputs(pairs, exact), "cases": len(sizes)}


def compare_outputs(pairs: list[tuple[np.ndarray, np.ndarray]], exact: bool) -> dict[str, Any]:
    """(expected, actual) outputs compared: worst absolute error, worst row cosine, and whether all
    hold (integers equal; float32 within ``ATOL + RTOL·|expected|`` where ``exact``, else a worst
    cosine of ``REDUCED_COSINE``; all finite)."""
    worst_abs, worst_cos, ok = 0.0, 1.0, True
    for expected, actual in pairs:
        if not np.issubdtype(expected.dtype, np.floating):
            ok = ok and np.array_equal(expected, actual)
            continue
        diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
        worst_abs = max(worst_abs, float(diff.max(initial=0.0)))
        worst_cos = min(worst_cos, worst_cosine(expected, actual))
        close = bool(np.all(diff <= ATOL + RTOL * np.abs(expected))) if exact else worst_cos >= REDUCED_COSINE
        ok = ok and close and bool(np.isfinite(actual).all())
    return {"max_abs": worst_abs, "worst_cosine": worst_cos, "passed": ok}


def worst_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The lowest cosine between matching rows (last axis) of ``a`` and ``b``; rows zero on both
    sides (a cache's unwritten slots) agree."""
    a2, b2 = a.reshape(-1, a.shape[-1]).astype(np.float64), b.reshape(-1, b.shape[-1]).astype(np.float64)
    norms = np.linalg.norm(a2, axis=1) * np.linalg.norm(b2, axis=1)
    used = norms > 0
    if not used.any():
        return 1.0
    return float(((a2 * b2).sum(1)[used] / norms[used]).min())


def _describe(bundle: MobileBundle, manifest: Manifest, export_dir: Path) -> dict[str, Any]:
    """``bundle.json``: the files, every graph's inputs and outputs, the config, the checks."""
    return {
        "target": TARGET,
        "edgeattn_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "export": {"path": str(export_dir.resolve()), "source": manifest.source, "family": manifest.family_name,
                   "task": manifest.task, "architecture": manifest.architecture, "created": manifest.created},
        "config": manifest.config.to_dict(),
        "labels": manifest.labels,
        "stop_ids": manifest.stop_ids,
        "tokenizer": manifest.tokenizer.file if manifest.tokenizer else None,
        "chat_template": manifest.chat_template.file if manifest.chat_template else None,
        "settings": manifest.settings.file if manifest.settings else None,
        "graphs": {name: {"inputs": [asdict(t) for t in entry.inputs], "outputs": [asdict(t) for t in entry.outputs]}
                   for name, entry in manifest.graphs.items()},  # fmt: skip
        "files": [asdict(f) for f in bundle.files],
        "operator_config": {"file": CONFIG, "kernels": len(bundle.operators),
                            "build": f"build.sh --minimal_build --include_ops_by_config {CONFIG} "
                                     "--enable_reduced_operator_type_support",
                            "minimal_arm64_build_bytes_before_kernels": MINIMAL_BUILD_BYTES},  # fmt: skip
        "parity": {"against": "the export's ONNX graph at the same precision, ONNX Runtime CPU",
                   "float32": {"atol": ATOL, "rtol": RTOL},
                   "reduced": {"worst_row_cosine": REDUCED_COSINE}},  # fmt: skip
        "total_bytes": bundle.total_bytes,
    }
