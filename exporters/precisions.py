"""Reduced-precision variants of an export's graphs, each gated against eager float32.

Files sit beside the fp32 ones as ``<graph>.<precision>.onnx`` and are listed in the manifest
under each graph's ``precisions``; the gate's figures go under ``gates``. A precision that
misses its thresholds fails the export unless degraded results are allowed, in which case it is
marked ``degraded``. When int8 misses, the nodes whose quantisation hurts most (each measured
quantised alone) are kept in float32, as few as needed to pass, and named in the manifest.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from edgeattn.errors import ExportError
from edgeattn.exporters.fusion import (
    FusedForm,
    can_fuse,
    expected_attention_blocks,
    fused_attention_count,
    fused_copy,
    operator_counts,
    optimize_fused,
)
from edgeattn.exporters.gate import GateResult, HeldOut, evaluate, teacher_forced
from edgeattn.exporters.onnx_export import PROTOBUF_LIMIT, export_graph, finalize, save_checked
from edgeattn.exporters.quantize import (
    PRECISIONS,
    convert_fp16,
    quantizable_nodes,
    quantize_int4,
    quantize_int8_dynamic,
    quantize_int8_static,
)
from edgeattn.exporters.sampling import sample_inputs
from edgeattn.model import EncoderModel, Seq2SeqTransformer
from edgeattn.runtime.manifest import sha256_file, write_manifest
from edgeattn.runtime.model import ExportedModel
from edgeattn.runtime.specs import graph_spec

log = logging.getLogger(__name__)

Model = Seq2SeqTransformer | EncoderModel
#: The fused graph each precision is made from: packed QKV where int8 dynamic quantises Attention to
#: QAttention, separate projections where static and weight-only quantisers reach them;
#: SkipLayerNormalization only for fp16, the GPU precision (see :class:`FusedForm`).
SOURCE_FORM = {
    "fp32-opt": FusedForm(),
    "int8": FusedForm(),
    "fp16": FusedForm(skip_layer_norm=True),
    "int8-static": FusedForm(packed=False),
    "int4": FusedForm(packed=False),
}

#: Static int8 calibration: batches, and rows per batch when sequences are drawn from the vocabulary.
CALIBRATION_BATCHES = 8
CALIBRATION_ROWS = 8


@dataclass
class PrecisionOptions:
    """How reduced precisions are made and judged."""

    calibration_method: str = "minmax"
    #: static int8 calibration sequences (token ids); None draws them from the model's vocabulary
    calibration_data: list[list[int]] | None = None
    #: where ``calibration_data`` came from, recorded in the manifest
    calibration_source: str = ""
    allow_degraded: bool = False
    new_tokens: int = 16
    external_threshold: int = PROTOBUF_LIMIT


def parse_precisions(value: list[str] | None) -> list[str]:
    """Requested precisions in canonical order, fp32 always first; unknown ones refused."""
    requested = [p.strip() for p in (value or []) if p.strip()]
    for p in requested:
        if p not in PRECISIONS:
            raise ExportError(f"unknown precision {p!r}; choose from {', '.join(PRECISIONS)}")
    return [p for p in PRECISIONS if p == "fp32" or p in requested]


def _entry(path: Path, precision: str, extra: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"file": path.name, "sha256": sha256_file(path), "bytes": path.stat().st_size,
                             "precision": precision, **extra}  # fmt: skip
    data = path.with_name(path.name + ".data")
    if data.exists():
        entry["external_data"] = [{"file": data.name, "sha256": sha256_file(data), "bytes": data.stat().st_size}]
        entry["bytes"] += data.stat().st_size
    return entry


class PrecisionBuilder:
    """Writes and gates reduced-precision graphs inside an export directory under construction."""

    def __init__(self, export_dir: Path, model: Model, manifest: dict[str, Any], heldout: HeldOut,
                 options: PrecisionOptions) -> None:  # fmt: skip
        self.dir = export_dir
        self.model = model.eval()
        self.manifest = manifest
        self.heldout = heldout
        self.options = options
        self.graphs = list(manifest["graphs"])
        self.gates: dict[str, GateResult] = {}
        self._calibration_feeds: dict[str, list[dict[str, np.ndarray]]] = {}
        self._scratch = Path(tempfile.mkdtemp(prefix="edgeattn-prec-", dir=export_dir.parent))

    def close(self) -> None:
        shutil.rmtree(self._scratch, ignore_errors=True)

    # ------------------------------------------------------------------ files
    def _path(self, graph: str, precision: str) -> Path:
        return self.dir / f"{graph}.{precision}.onnx"

    def _record(self, graph: str, precision: str, path: Path, extra: dict[str, Any]) -> None:
        self.manifest["graphs"][graph].setdefault("precisions", {})[precision] = _entry(path, precision, extra)

    def _stamp(self, graph: str, precision: str, path: Path) -> None:
        """Metadata, checker and shape inference for a converted file (rewritten in place)."""
        proto = onnx.load(str(path), load_external_data=True)
        finalize(proto, self.model.config, graph_spec(graph, self.model.config), precision)
        path.with_name(path.name + ".data").unlink(missing_ok=True)
        save_checked(proto, path, self.options.external_threshold)

    def source(self, graph: str, precision: str) -> Path:
        """The graph ``precision`` starts from: the fused graph of its :data:`SOURCE_FORM` when
        this model fuses, else fp32. A fused graph made only as a source stays out of the export."""
        form = SOURCE_FORM[precision]
        if form == SOURCE_FORM["fp32-opt"] and "fp32-opt" in self.manifest["graphs"][graph].get("precisions", {}):
            return self._path(graph, "fp32-opt")
        if can_fuse(self.model)[0]:
            fused = self._scratch / f"{graph}.fp32-opt-{form.tag}.onnx"
            return fused if fused.exists() else self._fused(graph, fused, form)
        return self.dir / self.manifest["graphs"][graph]["file"]

    # -------------------------------------------------------------- fp32-opt
    def _fused(self, graph: str, dst: Path, form: FusedForm) -> Path:
        raw = self._scratch / f"{graph}.fused.onnx"
        has_attention = expected_attention_blocks(graph, self.model) > 0
        export_graph(fused_copy(self.model, form.packed), graph, raw,
                     opset=min(self.manifest["graphs"][graph]["opset"], 20),
                     external_threshold=self.options.external_threshold, fused=has_attention)  # fmt: skip
        proto = optimize_fused(raw, self.model, form)
        finalize(proto, self.model.config, graph_spec(graph, self.model.config), "fp32-opt")
        save_checked(proto, dst, self.options.external_threshold)
        counts = operator_counts(proto)
        expected = expected_attention_blocks(graph, self.model)
        if fused_attention_count(counts) != expected:
            raise ExportError(
                f"{graph}: {fused_attention_count(counts)} of {expected} attention blocks fused; all must be"
            )
        return dst

    def build_fp32_opt(self) -> None:
        ok, reason = can_fuse(self.model)
        for graph in self.graphs:
            path = self._path(graph, "fp32-opt")
            if ok:
                self._fused(graph, path, SOURCE_FORM["fp32-opt"])
            else:
                shutil.copyfile(self.dir / self.manifest["graphs"][graph]["file"], path)
                self._stamp(graph, "fp32-opt", path)
            proto = onnx.load(str(path), load_external_data=False)
            self._record(graph, "fp32-opt", path, {
                "fused_operators": operator_counts(proto),
                "attention_blocks": expected_attention_blocks(graph, self.model),
                "attention_fused": fused_attention_count(operator_counts(proto)),
                **({} if ok else {"not_fused_because": reason}),
            })  # fmt: skip

    # ------------------------------------------------------------ quantised
    def _convert(self, precision: str, graph: str, exclude: list[str] | None = None) -> dict[str, Any]:
        src, dst = self.source(graph, precision), self._path(graph, precision)
        if precision == "int8":
            info = quantize_int8_dynamic(src, dst, exclude=exclude)
        elif precision == "int8-static":
            info = self._quantize_static(graph, src, dst, exclude)
        elif precision == "fp16":
            info = convert_fp16(src, dst)
        elif precision == "int4":
            info = quantize_int4(src, dst)
        else:  # pragma: no cover - guarded by parse_precisions
            raise ExportError(f"no converter for {precision!r}")
        self._stamp(graph, precision, dst)
        self._record(graph, precision, dst, {"quantization": info, "source": src.name})
        return info

    def calibration(self, graph: str, batches: int = CALIBRATION_BATCHES) -> list[dict[str, np.ndarray]]:
        """Representative feeds for ``graph`` in up to ``batches`` batches: from the user's
        calibration sequences when given, else drawn from the model's own vocabulary and length
        range (other sequences than the gate's)."""
        from edgeattn.exporters.gate import heldout_sources

        c = self.model.config
        if self.options.calibration_data:
            calib = heldout_sources(c, texts=self.options.calibration_data)
            batches = min(batches, len(self.options.calibration_data))
        else:
            calib = heldout_sources(c, n=CALIBRATION_ROWS * batches, seed=1234)
        chunks = np.array_split(np.arange(calib.ids.shape[0]), batches)
        feeds: list[dict[str, np.ndarray]] = []
        rng = np.random.default_rng(7)
        for rows in chunks:
            ids, mask = calib.ids[rows], calib.mask[rows]
            width = int(mask.sum(axis=1).max())
            ids, mask = ids[:, :width], mask[:, :width]
            if graph == "encoder":
                feeds.append({"input_ids": ids, "attention_mask": mask})
            elif graph == "attention":
                spec = graph_spec("attention", c)
                feeds.append(sample_inputs(spec, c, {"batch": len(rows), "tgt_len": width, "src_len": width}, rng))
            elif graph == "cross_kv":
                with torch.no_grad():
                    hidden = self.model.encode(torch.from_numpy(ids), torch.from_numpy(mask))
                feeds.append({"encoder_hidden_states": hidden.numpy()})
            else:
                assert isinstance(self.model, Seq2SeqTransformer)
                feeds.append(teacher_forced(self.model, ids, mask, self.options.new_tokens).feeds)
        return feeds

    def _quantize_static(self, graph: str, src: Path, dst: Path, exclude: list[str] | None) -> dict[str, Any]:
        """Static int8 of ``src`` into ``dst``, calibrated on this graph's feeds (made once per graph:
        the sensitivity search quantises again for every node)."""
        if graph not in self._calibration_feeds:
            self._calibration_feeds[graph] = self.calibration(graph)
        info = quantize_int8_static(src, dst, self._calibration_feeds[graph], self.options.calibration_method, exclude)
        return {**info, "calibration_data": self._calibration_source()}

    def _calibration_source(self) -> str:
        data = self.options.calibration_data
        if not data:
            drawn = CALIBRATION_ROWS * CALIBRATION_BATCHES
            return f"drawn from the model's vocabulary and length range ({drawn} sequences)"
        return f"{self.options.calibration_source or 'user sequences'} ({len(data)} sequences)"

    def _refresh(self, precision: str) -> ExportedModel:
        write_manifest(self.dir, self.manifest)
        return ExportedModel(self.dir, providers=["CPUExecutionProvider"], precision=precision)

    def _gate(self, precision: str, graphs: list[str] | None = None) -> GateResult:
        return evaluate(self.model, self._refresh(precision), precision, self.heldout, self.options.new_tokens, graphs)

    def build(self, precision: str, progress: Callable[[str], None] | None = None) -> GateResult:
        """Write ``precision`` for every graph, gate it, and, for int8, exclude sensitive nodes."""
        if precision == "fp32-opt":
            self.build_fp32_opt()
        else:
            for graph in self.graphs:
                self._convert(precision, graph)
        result = self._gate(precision)
        if not result.passed and precision in ("int8", "int8-static"):
            result = self._exclude_sensitive(precision, result)
        degraded = not result.passed
        for graph in self.graphs:
            self.manifest["graphs"][graph]["precisions"][precision]["degraded"] = degraded
        self.manifest.setdefault("gates", {})[precision] = {**result.to_dict(), "degraded": degraded}
        self.gates[precision] = result
        if degraded and not self.options.allow_degraded:
            raise ExportError(
                f"{precision} graphs miss their accuracy thresholds ({'; '.join(result.failures)}); "
                "pass --allow-degraded to keep them marked degraded\n" + result.table()
            )
        return result

    def _failing_graphs(self, result: GateResult) -> list[str]:
        failing = {f.split()[0] for f in result.failures}
        if "generation" in failing:
            failing |= {"encoder", "cross_kv", "decoder"}
        return [g for g in self.graphs if g in failing]

    def _exclude_sensitive(self, precision: str, result: GateResult) -> GateResult:
        """Keep in float32 the fewest most-sensitive nodes of each failing graph that make it pass."""
        for graph in self._failing_graphs(result):
            nodes = quantizable_nodes(self.source(graph, precision))
            scores: dict[str, float] = {}
            for node in nodes:  # each node quantised alone: how much does the graph's metric drop?
                self._convert_only(precision, graph, node)
                alone = self._gate(precision, [graph])
                scores[node] = sum(1.0 - v for v in alone.metrics.get(graph, {}).values())
            ranked = sorted(nodes, key=lambda n: -scores[n])
            for k in range(1, len(ranked) + 1):
                self._convert(precision, graph, exclude=ranked[:k])
                trial = self._gate(precision, [graph])
                if trial.passed:
                    log.info("%s %s: kept %d node(s) in float32: %s", precision, graph, k, ranked[:k])
                    break
        return self._gate(precision)

    def _convert_only(self, precision: str, graph: str, node: str) -> None:
        src, dst = self.source(graph, precision), self._path(graph, precision)
        others = [n for n in quantizable_nodes(src) if n != node]
        if precision == "int8":
            info = quantize_int8_dynamic(src, dst, exclude=others)
        else:
            info = self._quantize_static(graph, src, dst, others)
        self._stamp(graph, precision, dst)
        self._record(graph, precision, dst, {"quantization": info, "source": src.name})
