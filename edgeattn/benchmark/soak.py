"""Load on one loaded model: many threads calling it at once for a bounded time.

Every thread draws requests from one fixed set (``encode`` at mixed shapes, and ``generate`` where
the model has a decoder), each request's answer computed serially first; every concurrent answer
is checked against its serial one. Reported: requests, requests per second, p50 / p99 latency,
errors, mismatches, and the process's resident memory at start, after warm-up and at the end.
Torch-free: it needs only the runtime.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.runtime.exported_model import ExportedModel
from edgeattn.runtime.precisions import FP32

#: (batch, sequence length) of the encode requests, within the model's max_len
SHAPES = ((1, 7), (1, 32), (2, 19), (4, 64), (8, 16), (3, 128))
#: tokens each generate request asks for
NEW_TOKENS = 8


@dataclass
class Request:
    kind: str  # "encode" or "generate"
    ids: np.ndarray
    mask: np.ndarray
    answer: np.ndarray  # the serial answer


@dataclass
class SoakReport:
    export_dir: str
    threads: int
    seconds: float
    requests: int = 0
    requests_per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    errors: int = 0
    mismatches: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    rss_start_mb: float = 0.0
    rss_warm_mb: float = 0.0
    rss_end_mb: float = 0.0
    first_errors: list[str] = field(default_factory=list)

    @property
    def growth(self) -> float:
        """Resident memory growth after warm-up, as a fraction."""
        return (self.rss_end_mb - self.rss_warm_mb) / self.rss_warm_mb if self.rss_warm_mb else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "growth_after_warmup": self.growth}

    def table(self) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in self.kinds.items())
        return "\n".join([
            f"soak {self.export_dir}: {self.threads} threads, {self.seconds:.0f} s",
            f"  requests {self.requests} ({kinds}), {self.requests_per_s:.1f}/s, p50 {self.p50_ms:.2f} ms, "
            f"p99 {self.p99_ms:.2f} ms",
            f"  errors {self.errors}, answers unlike the serial ones {self.mismatches}",
            f"  resident MB: start {self.rss_start_mb:.0f}, after warm-up {self.rss_warm_mb:.0f}, "
            f"end {self.rss_end_mb:.0f} (growth after warm-up {100 * self.growth:+.1f}%)",
            *(f"  first error: {e}" for e in self.first_errors),
        ])  # fmt: skip


def rss_mb() -> float:
    """This process's resident set now, in MB (0 where /proc is missing)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def requests_for(model: ExportedModel, seed: int = 0) -> list[Request]:
    """The request set: encode at every shape that fits, with padded rows, and greedy generation
    where the model has a decoder; each with its answer computed serially."""
    c = model.config
    rng = np.random.default_rng(seed)
    out: list[Request] = []
    for batch, seq in SHAPES:
        seq = min(seq, c.max_len)
        ids = rng.integers(3, c.vocab_size, size=(batch, seq), dtype=np.int64)
        mask = np.ones_like(ids)
        mask[1:, seq - seq // 3 :] = 0
        ids[mask == 0] = c.pad_id
        out.append(Request("encode", ids, mask, model.encode(ids, mask)))
        if c.has_decoder and seq <= 32:
            tokens = model.generate(ids, mask, max_new_tokens=NEW_TOKENS).tokens
            out.append(Request("generate", ids, mask, tokens))
    return out


def _answer(model: ExportedModel, request: Request) -> np.ndarray:
    if request.kind == "encode":
        return model.encode(request.ids, request.mask)
    return model.generate(request.ids, request.mask, max_new_tokens=NEW_TOKENS).tokens


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    if got.shape != want.shape:
        return False
    if got.dtype.kind == "f":
        return bool(np.isfinite(got).all()) and bool(np.allclose(got, want, rtol=1e-5, atol=1e-5))
    return bool(np.array_equal(got, want))


def soak(export_dir: str | Path, threads: int = 8, seconds: float = 60.0, warmup: float = 0.1,
         precision: str = FP32, seed: int = 0, session_threads: int | None = 1) -> SoakReport:  # fmt: skip
    """``threads`` threads calling one model loaded from ``export_dir`` for ``seconds``; memory is
    read again once ``warmup`` (a fraction of the time) has passed. ``session_threads``: ONNX
    Runtime's intra-op threads per call (1: the concurrency comes from the callers)."""
    from edgeattn.runtime import load

    report = SoakReport(str(export_dir), threads, seconds)
    model = load(export_dir, precision=precision, threads=session_threads)
    report.rss_start_mb = rss_mb()
    pool = requests_for(model, seed)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    counts: list[dict[str, int]] = [{} for _ in range(threads)]
    faults: list[dict[str, int]] = [{"errors": 0, "mismatches": 0} for _ in range(threads)]
    problems: list[list[str]] = [[] for _ in range(threads)]  # each thread's first few, in words
    start = time.perf_counter()
    deadline = start + seconds

    def worker(i: int) -> None:
        rng = np.random.default_rng([seed, i])
        while time.perf_counter() < deadline:
            request = pool[int(rng.integers(len(pool)))]
            t0 = time.perf_counter()
            try:
                got = _answer(model, request)
            except Exception as exc:  # noqa: BLE001 - counted and reported, the soak goes on
                faults[i]["errors"] += 1
                if len(problems[i]) < 3:
                    problems[i].append(f"{request.kind} {request.ids.shape}: {type(exc).__name__}: {exc}")
                continue
            latencies[i].append(time.perf_counter() - t0)
            counts[i][request.kind] = counts[i].get(request.kind, 0) + 1
            if not _same(got, request.answer):
                faults[i]["mismatches"] += 1
                if len(problems[i]) < 3:
                    problems[i].append(f"{request.kind} {request.ids.shape}: answer unlike the serial one")

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    time.sleep(max(0.0, min(seconds * warmup, deadline - time.perf_counter())))
    report.rss_warm_mb = rss_mb()
    for w in workers:
        w.join(timeout=seconds + 600)
    elapsed = time.perf_counter() - start
    report.rss_end_mb = rss_mb()
    flat = np.array([t for per in latencies for t in per]) * 1e3
    report.requests = int(flat.size)
    report.requests_per_s = report.requests / elapsed
    if flat.size:
        report.p50_ms, report.p99_ms = float(np.percentile(flat, 50)), float(np.percentile(flat, 99))
    for per in counts:
        for kind, n in per.items():
            report.kinds[kind] = report.kinds.get(kind, 0) + n
    report.errors = sum(f["errors"] for f in faults)
    report.mismatches = sum(f["mismatches"] for f in faults)
    report.first_errors = [p for per in problems for p in per][:3]
    if any(w.is_alive() for w in workers):
        report.errors += 1
        report.first_errors.append("a worker did not finish within the time limit (a hang)")
    return report
