"""A whole export directory: graphs, weights and ``manifest.json``, written atomically.

Everything is written to a temporary directory beside the target, verified, and only then
moved into place, so a crash or a failed verification never leaves a half-written export.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from edgeattn import __version__
from edgeattn.config import ModelConfig
from edgeattn.errors import ExportError, VerificationError
from edgeattn.exporters.compact import CheckpointIndex, compact_data_file, data_locations, share_weights
from edgeattn.exporters.gate import GateResult, HeldOut, heldout_sources
from edgeattn.exporters.lock import writer_lock
from edgeattn.exporters.onnx_export import DEFAULT_OPSET, PROTOBUF_LIMIT, check_opset, export_graph, save_checked
from edgeattn.exporters.outdir import check_output_dir, move_into_place
from edgeattn.exporters.precision_builds import PrecisionBuilder, PrecisionOptions
from edgeattn.exporters.verify import VerifyReport, verify_graphs
from edgeattn.host import release_freed_memory
from edgeattn.model import TransformerModel
from edgeattn.phases import phase
from edgeattn.runtime.exported_model import ExportedModel
from edgeattn.runtime.families import family_of, resolve_graphs
from edgeattn.runtime.families.causal.chat import ChatTemplate
from edgeattn.runtime.layout import (
    CHAT_TEMPLATE,
    CHECKPOINT_CONFIG,
    SETTINGS,
    TOKENIZER,
    WEIGHTS,
    external_data_file,
    graph_file,
    partial_prefix,
    previous_prefix,
)
from edgeattn.runtime.manifest import (
    EmbeddingPooling,
    FileEntry,
    GraphEntry,
    GreedyParity,
    ImportCheck,
    Manifest,
    Parity,
)
from edgeattn.runtime.precisions import FP32, parse_precisions
from edgeattn.runtime.tokenizer import TextTokenizer, WordTokenizer
from edgeattn.weights import map_onto, save_weights

log = logging.getLogger(__name__)


@dataclass
class ExportResult:
    """Where the export went, what it holds, and its verification (None with verify off)."""

    out_dir: Path
    graphs: list[str]
    manifest: Manifest
    report: VerifyReport | None
    seconds: float
    gates: dict[str, GateResult] = field(default_factory=dict)


def export_model(
    model: TransformerModel,
    out_dir: str | Path,
    graphs: list[str] | None = None,
    opset: int = DEFAULT_OPSET,
    verify: bool = True,
    force: bool = False,
    progress: bool = False,
    external_threshold: int = PROTOBUF_LIMIT,
    source: str | None = None,
    tokenizer: WordTokenizer | TextTokenizer | None = None,
    precisions: list[str] | None = None,
    precision_options: PrecisionOptions | None = None,
    heldout_texts: list[list[int]] | None = None,
    task: str | None = None,
    architecture: str | None = None,
    labels: list[str] | None = None,
    pooling: EmbeddingPooling | None = None,
    source_folder: str | Path | None = None,
    compact: bool = True,
    chat_template: ChatTemplate | None = None,
    stop_ids: list[int] | None = None,
    settings: dict[str, Any] | None = None,
    import_check: ImportCheck | None = None,
) -> ExportResult:
    """Export ``model``'s graphs to ``out_dir`` with a manifest, verified unless ``verify=False``.

    ``precisions`` adds optimised and reduced-precision files (see ``edgeattn.runtime.precisions``)
    beside the fp32 ones, each gated against eager float32 on held-out data (``heldout_texts``,
    token id lists, or random sequences from the model's vocabulary). ``architecture``, ``labels``,
    ``pooling`` and ``source_folder`` describe an imported checkpoint in the manifest, and for a
    language model ``chat_template`` and ``stop_ids`` (the tokens that end its answers); ``settings``
    are what a family's runtime reads besides the graphs (written as ``settings.json``);
    ``import_check`` how an imported folder was checked against transformers. ``compact``
    (the default) keeps the graphs' float32 weights in the export's checkpoint, each stored once
    (see :mod:`edgeattn.exporters.compact`); without it each graph holds its own.

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
    check_gated(model.config, wanted)
    check_output_dir(out_dir, force)
    model = model.eval()
    parent = out_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    with writer_lock(out_dir):
        recover_interrupted(out_dir)
        tmp = Path(tempfile.mkdtemp(prefix=partial_prefix(out_dir.name), dir=parent))
        try:
            method = "torch.onnx TorchScript (dynamic_axes)" if opset <= 20 else "torch.onnx dynamo (dynamic_shapes)"
            manifest = Manifest(
                edgeattn_version=__version__,
                created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                source=source or "random weights",
                task=task,
                family=family_of(model.config).name,
                exporter={"torch": torch.__version__, "onnx": onnx.__version__, "method": method},
                config=model.config,
                architecture=architecture,
                labels=labels,
                pooling=pooling,
                source_folder=None if source_folder is None else str(Path(source_folder).resolve()),
                stop_ids=stop_ids,
                import_check=import_check,
            )
            if tokenizer is not None:
                tokenizer.save(tmp / TOKENIZER)
                manifest.tokenizer = FileEntry.describe(tmp / TOKENIZER)
            if chat_template is not None:
                chat_template.save(tmp / CHAT_TEMPLATE)
                manifest.chat_template = FileEntry.describe(tmp / CHAT_TEMPLATE)
            if settings is not None:
                (tmp / SETTINGS).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n", encoding="utf-8")
                manifest.settings = FileEntry.describe(tmp / SETTINGS)
            with phase("writing the weights"):
                weights = save_weights(model, tmp / WEIGHTS)
                (tmp / CHECKPOINT_CONFIG).unlink(missing_ok=True)  # the config lives in the manifest
                manifest.weights = FileEntry.describe(weights)
                index = CheckpointIndex(weights)
                map_onto(model, weights)  # the model's weights read from the file from here on, not held twice
                release_freed_memory()
            for name in tqdm(names, desc="export", unit="graph", disable=not progress, leave=False):
                path = tmp / graph_file(name)
                with phase(f"exporting the {name} graph"):
                    spec = export_graph(model, name, path, opset=opset, external_threshold=external_threshold,
                                        checkpoint=index if compact else None)  # fmt: skip
                    shared = compact and share_file_weights(path, index, external_threshold)
                release_freed_memory()
                manifest.graphs[name] = GraphEntry.of_spec(path, spec, opset, [manifest.weights.as_data()] if shared
                                                           else None)  # fmt: skip
            manifest.write(tmp)
            report = None
            if verify:
                # float32 weights left mapped, not repacked into memory of the process's own
                with phase("verifying against eager PyTorch"):
                    report = verify_graphs(model, ExportedModel(tmp, prepacking=False), progress=progress)
                release_freed_memory()
                for name, figures in report.summary().items():
                    manifest.graphs[name].parity = Parity(**figures)
                if report.greedy is not None:
                    manifest.greedy_parity = GreedyParity(**vars(report.greedy), passed=report.greedy.passed)
                manifest.write(tmp)
                if not report.passed:
                    raise VerificationError("exported graphs disagree with eager PyTorch:\n" + report.table())
            gates = build_precisions(tmp, model, manifest, wanted[1:], precision_options, heldout_texts, progress)
            manifest.write(tmp)
            move_into_place(tmp, out_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return ExportResult(out_dir, names, manifest, report, time.perf_counter() - start, gates)


def check_gated(config: ModelConfig, precisions: list[str]) -> None:
    """Refuse precisions besides fp32 for a family whose graphs have no accuracy gate yet."""
    family = family_of(config)
    if family.ungated and any(p != FP32 for p in precisions):
        raise ExportError(f"a {family.name} model's precisions besides fp32 need an accuracy gate for its "
                          f"{', '.join(family.ungated)} graphs, which edgeattn does not have yet; export fp32")


def share_file_weights(path: Path, index: CheckpointIndex, external_threshold: int = PROTOBUF_LIMIT) -> bool:
    """Rewrite the graph at ``path`` to keep its weights in the checkpoint ``index`` describes
    (see :mod:`edgeattn.exporters.compact`), checked again; True when it keeps any there (as
    rewritten, or as written pointing at it)."""
    proto = onnx.load(str(path), load_external_data=False)  # each external weight read as it is compared
    if not share_weights(proto, index, path.parent):
        own = path.with_name(external_data_file(path.name))
        if own.name not in data_locations(proto):  # every weight written pointing at the checkpoint
            own.unlink(missing_ok=True)
        return index.path.name in data_locations(proto)
    compact_data_file(proto, path.parent, external_data_file(path.name))  # what the checkpoint does not hold
    save_checked(proto, path, external_threshold)
    return True


def build_precisions(
    export_dir: Path,
    model: TransformerModel,
    manifest: Manifest,
    precisions: list[str],
    options: PrecisionOptions | None = None,
    heldout_texts: list[list[int]] | None = None,
    progress: bool = False,
) -> dict[str, GateResult]:
    """Make, gate and write each of ``precisions`` into an export directory under construction,
    recording every graph's new variant and each gate in ``manifest`` (not written here)."""
    from tqdm import tqdm

    gates: dict[str, GateResult] = {}
    wanted = [p for p in precisions if p != FP32]
    if not wanted:
        return gates
    check_gated(model.config, wanted)
    options = options or PrecisionOptions()
    if options.heldout_features is not None:  # audio windows or images, as the family's reader made them
        items = len(options.heldout_features)
        prompt = np.array(options.heldout_prompt or [model.config.bos_id], np.int64)
        heldout = HeldOut(np.tile(prompt, (items, 1)), np.ones((items, len(prompt)), np.int64),
                          f"{options.heldout_source or 'held-out inputs'} ({items} inputs)",
                          features=options.heldout_features)  # fmt: skip
    elif options.heldout_data:
        heldout = heldout_sources(model.config, texts=options.heldout_data, source=options.heldout_source,
                                  max_tokens=options.gate_tokens)  # fmt: skip
        shared = {tuple(s) for s in options.heldout_data} & {tuple(s) for s in options.calibration_data or []}
        if shared:
            log.warning("%d held-out sequence(s) are also calibration sequences: the gate is not blind to them",
                        len(shared))  # fmt: skip
    else:
        heldout = heldout_sources(model.config, texts=heldout_texts, source="the task's held-out inputs")
    with PrecisionBuilder(model, manifest.graphs, export_dir, heldout, options, progress) as builder:
        for precision in tqdm(wanted, desc="precisions", unit="precision", disable=not progress, leave=False):
            build = builder.build(precision)
            release_freed_memory()  # the gate's sessions and arrays, before the graphs are written
            with phase(f"{precision}: writing"):
                committed = builder.commit(build, export_dir)
            for graph, variant in committed.items():
                manifest.graphs[graph].precisions[precision] = variant
            release_freed_memory()
            if build.gate is not None:
                manifest.gates[precision] = build.gate.to_record(build.degraded)
                gates[precision] = build.gate
            del build, committed  # its graphs (serialised) are written: not held through the next precision
            release_freed_memory()
    return gates


def quantize_export(
    export_dir: str | Path,
    precisions: list[str],
    options: PrecisionOptions | None = None,
    heldout_texts: list[list[int]] | None = None,
    progress: bool = False,
) -> dict[str, GateResult]:
    """Add reduced precisions to an existing export (atomically: a copy is built, gated, and
    swapped in), using the weights the export holds as the float32 reference. A second export or
    quantize of the same directory while this one runs is refused (see :mod:`.lock`)."""
    from edgeattn.runtime.manifest import read_manifest

    export_dir = Path(export_dir)
    read_manifest(export_dir)  # a directory that is no export is said before any lock is taken
    with writer_lock(export_dir):  # read, build and swap under one lock: a second writer loses nothing
        recover_interrupted(export_dir)
        return _quantize_locked(export_dir, precisions, options, heldout_texts, progress)


def _quantize_locked(
    export_dir: Path,
    precisions: list[str],
    options: PrecisionOptions | None,
    heldout_texts: list[list[int]] | None,
    progress: bool,
) -> dict[str, GateResult]:
    from edgeattn.runtime.manifest import check_file, read_manifest
    from edgeattn.weights import load_model

    manifest = read_manifest(export_dir)
    if manifest.weights is None:
        raise ExportError(f"{export_dir} holds no weights; re-export it to add precisions")
    wanted = [p for p in parse_precisions(precisions) if p != FP32]
    if not wanted:
        raise ExportError("name at least one precision besides fp32")
    model = load_model(check_file(export_dir, manifest.weights), manifest.config)
    tmp = Path(tempfile.mkdtemp(prefix=partial_prefix(export_dir.name), dir=export_dir.resolve().parent))
    try:
        shutil.copytree(export_dir, tmp, dirs_exist_ok=True)
        for entry in manifest.graphs.values():
            for precision in wanted:
                entry.precisions.pop(precision, None)
        gates = build_precisions(tmp, model, manifest, wanted, options, heldout_texts, progress)
        manifest.write(tmp)
        move_into_place(tmp, export_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return gates


def recover_interrupted(out_dir: Path) -> list[str]:
    """What a killed writer of ``out_dir`` left beside it, put right (call under the writer lock,
    so no other writer is at work): an export killed between the two renames of its swap left
    the previous export under its ``.old-PID`` name and no ``out_dir``, which is renamed back;
    half-built directories are removed. Returns what was done, in words (also logged)."""
    parent = out_dir.resolve().parent
    done: list[str] = []
    olds = sorted(parent.glob(previous_prefix(out_dir.name) + "*"), key=lambda p: p.stat().st_mtime)
    if olds and not out_dir.exists() and (olds[-1] / "manifest.json").is_file():
        os.replace(olds.pop(), out_dir)
        done.append(f"restored the previous export into {out_dir} (a writer was killed while swapping it)")
    for leftover in [*olds, *parent.glob(partial_prefix(out_dir.name) + "*")]:
        shutil.rmtree(leftover, ignore_errors=True)
        done.append(f"removed {leftover.name}, left by a writer that did not finish")
    for line in done:
        log.warning("%s", line)
    return done
