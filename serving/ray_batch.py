"""Batch jobs on a Ray cluster: the chunks :mod:`edgeattn.serving.batch` cuts, answered by a pool
of Ray Data actors (each loads the export once, with its own threads) and written as the same
parts, so that the output equals the in-process job's row for row.

Exactly once: a part is named by its chunk and written by one atomic rename, so when a worker or a
node dies mid-chunk, Ray runs the chunk again elsewhere and the part it writes is the one the lost
worker would have written; the job's rows are each written once. Resumable as the in-process job
is. The parts folder must be one every node can write (one machine, or a shared file system).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from edgeattn.errors import EdgeattnError
from edgeattn.serving.batch import CHUNK_ROWS, BatchResult, plan_job, prepare_output, row_bar, schema_of, write_chunk

log = logging.getLogger(__name__)


def need_ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401 - Ray Data is an extra of ray
    except ImportError as exc:
        raise EdgeattnError("--ray runs on Ray Data, which is not installed: pip install 'edgeattn[ray]'") from exc
    return ray


class ChunkAnswerer:
    """A Ray Data actor: the export loaded once; each chunk index it is given answered and written."""

    def __init__(self, export_dir: str, task: str, precision: str | None, threads: int, chunks: Any,
                 batch_rows: int, out_dir: str) -> None:  # fmt: skip
        import ray

        from edgeattn.runtime import load

        self.model = load(export_dir, precision=precision or "fp32", threads=threads)
        self.task = task
        self.chunks = ray.get(chunks[0])  # the job's chunks, put once in the object store (in a list: not resolved)
        self.batch_rows = batch_rows
        self.out_dir = Path(out_dir)
        self.schema = schema_of(self.model, task)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        written, errors = [], []
        for index in batch["index"]:
            chunk = self.chunks[int(index)]
            errors.append(write_chunk(self.model, self.task, chunk, self.out_dir, self.schema, self.batch_rows))
            written.append(len(chunk.rows))
        return {"index": batch["index"], "rows": written, "errors": errors}


def run_batch_on_ray(export_dir: Path, input_path: Path, out_dir: Path, task: str | None = None,
                     chunk_rows: int = CHUNK_ROWS, batch_rows: int = 16, precision: str | None = None,
                     concurrency: int = 2, threads: int = 1, address: str | None = None,
                     progress: bool = True) -> BatchResult:  # fmt: skip
    """:func:`~edgeattn.serving.batch.run_batch` on Ray: ``concurrency`` actors of ``threads`` threads
    (and as many CPUs) each, on the cluster at ``address`` (None: the one this process is connected
    to, else a new local one started for the job and stopped after it; ``"auto"``: the one
    ``ray start`` began)."""
    ray = need_ray()
    if concurrency < 1 or threads < 1:
        raise EdgeattnError("--concurrency and --threads must be at least 1")
    start = time.perf_counter()
    job = plan_job(export_dir, input_path, out_dir, task, chunk_rows, precision)
    started = not ray.is_initialized()
    if started:
        ray.init(address=address or "local", log_to_driver=False, logging_level=logging.WARNING)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # edgeattn's bar counts rows; Ray Data's own count blocks
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    try:
        errors = 0
        if job.missing:
            items = ray.data.from_items([{"index": c.index} for c in job.missing],
                                        override_num_blocks=len(job.missing))  # fmt: skip
            answered = items.map_batches(
                ChunkAnswerer, batch_size=1, concurrency=concurrency, num_cpus=threads,
                fn_constructor_kwargs={"export_dir": str(Path(export_dir).resolve()), "task": job.task,
                                       "precision": precision, "threads": threads,
                                       "chunks": [ray.put(job.chunks)], "batch_rows": batch_rows,
                                       "out_dir": str(job.out_dir.resolve())},
            )  # fmt: skip (Ray Data restarts a lost actor and retries its chunk: max_restarts -1 by default)
            with row_bar(sum(len(c.rows) for c in job.missing), progress, "batch (ray)") as bar:
                for result in answered.iter_rows():
                    errors += int(result["errors"])
                    bar.update(int(result["rows"]))
        still = prepare_output(job.out_dir, job.description, job.chunks)
        if still:
            raise EdgeattnError(f"{len(still)} chunk(s) were not written; run the job again to write them")
    finally:
        if started:
            ray.shutdown()
    return job.result(errors, time.perf_counter() - start)
