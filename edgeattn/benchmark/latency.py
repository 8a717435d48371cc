"""Encoder latency, variant beside variant: eager PyTorch and every exported precision.

All variants run in one process, interleaved run by run so machine drift hits them alike, with
ONNX Runtime's intra-op threads spinning only while a run lasts (spinning between runs, several
sessions on two cores would fight each other; not spinning at all costs every operator a wake-up).
Figures per variant and shape: median/p90/p99 ms, sequences and tokens per second, achieved
GFLOP/s against a float32 GEMM ceiling measured in the same run, cold start (session creation
to first result), peak resident memory (each variant alone in a fresh process, see
:mod:`edgeattn.benchmark.memory`), and file size; and per shape the floors (projections and
attention on ONNX Runtime's kernels) of float32 and int8 (and of int8-static and int4 when those
variants run), each ONNX Runtime CPU variant against its own (see :mod:`edgeattn.benchmark.floors`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.benchmark.floors import PRECISION_FLOORS, Floor, floor_of, floor_runners, floor_sessions
from edgeattn.benchmark.machine import machine_info
from edgeattn.benchmark.memory import (
    Probe,
    bench_inputs,
    eager_probe,
    eager_runner,
    measure_peak,
    onnx_probe,
    use_sdpa,
)
from edgeattn.benchmark.timing import Timing, best_seconds, interleaved
from edgeattn.config import ModelConfig
from edgeattn.errors import EdgeattnError
from edgeattn.host import has_bf16
from edgeattn.runtime.manifest import ManifestError
from edgeattn.runtime.precisions import get_precision, key_length_precisions
from edgeattn.runtime.providers import Provider, provider_name, provider_options
from edgeattn.runtime.specs import encoder_feeds
from edgeattn.tables import table_lines

Runner = Callable[[np.ndarray, np.ndarray], object]
#: How long eager PyTorch's OpenMP threads spin after a CPU run returns (measured ~10 ms; an ONNX
#: Runtime run started 20 ms later is no longer slowed), waited out, untimed, before the next run.
EAGER_SETTLE_S = 0.02
#: ``answer(ids, mask)``: a variant's outputs by name, as numpy, for its accuracy figures
Answer = Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]


@dataclass
class Variant:
    """One way of running the encoder."""

    name: str
    run: Runner
    cold_start_ms: float = 0.0
    file_bytes: int = 0
    note: str = ""
    #: how to rebuild the variant in a fresh process, for its peak memory (None: not measured)
    probe: Probe | None = None
    #: its outputs by name, for accuracy against a reference (None: not measured)
    answer: Answer | None = None
    #: the floor it is held to (a key of :data:`edgeattn.benchmark.floors.PRECISION_FLOORS`), if any
    floor: str | None = None
    #: seconds its threads keep the cores busy after it returns; the next timed run waits that long
    settle_s: float = 0.0


@dataclass
class Row:
    variant: str
    batch: int
    seq: int
    timing: Timing
    sequences_per_s: float
    tokens_per_s: float
    gflops: float
    ratio: float = 1.0
    #: median / the variant's own floor at this shape (None: no floor)
    floor_ratio: float | None = None


@dataclass
class LatencyReport:
    """Every variant at every shape, with the machine and the GEMM ceiling of the same run."""

    config: dict[str, Any]
    threads: int
    rows: list[Row] = field(default_factory=list)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    gemm_ceiling_gflops: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    baseline: str = ""
    #: the export's accuracy-gate figures per precision, when it has them
    accuracy: dict[str, Any] = field(default_factory=dict)
    #: floors per shape, ratios against the baseline
    floors: list[Floor] = field(default_factory=list)
    #: each variant's task output against a reference model on one padded batch (imported
    #: checkpoints: transformers eager), and what the figures mean
    agreement: dict[str, dict[str, float | None]] = field(default_factory=dict)
    agreement_note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        shapes = sorted({(r.batch, r.seq) for r in self.rows})
        head = ["variant", *[f"{b}x{s} ms (ratio)" for b, s in shapes], "GFLOP/s", "cold ms", "MB file", "peak MB"]
        lines = [head]
        for name, info in self.variants.items():
            cells = [name]
            best_gflops = 0.0
            for b, s in shapes:
                row = next((r for r in self.rows if r.variant == name and (r.batch, r.seq) == (b, s)), None)
                if row is None:
                    cells.append("-")
                    continue
                cells.append(f"{row.timing.median:.2f} ({row.ratio:.2f})")
                best_gflops = max(best_gflops, row.gflops)
            peak = info.get("peak_rss_mb")
            cells += [f"{best_gflops:.0f}", f"{info['cold_start_ms']:.0f}", f"{info['file_bytes'] / 1e6:.1f}",
                      "-" if peak is None else f"{peak:.0f}"]  # fmt: skip
            lines.append(cells)
        text = table_lines(lines)
        text.append(
            f"median of interleaved runs, {self.threads} threads; ratio = median / {self.baseline}'s"
            + (f"; fp32 GEMM ceiling {self.gemm_ceiling_gflops:.0f} GFLOP/s" if self.gemm_ceiling_gflops else "")
        )
        memory_shape = next((v.get("memory_shape") for v in self.variants.values() if v.get("memory_shape")), None)
        if memory_shape:
            text.append(f"peak MB: resident memory of the whole process running the variant alone at {memory_shape}")
        if self.floors:
            cells = [f"{f.batch}x{f.seq} " + ", ".join(f"{k} {ms:.2f} ({f.kind_ratios[k]:.2f})"
                                                       for k, ms in f.kinds.items())
                     for f in self.floors]  # fmt: skip
            text.append("floors (projections alone at ONNX Runtime's own GEMM speed, + the attention core at its "
                        "faster attention kernel): " + "; ".join(cells))  # fmt: skip
            text.append("attention core per forward (fused MultiHeadAttention with the padding / unfused "
                        "MatMul-Softmax-MatMul / its arithmetic at the GEMM ceiling): "
                        + "; ".join(f"{f.batch}x{f.seq} " + " / ".join(f"{ms:.2f}" for ms in
                                    (*f.attention_kernels_ms.values(), f.attention_ceiling_ms)) + " ms"
                                    for f in self.floors))  # fmt: skip
            held = [(name, [r for r in self.rows if r.variant == name and r.floor_ratio is not None])
                    for name in self.variants]  # fmt: skip
            if any(rows for _, rows in held):
                text.append("time / the variant's own floor (its precision's kernels):")
                for name, rows in held:
                    if rows:
                        text.append(f"  {name}: " + ", ".join(f"{r.batch}x{r.seq} {r.floor_ratio:.2f}" for r in rows))
        if self.agreement:
            text.append(f"accuracy ({self.agreement_note}):")
            for name, a in self.agreement.items():
                top1 = "" if a.get("top1") is None else f", top-1 agreement {a['top1']:.4f}"
                text.append(f"  {name}: max abs {a['max_abs']:.2e}, worst cosine {a['cosine_min']:.6f}{top1}")
        for name, why in self.skipped.items():
            text.append(f"skipped {name}: {why}")
        return "\n".join(text)


def encoder_flops(config: ModelConfig, batch: int, seq: int) -> float:
    """Multiply-add FLOPs (×2) of one encoder forward: projections, feed-forward, attention."""
    d, f, inner = config.d_model, config.d_ff, config.n_heads * config.head_dim
    ff_mats = 3 if config.gated else 2
    per_layer = 4 * seq * d * inner * 2 + ff_mats * seq * d * f * 2 + 2 * seq * seq * inner * 2
    return float(batch * config.n_encoder_layers * per_layer)


def gemm_ceiling(threads: int, size: int = 1024, repeats: int = 10) -> float:
    """Best float32 GFLOP/s of torch.matmul at size³ on ``threads`` threads."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        return 2 * size**3 / best_seconds(lambda: torch.matmul(a, b), repeats) / 1e9
    finally:
        torch.set_num_threads(previous)


def eager_variants(
    model: Any,
    threads: int,
    bf16: bool | None = None,
    weights: str | Path | None = None,
    cpu: bool = True,
    cuda: bool = False,
) -> tuple[list[Variant], dict[str, str]]:
    """Eager PyTorch on the CPU (``cpu``): float32 with the model's attention, with SDPA, and bf16
    autocast where the CPU multiplies bf16 natively (AMX, AVX-512 BF16); on the GPU (``cuda``, when
    torch sees one): float32 and float16 with SDPA. ``weights`` (the model's safetensors file) lets
    the memory probe rebuild CPU variants."""
    import copy

    import torch

    torch.set_num_threads(threads)
    model = model.eval()
    sdpa = use_sdpa(copy.deepcopy(model))

    def probe(with_sdpa: bool = False, autocast: bool = False) -> Probe | None:
        config = model.config.to_dict()
        return None if weights is None else eager_probe(str(weights), config, threads, with_sdpa, autocast)

    def answer(ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            if model.config.has_decoder:  # the encoder's states, as the encoder graph returns them
                hidden, logits = model.encode(torch.from_numpy(ids), torch.from_numpy(mask)), None
            else:
                hidden, logits = model(torch.from_numpy(ids), torch.from_numpy(mask))
        return {"last_hidden_state": hidden.numpy(), **({} if logits is None else {"logits": logits.numpy()})}

    variants: list[Variant] = []
    skipped: dict[str, str] = {}
    if cpu:
        variants += [
            Variant("eager fp32", eager_runner(model), probe=probe(), answer=answer, settle_s=EAGER_SETTLE_S),
            Variant("eager fp32 SDPA", eager_runner(sdpa), probe=probe(with_sdpa=True), settle_s=EAGER_SETTLE_S),
        ]
        if bf16 or (bf16 is None and has_bf16()):
            bf16_run = eager_runner(sdpa, autocast=True)
            variants.append(Variant("eager bf16 autocast SDPA", bf16_run, probe=probe(with_sdpa=True, autocast=True),
                                    settle_s=EAGER_SETTLE_S))  # fmt: skip
        else:
            skipped["eager bf16 autocast"] = "no bf16 instructions (AMX, AVX-512 BF16) on this CPU"
    if cuda:
        if torch.cuda.is_available():
            variants += [
                Variant("eager fp32 CUDA", _cuda_runner(model, torch.float32), note="TF32 off"),
                Variant("eager fp16 SDPA CUDA", _cuda_runner(sdpa, torch.float16)),
            ]
        else:
            skipped["eager CUDA"] = "torch sees no CUDA device"
    return variants, skipped


def _cuda_runner(model: Any, dtype: Any) -> Runner:
    """Eager PyTorch on the GPU in ``dtype``; inputs copied to the device once per input array,
    the output left there, the device synchronised before returning."""
    import copy

    import torch

    from edgeattn.benchmark.bound import input_key

    gpu = copy.deepcopy(model).to(device="cuda", dtype=dtype).eval()
    cached: dict[str, Any] = {}

    def run(ids: np.ndarray, mask: np.ndarray) -> object:
        key = input_key(ids, mask)
        if cached.get("key") != key:
            cached.update(key=key, ids=torch.from_numpy(ids).cuda(), mask=torch.from_numpy(mask).cuda())
        with torch.inference_mode():
            out = gpu.encode(cached["ids"], cached["mask"])
        torch.cuda.synchronize()
        return out

    return run


def onnx_variants(
    export_dir: Path,
    precisions: list[str],
    providers: list[Provider],
    threads: int,
    io_binding: bool | None = None,
    cuda_graph: bool = True,
    tf32: bool = False,
    lengths: bool = False,
) -> tuple[list[Variant], dict[str, str]]:
    """The exported encoder at each precision the export holds, on each provider asked for (a name,
    or (name, options); built in or an installed plugin, see :mod:`edgeattn.runtime.providers`).

    ``io_binding`` (default: on for CUDA) keeps inputs and outputs on the device (see
    :mod:`edgeattn.benchmark.bound`); on CUDA, ``cuda_graph`` adds a CUDA-graph variant of each
    precision; ``tf32`` lets CUDA float32 matrix products use TF32; ``lengths`` adds each fused
    precision (fp32-opt, fp16) with its padding given as key lengths (see :func:`_lengths_variants`)."""
    from edgeattn.benchmark.bound import CudaGraphRunner
    from edgeattn.runtime.families import get_family
    from edgeattn.runtime.manifest import read_manifest
    from edgeattn.runtime.providers import why_unavailable
    from edgeattn.runtime.safety import graph_bytes
    from edgeattn.runtime.session import CPU, CUDA, create_session

    manifest = read_manifest(export_dir)
    skipped: dict[str, str] = {}
    timed = get_family(manifest.family_name).primary_graph  # the graph every task runs first: the encoder
    if timed not in manifest.graphs:
        return [], {"onnx": f"{export_dir} has no {timed} graph"}
    d_model = manifest.config.d_model
    variants: list[Variant] = []
    for provider in providers:
        short = provider_label(provider)
        reason = why_unavailable(provider)
        if reason is not None:
            skipped[f"onnx {short}"] = reason
            continue
        provider_id = provider_name(provider)
        bind = provider_id == CUDA if io_binding is None else io_binding
        for precision in precisions:
            name = f"onnx {precision} {short}"
            record = get_precision(precision)
            if record.provider == "gpu" and provider_id != CUDA:
                skipped[name] = f"{precision} is a GPU precision (the CPU runs it through casts)"
                continue
            if record.engine is not None:  # its graphs are fp32's, timed on that engine as fp32 variants
                skipped[name] = f"{precision} is {record.summary}: timed as fp32 on {record.engine} with its hint"
                continue
            try:
                variant_entry = manifest.entry(timed, precision)
            except ManifestError as exc:
                skipped[name] = str(exc)
                continue
            path = export_dir / variant_entry.file
            size = graph_bytes(path)
            start = time.perf_counter()
            try:
                session = create_session(path, providers=[provider], threads=threads, spinning="run", tf32=tf32,
                                         require=True)  # fmt: skip
                answer = onnx_answer(session)
                run = session_runner(session, bind, provider_id == CUDA)
                run(np.ones((1, 8), np.int64), np.ones((1, 8), np.int64))
            except Exception as exc:  # noqa: BLE001 - one variant that cannot run must not end the benchmark
                skipped[name] = f"cannot run: {exc}"
                continue
            cold = (time.perf_counter() - start) * 1e3
            notes = [n for n, on in (("IO binding", bind), ("TF32", tf32 and provider_id == CUDA)) if on]
            if provider_id not in (CPU, CUDA):
                notes.append(f"on {', '.join(session.get_providers())}")
            # a CUDA session's host memory is mostly the CUDA libraries, not the model: not probed
            probe = None if provider_id == CUDA else onnx_probe(str(path), provider, threads)
            held_to = PRECISION_FLOORS.get(precision) if provider_id == CPU else None  # floors are the CPU's kernels
            variants.append(Variant(name, run, cold, size, ", ".join(notes), probe=probe, answer=answer,
                                    floor=held_to))  # fmt: skip
            if provider_id == CUDA and cuda_graph:
                graph_runner = CudaGraphRunner(path, d_model, threads, tf32)
                note = "CUDA graph, IO binding, one session per shape (cold start not comparable)"
                variants.append(Variant(f"{name} graph", graph_runner, 0.0, size, note))
            if lengths and precision in LENGTHS_PRECISIONS:
                found, why = _lengths_variants(path, name, provider, bind, threads, tf32, d_model,
                                               cuda_graph and provider_id == CUDA)  # fmt: skip
                variants += found
                skipped.update(why)
    return variants, skipped


#: Precisions whose encoder has fused attention, timed also with the padding as key lengths.
LENGTHS_PRECISIONS = tuple(key_length_precisions())


def _lengths_variants(path: Path, name: str, provider: Provider, bind: bool, threads: int, tf32: bool,
                      d_model: int, cuda_graph: bool) -> tuple[list[Variant], dict[str, str]]:  # fmt: skip
    """``name`` again with its fused attention taking key lengths instead of the mask matrix (see
    :mod:`edgeattn.exporters.mask_forms`), run on right-padded batches only; with ``cuda_graph``
    its CUDA-graph variant too."""
    from edgeattn.benchmark.bound import CudaGraphRunner, RightPadded
    from edgeattn.exporters.mask_forms import lengths_form_bytes
    from edgeattn.runtime.session import CUDA, create_session

    label = f"{name} lengths"
    try:
        graph = lengths_form_bytes(path)
        session = create_session(graph, providers=[provider], threads=threads, spinning="run", tf32=tf32,
                                 require=True)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - reported beside the table
        return [], {label: f"cannot run: {exc}"}
    inner = session_runner(session, bind, provider_name(provider) == CUDA)
    note = "fused attention given key lengths (right-padded batches only)"
    found = [Variant(label, RightPadded(inner), 0.0, len(graph), note, answer=onnx_answer(session))]
    if cuda_graph:
        found.append(Variant(f"{label} graph", RightPadded(CudaGraphRunner(graph, d_model, threads, tf32)), 0.0,
                             len(graph), note + ", CUDA graph, IO binding, one session per shape"))  # fmt: skip
    return found, {}


def session_runner(session: Any, bind: bool, cuda: bool) -> Runner:
    """``run(ids, mask)`` over an encoder session: through IO binding (on the GPU when ``cuda``),
    or plain ``session.run`` returning the hidden states."""
    from edgeattn.benchmark.bound import BoundRunner

    if bind:
        return BoundRunner(session, "cuda" if cuda else "cpu")
    names = [i.name for i in session.get_inputs()]

    def run(ids: np.ndarray, mask: np.ndarray) -> object:
        return session.run(["last_hidden_state"], encoder_feeds(names, ids, mask))

    return run


def provider_label(provider: Provider) -> str:
    """A provider's short name for variant names: ``OpenVINO bf16`` for OpenVINO with a bf16 hint."""
    short = provider_name(provider).replace("ExecutionProvider", "")
    hint = provider_options(provider).get("precision_hint")
    return f"{short} {hint}" if hint else short


def onnx_answer(session: Any) -> Answer:
    """``answer(ids, mask)``: every output of an ONNX Runtime session, by name."""
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]

    def answer(ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        return dict(zip(outputs, session.run(outputs, encoder_feeds(names, ids, mask)), strict=True))

    return answer


def bench_latency(
    variants: list[Variant],
    config: ModelConfig,
    shapes: list[tuple[int, int]],
    threads: int,
    repeats: int = 20,
    warmup: int = 3,
    seed: int = 0,
    progress: bool = False,
    skipped: dict[str, str] | None = None,
    floors: bool = True,
    memory: bool = True,
) -> LatencyReport:
    """Time every variant at every (batch, seq) shape, interleaved; ratios against the first variant.
    With ``floors``, also each shape's floors, timed in the same interleaving (see
    :mod:`edgeattn.benchmark.floors`); with ``memory``, each variant's peak memory at the largest
    shape, alone in a fresh process."""
    from tqdm import tqdm

    report = LatencyReport(config.to_dict(), threads, machine=machine_info(), skipped=dict(skipped or {}))
    if floors:  # the ceiling is the CPU's; a GPU run leaves it out
        report.gemm_ceiling_gflops = gemm_ceiling(threads)
    report.baseline = variants[0].name
    for v in variants:
        report.variants[v.name] = {"cold_start_ms": v.cold_start_ms, "file_bytes": v.file_bytes, "note": v.note}
    bar = tqdm(total=len(shapes) * repeats, desc="bench", unit="round", disable=not progress, leave=False)
    kinds = tuple(sorted({v.floor for v in variants if v.floor}))
    sessions = floor_sessions(config, threads, kinds) if floors else {}
    for batch, seq in shapes:
        ids, mask = bench_inputs(config.vocab_size, batch, seq, seed)  # rows after the first carry padding
        running = _runnable(variants, ids, mask, report.skipped)
        runs = {v.name: (lambda v=v, ids=ids, mask=mask: v.run(ids, mask)) for v in running}
        floor_runs = floor_runners(sessions, config, batch, seq) if floors else {}
        timings = interleaved(
            {**runs, **floor_runs},
            repeats,
            warmup,
            on_round=lambda: bar.update(),
            settle={v.name: v.settle_s for v in running},
            seed=seed,
        )
        flops = encoder_flops(config, batch, seq)
        base = timings[variants[0].name].median
        for v in running:
            t = timings[v.name]
            report.rows.append(Row(v.name, batch, seq, t, batch / (t.median / 1e3), batch * seq / (t.median / 1e3),
                                   flops / (t.median / 1e3) / 1e9, t.median / base))  # fmt: skip
        if floors:
            floor = floor_of(config, batch, seq, {name: timings[name].median for name in floor_runs},
                             report.gemm_ceiling_gflops)  # fmt: skip
            floor.fp32_ratio, floor.int8_ratio = floor.fp32_ms / base, floor.int8_ms / base
            floor.kind_ratios = {k: ms / base for k, ms in floor.kinds.items()}
            report.floors.append(floor)
            for row in report.rows[-len(running) :]:
                kind = next(v.floor for v in running if v.name == row.variant)
                if kind is not None:
                    row.floor_ratio = row.timing.median / floor.kinds[kind]
    bar.close()
    if memory:
        _measure_memory(report, variants, config, max(shapes, key=lambda bs: bs[0] * bs[1]))
    return report


def _runnable(variants: list[Variant], ids: np.ndarray, mask: np.ndarray, skipped: dict[str, str]) -> list[Variant]:
    """The variants that run on these inputs; the others are named in ``skipped`` with their error
    (a CUDA-graph capture or a shape one provider refuses must not cost the other figures). The
    baseline has to run: every ratio is against it."""
    running = []
    for v in variants:
        try:
            v.run(ids, mask)
        except Exception as exc:  # noqa: BLE001 - reported beside the table
            if v is variants[0]:
                raise EdgeattnError(f"the baseline {v.name} failed at {ids.shape[0]}x{ids.shape[1]}: {exc}") from exc
            skipped[f"{v.name} at {ids.shape[0]}x{ids.shape[1]}"] = f"failed: {exc}"
            continue
        running.append(v)
    return running


def _measure_memory(report: LatencyReport, variants: list[Variant], config: ModelConfig,
                    shape: tuple[int, int]) -> None:  # fmt: skip
    for v in variants:
        info = report.variants[v.name]
        if v.probe is None:
            info["memory_error"] = "not measured: " + (
                "a GPU variant's host memory is mostly the CUDA libraries" if "CUDA" in v.name
                else "the variant cannot be rebuilt in a fresh process"
            )  # fmt: skip
            continue
        try:
            info.update(measure_peak(v.probe, shape[0], shape[1], config.vocab_size))
        except Exception as exc:  # noqa: BLE001 - a failed probe is reported, not fatal
            info["memory_error"] = str(exc)
            continue
        info["peak_rss_mb"] = info.pop("peak_mb")
        info["baseline_rss_mb"] = info.pop("baseline_mb")
        info["added_rss_mb"] = info.pop("added_mb")
        info["memory_shape"] = f"{shape[0]}x{shape[1]}"


def plot_report(report: LatencyReport, path: str | Path) -> Path:
    """PNG of median latency against sequence length, one line per variant (largest batch if several)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len({r.batch for r in report.rows}), figsize=(11, 4.5), squeeze=False)
    for ax, batch in zip(axes[0], sorted({r.batch for r in report.rows}), strict=True):
        for name in report.variants:
            rows = sorted((r for r in report.rows if r.variant == name and r.batch == batch), key=lambda r: r.seq)
            if rows:
                ax.plot([r.seq for r in rows], [r.timing.median for r in rows], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("median latency (ms)")
        ax.set_title(f"batch {batch}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"edgeattn encoder, {report.threads} threads, {report.machine.get('cpu', '')}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
