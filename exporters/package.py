"""A whole export directory: graphs, weights and ``manifest.json``, written atomically.

Everything is written to a temporary directory beside the target, verified, and only then
moved into place, so a crash or a failed verification never leaves a half-written export.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import torch

from edgeattn import __version__
from edgeattn.errors import ExportError, VerificationError
from edgeattn.exporters.gate import GateResult, heldout_sources
from edgeattn.exporters.onnx_export import DEFAULT_OPSET, PROTOBUF_LIMIT, check_opset, export_graph
from edgeattn.exporters.precisions import PrecisionBuilder, PrecisionOptions, parse_precisions
from edgeattn.exporters.verify import WEIGHTS_NAME, VerifyReport, verify_graphs
from edgeattn.model import EncoderModel, Seq2SeqTransformer
from edgeattn.runtime.manifest import FORMAT_VERSION, sha256_file, write_manifest
from edgeattn.runtime.model import ExportedModel
from edgeattn.runtime.specs import resolve_graphs
from edgeattn.runtime.tokenizer import TOKENIZER_NAME, WordTokenizer
from edgeattn.weights import save_weights

log = logging.getLogger(__name__)


@dataclass
class ExportResult:
    """Where the export went, what it holds, and its verification (None with verify off)."""

    out_dir: Path
    graphs: list[str]
    manifest: dict[str, Any]
    report: VerifyReport | None
    seconds: float
    gates: dict[str, GateResult] = field(default_factory=dict)


def check_output_dir(out_dir: Path, force: bool) -> None:
    """Refuse an output directory that cannot be written, or that holds files, unless ``force``."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"output {out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ExportError(f"output directory {out_dir} is not empty; choose another or pass --force to replace it")
    parent = out_dir.resolve().parent
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ExportError(f"cannot write the output directory {out_dir}: {probe} is not writable")


def _file_entry(export_dir: Path, files: list[Path]) -> dict[str, Any]:
    main, *data = files
    entry: dict[str, Any] = {"file": main.name, "sha256": sha256_file(main), "bytes": main.stat().st_size}
    if data:
        entry["external_data"] = [{"file": d.name, "sha256": sha256_file(d), "bytes": d.stat().st_size} for d in data]
    return entry


def export_model(
    model: Seq2SeqTransformer | EncoderModel,
    out_dir: str | Path,
    graphs: list[str] | None = None,
    opset: int = DEFAULT_OPSET,
    verify: bool = True,
    force: bool = False,
    progress: bool = False,
    external_threshold: int = PROTOBUF_LIMIT,
    source: str | None = None,
    tokenizer: WordTokenizer | None = None,
    precisions: list[str] | None = None,
    precision_options: PrecisionOptions | None = None,
    heldout_texts: list[list[int]] | None = None,
    task: str | None = None,
) -> ExportResult:
    """Export ``model``'s graphs to ``out_dir`` with a manifest, verified unless ``verify=False``.

    ``precisions`` adds reduced-precision files (fp32-opt, int8, int8-static, fp16, int4) beside
    the fp32 ones, each gated against eager float32 on held-out data (``heldout_texts``, token id
    lists, or random sequences from the model's vocabulary).

    Raises :class:`ExportError` for unusable arguments, a failed export or a failed accuracy gate
    and :class:`VerificationError` when ONNX Runtime disagrees with eager PyTorch; in every case
    ``out_dir`` is left as it was.
    """
    from tqdm import tqdm

    start = time.perf_counter()
    out_dir = Path(out_dir)
    check_opset(opset)
    names = resolve_graphs(graphs, model.config)
    wanted = parse_precisions(precisions)
    check_output_dir(out_dir, force)
    model = model.eval()
    parent = out_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=parent))
    try:
        manifest: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "edgeattn_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "source": source or "random weights",
            "task": task,
            "exporter": {
                "torch": torch.__version__,
                "onnx": onnx.__version__,
                "method": "torch.onnx TorchScript (dynamic_axes)"
                if opset <= 20
                else "torch.onnx dynamo (dynamic_shapes)",
            },
            "config": model.config.to_dict(),
            "weights": None,
            "tokenizer": None,
            "graphs": {},
        }
        if tokenizer is not None:
            tokenizer.save(tmp / TOKENIZER_NAME)
            manifest["tokenizer"] = _file_entry(tmp, [tmp / TOKENIZER_NAME])
        weights = save_weights(model, tmp / WEIGHTS_NAME)
        (tmp / "config.json").unlink(missing_ok=True)  # the config lives in the manifest
        manifest["weights"] = _file_entry(tmp, [weights])
        for name in tqdm(names, desc="export", unit="graph", disable=not progress, leave=False):
            path = tmp / f"{name}.onnx"
            spec = export_graph(model, name, path, opset=opset, external_threshold=external_threshold)
            files = [path] + (
                [path.with_name(path.name + ".data")] if path.with_name(path.name + ".data").exists() else []
            )
            manifest["graphs"][name] = {
                **_file_entry(tmp, files),
                "role": name,
                "opset": opset,
                "precision": "fp32",
                **spec.to_dict(),
                "parity": None,
            }
        write_manifest(tmp, manifest)
        report = None
        if verify:
            report = verify_graphs(model, ExportedModel(tmp), progress=progress)
            for name, figures in report.summary().items():
                manifest["graphs"][name]["parity"] = figures
            if report.greedy is not None:
                manifest["greedy_parity"] = {**vars(report.greedy), "passed": report.greedy.passed}
            write_manifest(tmp, manifest)
            if not report.passed:
                raise VerificationError("exported graphs disagree with eager PyTorch:\n" + report.table())
        gates = build_precisions(tmp, model, manifest, wanted[1:], precision_options, heldout_texts, progress)
        write_manifest(tmp, manifest)
        _move_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(out_dir, names, manifest, report, time.perf_counter() - start, gates)


def build_precisions(
    export_dir: Path,
    model: Seq2SeqTransformer | EncoderModel,
    manifest: dict[str, Any],
    precisions: list[str],
    options: PrecisionOptions | None = None,
    heldout_texts: list[list[int]] | None = None,
    progress: bool = False,
) -> dict[str, GateResult]:
    """Write and gate each reduced precision into an export directory under construction;
    fp32-opt also gets the float32 parity check. Updates ``manifest`` in place."""
    from tqdm import tqdm

    if not precisions:
        return {}
    builder = PrecisionBuilder(
        export_dir, model, manifest, heldout_sources(model.config, texts=heldout_texts), options or PrecisionOptions()
    )
    try:
        for precision in tqdm(precisions, desc="precisions", unit="precision", disable=not progress, leave=False):
            if precision == "fp32":
                continue
            write_manifest(export_dir, manifest)
            builder.build(precision)
            if precision == "fp32-opt":
                write_manifest(export_dir, manifest)
                report = verify_graphs(model, ExportedModel(export_dir, precision="fp32-opt"), progress=progress)
                for name, figures in report.summary().items():
                    manifest["graphs"][name]["precisions"]["fp32-opt"]["parity"] = figures
                if not report.passed:
                    raise VerificationError("fp32-opt graphs disagree with eager PyTorch:\n" + report.table())
    finally:
        builder.close()
    return builder.gates


def quantize_export(
    export_dir: str | Path,
    precisions: list[str],
    options: PrecisionOptions | None = None,
    heldout_texts: list[list[int]] | None = None,
    progress: bool = False,
) -> dict[str, GateResult]:
    """Add reduced precisions to an existing export (atomically: a copy is built, gated, and
    swapped in), using the weights the export holds as the float32 reference."""
    from edgeattn.runtime.manifest import check_file, manifest_config, read_manifest
    from edgeattn.weights import load_model

    export_dir = Path(export_dir)
    manifest = read_manifest(export_dir)
    if not manifest.get("weights"):
        raise ExportError(f"{export_dir} holds no weights; re-export it to add precisions")
    wanted = [p for p in parse_precisions(precisions) if p != "fp32"]
    if not wanted:
        raise ExportError("name at least one precision besides fp32")
    model = load_model(check_file(export_dir, manifest["weights"]), manifest_config(manifest))
    tmp = Path(tempfile.mkdtemp(prefix=f".{export_dir.name}.partial-", dir=export_dir.resolve().parent))
    try:
        shutil.copytree(export_dir, tmp, dirs_exist_ok=True)
        for entry in manifest["graphs"].values():
            for precision in wanted:
                entry.get("precisions", {}).pop(precision, None)
        gates = build_precisions(tmp, model, manifest, wanted, options, heldout_texts, progress)
        write_manifest(tmp, manifest)
        _move_into_place(tmp, export_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return gates


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` by the finished ``tmp`` with renames on the same filesystem."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    for f in tmp.iterdir():
        os.chmod(f, 0o666 & ~umask)
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.replace(out_dir, old)
        try:
            os.replace(tmp, out_dir)
        except OSError:
            os.replace(old, out_dir)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out_dir)
