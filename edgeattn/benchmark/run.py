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
from edgeattn.host import has_bf16
from edgeattn.runtime.families import get_family, resolve
from edgeattn.runtime.precisions import FP32, get_precision, graph_precisions, standard_operator_precisions
from edgeattn.runtime.providers import OPENVINO, Provider, installed_plugins, openvino_usable, provider_name
from edgeattn.runtime.session import CPU, CUDA

log = logging.getLogger(__name__)

#: Exported precisions timed on OpenVINO: its own float32 (or bf16) and the standard QDQ int8 graph
#: (the other precisions hold ONNX Runtime's own operators, which OpenVINO hands back to it).
OPENVINO_PRECISIONS = tuple(standard_operator_precisions())


def openvino_providers() -> list[Provider]:
    """OpenVINO with float32 inference, and with bf16 where the CPU has bf16 instructions."""
    providers: list[Provider] = [(OPENVINO, {"precision_hint": "f32"})]
    if has_bf16():
        providers.append((OPENVINO, {"precision_hint": "bf16"}))
    return providers


@dataclass
class BenchOptions:
    batches: tuple[int, ...] = (1, 8)
    seqs: tuple[int, ...] = (32, 128, 512)
    threads: int = 2
    #: provider names, or (name, options); plugin providers too (see edgeattn.runtime.providers)
    providers: tuple[Provider, ...] = (CPU,)
    precisions: tuple[str, ...] = tuple(graph_precisions())
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
    #: the Hugging Face folder an imported export came from (default: the one its manifest names)
    hf_folder: str | Path | None = None
    #: each variant's peak memory, alone in a fresh process
    memory: bool = True
    #: what int8-static's encoder is made from when a preset is exported for the run ("auto",
    #: "fused", or "plain" for standard operators: what OpenVINO runs whole; see
    #: PrecisionOptions.static_form)
    static_form: str = "auto"
    #: OpenVINO variants on CPU runs where OpenVINO is installed (built into onnxruntime-openvino, or
    #: the onnxruntime-ep-openvino plugin, which offers Intel CPUs only: elsewhere they are skipped)
    openvino: bool = True

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
    names = [provider_name(p) for p in options.providers]
    on_cpu = CPU in names
    with tempfile.TemporaryDirectory(prefix="edgeattn-bench-") as scratch:
        if export_dir is None:
            from edgeattn.exporters.export import export_model
            from edgeattn.exporters.precision_builds import PrecisionOptions
            from edgeattn.sources import resolve_model

            source = resolve_model(preset)
            export_dir = Path(scratch) / "export"
            wanted = [p for p in options.precisions if p != FP32]
            log.info("exporting %s with %s", preset or "demo", ", ".join(options.precisions))
            export_model(
                source.model, export_dir, verify=False, precisions=wanted, heldout_texts=source.heldout,
                precision_options=PrecisionOptions(allow_degraded=True, static_form=options.static_form),
                tokenizer=source.tokenizer, task=source.task,
                progress=progress,
            )  # fmt: skip
        export_dir = Path(export_dir)
        manifest = read_manifest(export_dir)
        config = manifest.config
        family = get_family(manifest.family_name)
        if not family.benched:
            raise EdgeattnError(f"edgeattn bench times exports over token inputs; a {family.name} export's timing is "
                                f"not built yet (time edgeattn run on its inputs)")  # fmt: skip
        variants, skipped = [], {}
        if options.eager:
            if manifest.weights is not None:
                weights = check_file(export_dir, manifest.weights)
                model = load_model(weights, config)
                variants, skipped = eager_variants(model, options.threads, weights=weights, cpu=on_cpu,
                                                   cuda=CUDA in names)  # fmt: skip
            else:
                skipped["eager"] = "the export holds no weights"
        onnx_vars, onnx_skipped = onnx_variants(
            export_dir, list(options.precisions), list(options.providers), options.threads,
            io_binding=options.io_binding, cuda_graph=options.cuda_graph, tf32=options.tf32,
            lengths=CUDA in names,  # the form that leaves ONNX Runtime's fast CUDA attention open
        )  # fmt: skip
        variants += onnx_vars
        skipped.update(onnx_skipped)
        # a plugin without a device here is listed as skipped, with the reason
        openvino_here = openvino_usable() or OPENVINO in installed_plugins()
        if on_cpu and options.openvino and OPENVINO not in names and openvino_here:
            ov_vars, ov_skipped = onnx_variants(
                export_dir, [p for p in OPENVINO_PRECISIONS if p in options.precisions], openvino_providers(),
                options.threads,
            )  # fmt: skip
            variants += ov_vars
            skipped.update(ov_skipped)
        reference = None
        if options.peers and on_cpu:
            peer_vars, peer_skipped, reference = _peers(manifest, options, Path(scratch))
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
                               progress=progress, skipped=skipped, floors=on_cpu, memory=options.memory)  # fmt: skip
        report.accuracy = manifest.to_json()["gates"]
        if reference is not None:
            _agreement(report, variants, reference, manifest)
        else:  # an export of edgeattn's own model: every variant against eager PyTorch float32
            eager = next((v for v in variants if v.name == "eager fp32" and v.answer is not None), None)
            if eager is not None:
                others = [v for v in variants if v is not eager]
                _agreement(report, others, eager.answer, manifest, against="eager PyTorch float32",
                           output="last_hidden_state")  # fmt: skip
        generation = None
        family = get_family(manifest.family_name)
        if options.generation and family.generation_bench is not None and family.generates_with(manifest.graphs):
            bench_generation = resolve(family.generation_bench)
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


def _peers(manifest: Any, options: BenchOptions, scratch: Path) -> tuple[list[Any], dict[str, str], Any]:
    """The peers to time beside the export, those that cannot be built (with why), and the
    accuracy reference: for an imported checkpoint, transformers and Optimum on its own folder;
    otherwise a Hugging Face BERT of the model's size."""
    if options.hf_folder is not None and manifest.architecture is None:
        raise EdgeattnError("--hf-folder is for exports of a Hugging Face folder (export --from-hf); this one is not")
    if manifest.architecture is not None:
        from edgeattn.benchmark.checkpoint import checkpoint_peers

        folder = options.hf_folder or manifest.source_folder
        if folder is None or not (Path(folder) / "config.json").is_file():
            where = "its manifest names none" if folder is None else f"{folder} holds no config.json"
            return [], {"peers": f"the Hugging Face folder this export came from is not here ({where}); "
                                 "give it with --hf-folder"}, None  # fmt: skip
        try:
            peers = checkpoint_peers(folder, manifest.task, options.threads, scratch)
        except Exception as exc:  # noqa: BLE001 - a peer that cannot be built must not end the benchmark
            return [], {"peers": f"cannot be built: {exc}"}, None
        return peers.variants, peers.skipped, peers.reference
    from edgeattn.benchmark.peers import bert_peer_variants

    try:
        peer_vars, peer_skipped = bert_peer_variants(manifest.config, options.threads, scratch)
    except Exception as exc:  # noqa: BLE001 - a peer that cannot be built must not end the benchmark
        return [], {"peer HF BERT": f"cannot be built: {exc}"}, None
    return peer_vars, peer_skipped, None


def _agreement(report: LatencyReport, variants: list[Any], reference: Any, manifest: Any,
               against: str = "transformers eager float32", output: str | None = None) -> None:  # fmt: skip
    """Each variant's task output (or ``output``) against ``reference`` on one padded batch, into
    ``report``."""
    from edgeattn.benchmark.checkpoint import accuracy_inputs, measure_accuracy
    from edgeattn.benchmark.transformers_eager import task_output

    config = manifest.config
    seq = min(128, config.max_len)
    ids, mask = accuracy_inputs(config.vocab_size, config.pad_id, batch=32, seq=seq)
    output = output or task_output(manifest.task)
    report.agreement, errors = measure_accuracy(variants, reference, output, ids, mask)
    lengths = mask.sum(axis=1)
    report.agreement_note = (
        f"{output} against {against} on 32 random-id sequences of {lengths.min()}..{lengths.max()} "
        "tokens padded together; real tokens only"
    )
    report.skipped.update({f"accuracy of {name}": why for name, why in errors.items()})
