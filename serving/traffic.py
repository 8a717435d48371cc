"""Load on a served model: requests per second and p50 / p99 latency at several concurrencies,
through a real Triton server (dynamic batching on and off) and through the embedded runtime
called directly, in one run. ``benchmarks/triton_load.py`` runs it."""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.benchmark.machine import machine_info
from edgeattn.errors import EdgeattnError
from edgeattn.runtime import load
from edgeattn.runtime.precisions import FP32
from edgeattn.runtime.session import CPU
from edgeattn.serving.repository import RepositoryOptions, write_repository
from edgeattn.serving.tasks import answer, task_inputs, task_of
from edgeattn.serving.triton_server import TritonServer

log = logging.getLogger(__name__)

PATHS = ("triton, dynamic batching", "triton, no batching", "embedded runtime")


@dataclass
class LoadRow:
    """One export, path and concurrency."""

    export: str
    task: str
    path: str
    concurrency: int
    #: requests answered (those that failed are in ``errors``, not here, nor in the rate or latencies)
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    #: requests per model execution on the server (1.0 without batching; None for the embedded runtime)
    mean_batch: float | None = None
    errors: int = 0


@dataclass
class ServingBench:
    rows: list[LoadRow] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        head = (f"{'export':<10} {'path':<26} {'conc':>4} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'batch':>6} "
                f"{'vs emb':>7} {'errors':>6}")  # fmt: skip
        lines = [head, "-" * len(head)]
        embedded = {(r.export, r.concurrency): r.rps for r in self.rows if r.path == PATHS[2]}
        for r in self.rows:
            ratio = r.rps / embedded[(r.export, r.concurrency)] if embedded.get((r.export, r.concurrency)) else None
            batch = f"{r.mean_batch:.2f}" if r.mean_batch is not None else "-"
            versus = f"{ratio:.2f}x" if ratio else "-"
            lines.append(f"{r.export:<10} {r.path:<26} {r.concurrency:>4} {r.rps:>8.1f} {r.p50_ms:>8.1f} "
                         f"{r.p99_ms:>8.1f} {batch:>6} {versus:>7} {r.errors:>6}")  # fmt: skip
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"settings": self.settings, "machine": self.machine, "rows": [asdict(r) for r in self.rows]}


def drive(
    call: Callable[[int, str], None], texts: list[str], concurrency: int, duration: float
) -> tuple[list[float], float, int]:
    """``concurrency`` threads calling ``call(thread, text)`` back to back for ``duration`` seconds:
    (latencies in seconds of the calls that returned, elapsed seconds, calls that raised)."""
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    stop = time.perf_counter() + duration

    def loop(thread: int) -> None:
        i = thread
        while time.perf_counter() < stop:
            start = time.perf_counter()
            try:
                call(thread, texts[i % len(texts)])
            except Exception:  # noqa: BLE001 - counted, the load goes on
                errors[thread] += 1
            else:
                latencies[thread].append(time.perf_counter() - start)
            i += concurrency

    begin = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(t,)) for t in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [x for per in latencies for x in per], time.perf_counter() - begin, sum(errors)


def _row(export: str, task: str, path: str, concurrency: int, result: tuple[list[float], float, int],
         mean_batch: float | None) -> LoadRow:  # fmt: skip
    latencies, elapsed, errors = result
    ms = np.array(latencies) * 1000 if latencies else np.zeros(1)
    rps = round(len(latencies) / elapsed, 2)
    return LoadRow(export, task, path, concurrency, len(latencies), round(elapsed, 2), rps,
                   round(float(np.percentile(ms, 50)), 2), round(float(np.percentile(ms, 99)), 2),
                   None if mean_batch is None else round(mean_batch, 2), errors)  # fmt: skip


def grpc_type(value: np.ndarray) -> str:
    """The Triton client's type name of an array."""
    from tritonclient.utils import np_to_triton_dtype

    return str(np_to_triton_dtype(value.dtype))


def _stats(client: Any, model: str) -> tuple[int, int]:
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


def request_settings(task: str, values: dict[str, Any]) -> dict[str, np.ndarray]:
    """Settings every request of ``task`` sends besides its text (``max_new_tokens`` ...), as one
    row of the types the served model declares; an input the task does not take is an error."""
    declared = {t.name: t for t in task_inputs(task)}
    out = {}
    for name, value in values.items():
        if name not in declared or name == "text":
            raise EdgeattnError(f"a {task} request takes no setting {name!r}; it takes {', '.join(declared)}")
        dtype = np.object_ if declared[name].dtype == "bytes" else np.dtype(declared[name].dtype)
        out[name] = np.array([[value.encode() if isinstance(value, str) else value]], dtype=dtype)
    return out


def bench_serving(
    exports: dict[str, Path],
    texts: dict[str, list[str]],
    concurrencies: tuple[int, ...] = (1, 8, 32),
    duration: float = 5.0,
    max_batch_size: int = 8,
    max_queue_delay_us: int = 2000,
    precision: str = FP32,
    threads: int | None = None,
    settings: dict[str, dict[str, Any]] | None = None,
) -> ServingBench:
    """Every export through a Triton server with dynamic batching on and off and through the
    embedded runtime, at every concurrency; ``settings``: by export, what each of its requests
    sends besides the text (see :func:`request_settings`)."""
    import tritonclient.grpc as grpc  # thread-safe; the HTTP client's gevent is not

    settings = settings or {}
    bench = ServingBench(settings={"concurrencies": list(concurrencies), "seconds_per_cell": duration,
                                   "max_batch_size": max_batch_size, "max_queue_delay_us": max_queue_delay_us,
                                   "precision": precision, "threads": threads, "requests": settings},
                         machine=machine_info())  # fmt: skip
    for label, export in exports.items():
        model = load(export, providers=[CPU], threads=threads, precision=precision)
        task = task_of(model.config, recorded=model.manifest.task if model.manifest else None)
        batch_texts = texts[label]
        extra = request_settings(task, settings.get(label, {}))
        for batching in (True, False):
            with tempfile.TemporaryDirectory(prefix="edgeattn-load-") as work:
                options = RepositoryOptions(precision=precision, max_batch_size=max_batch_size, name=label,
                                            max_queue_delay_us=max_queue_delay_us, graphs="in-process",
                                            dynamic_batching=batching)  # fmt: skip
                repo = write_repository(export, Path(work) / "repo", options)
                with TritonServer(repo.path, [label], log_file=Path(work) / "server.log") as server:
                    for concurrency in concurrencies:
                        clients = [grpc.InferenceServerClient(server.grpc_url) for _ in range(concurrency)]

                        def call(thread: int, text: str, clients: list[Any] = clients, name: str = label,
                                 extra: dict[str, np.ndarray] = extra) -> None:  # fmt: skip
                            items = []
                            for key, value in {"text": np.array([[text.encode()]], dtype=object), **extra}.items():
                                items.append(grpc.InferInput(key, list(value.shape), grpc_type(value)))
                                items[-1].set_data_from_numpy(value)
                            clients[thread].infer(name, items)

                        drive(call, batch_texts, concurrency, min(1.0, duration))  # warm-up
                        before = _stats(clients[0], label)
                        result = drive(call, batch_texts, concurrency, duration)
                        after = _stats(clients[0], label)
                        executions = after[1] - before[1]
                        mean = (after[0] - before[0]) / executions if executions else None
                        bench.rows.append(_row(label, task, PATHS[0] if batching else PATHS[1], concurrency, result,
                                               mean))  # fmt: skip
                        log.info("%s", bench.rows[-1])
        for concurrency in concurrencies:

            def direct(thread: int, text: str, model: Any = model, task: str = task,
                       extra: dict[str, np.ndarray] = extra) -> None:  # fmt: skip
                result = answer(model, task, [{"text": np.array([[text.encode()]], dtype=object), **extra}])[0]
                if isinstance(result, Exception):
                    raise result

            drive(direct, batch_texts, concurrency, min(1.0, duration))
            result = drive(direct, batch_texts, concurrency, duration)
            bench.rows.append(_row(label, task, PATHS[2], concurrency, result, None))
    return bench
