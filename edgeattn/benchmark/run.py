"""One benchmark run as ``edgeattn bench`` and ``benchmarks/latency.py`` make it: export (or open)
a model, time eager PyTorch and every exported precision side by side, write JSON and a plot."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeattn.benchmark.latency import LatencyReport, bench_latency, eager_variants, onnx_variants, plot_report
from edgeattn.errors import EdgeattnError
from edgeattn.runtime.precisions import FP32, PRECISIONS, get_precision
from edgeattn.runtime.session import CPU, CUDA

log = logging.getLogger(__name__)


@dataclass
class BenchOptions:
    batches: tuple[int, ...] = (1, 8)
    seqs: tuple[int, ...] = (32, 128, 512)
    threads: int = 2
    providers: tuple[str, ...] = (CPU,)
    precisions: tuple[str, ...] = tuple(PRECISIONS)
    repeats: int = 20
    warmup: int = 3
    eager: bool = True
    generation: bool = False
    peers: bool = True
    #: explicit (batch, seq) shapes instead of the batches x seqs grid
    shapes: tuple[tuple[int, int], ...] | None = None
    #: IO binding for ONNX Runtime variants (None: on for CUDA, off for the CPU)
    io_binding: bool | None = None
    #: CUDA-graph variants on the CUDA provider
    cuda_graph: bool = True
    #: TF32 for float32 matrix products on the CUDA provider
    tf32: bool = False

    def grid(self) -> list[tuple[int, int]]:
        """The shapes to time: ``shapes`` when given, else every batch with every sequence length."""
        return list(self.shapes) if self.shapes else [(b, s) for b in self.batches for s in self.seqs]


def run_benchmark(
    export_dir: str | Path | None = None,
    preset: str | None = None,
    options: BenchOptions | None = None,
    json_path: str | Path | None = None,
    plot_path: str | Path | None = None,
    progress: bool = False,
) -> tuple[LatencyReport, Any]:
    """Benchmark an export directory, or a preset exported on the fly (default: the demo).

    Returns the latency report and, with ``options.generation``, the generation report.
    """
    from edgeattn.runtime.manifest import check_file, read_manifest
    from edgeattn.weights import load_model

    options = options or BenchOptions()
    for name in options.precisions:
        get_precision(name)
    on_cpu = CPU in options.providers
    with tempfile.TemporaryDirectory(prefix="edgeattn-bench-") as scratch:
        if export_dir is None:
            from edgeattn.exporters.package import export_model
            from edgeattn.exporters.precisions import PrecisionOptions
            from edgeattn.sources import resolve_model

            source = resolve_model(preset)
            export_dir = Path(scratch) / "export"
            wanted = [p for p in options.precisions if p != FP32]
            log.info("exporting %s with %s", preset or "demo", ", ".join(options.precisions))
            export_model(
                source.model, export_dir, verify=False, precisions=wanted, heldout_texts=source.heldout,
                precision_options=PrecisionOptions(allow_degraded=True), tokenizer=source.tokenizer, task=source.task,
                progress=progress,
            )  # fmt: skip
        export_dir = Path(export_dir)
        manifest = read_manifest(export_dir)
        config = manifest.config
        variants, skipped = [], {}
        if options.eager:
            if manifest.weights is not None:
                weights = check_file(export_dir, manifest.weights)
                model = load_model(weights, config)
                variants, skipped = eager_variants(model, options.threads, weights=weights, cpu=on_cpu,
                                                   cuda=CUDA in options.providers)  # fmt: skip
            else:
                skipped["eager"] = "the export holds no weights"
        onnx_vars, onnx_skipped = onnx_variants(
            export_dir, list(options.precisions), list(options.providers), options.threads,
            io_binding=options.io_binding, cuda_graph=options.cuda_graph, tf32=options.tf32,
        )  # fmt: skip
        variants += onnx_vars
        skipped.update(onnx_skipped)
        if options.peers and on_cpu:
            from edgeattn.benchmark.peers import bert_peer_variants

            try:
                peer_vars, peer_skipped = bert_peer_variants(config, options.threads, Path(scratch))
            except Exception as exc:  # noqa: BLE001 - a peer that cannot be built must not end the benchmark
                peer_vars, peer_skipped = [], {"peer HF BERT": f"cannot be built: {exc}"}
            variants += peer_vars
            skipped.update(peer_skipped)
        shapes = []
        for b, s in options.grid():
            if s <= config.max_len:
                shapes.append((b, s))
            else:
                skipped[f"{b}x{s}"] = f"longer than the model's max_len {config.max_len}"
        if not shapes:
            raise EdgeattnError(f"no shape to time: every sequence length is over the model's max_len {config.max_len}")
        if not variants:
            raise EdgeattnError(f"nothing to time: {'; '.join(f'{k}: {v}' for k, v in skipped.items())}")
        report = bench_latency(variants, config, shapes, options.threads, options.repeats, options.warmup,
                               progress=progress, skipped=skipped, floors=on_cpu)  # fmt: skip
        report.accuracy = manifest.to_json()["gates"]
        generation = None
        if options.generation and "decoder" in manifest.graphs:
            from edgeattn.benchmark.generation import bench_generation

            positions = tuple(p for p in (16, 64, 256) if p < config.max_len)
            generation = bench_generation(export_dir, positions, threads=options.threads, repeats=options.repeats,
                                          src_len=min(128, config.max_len))  # fmt: skip
    if json_path is not None:
        data = report.to_dict()
        if generation is not None:
            data["generation"] = generation.to_dict()
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        import json

        Path(json_path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    if plot_path is not None:
        plot_report(report, plot_path)
    return report, generation
