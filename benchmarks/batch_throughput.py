"""Batch jobs' rows a second: ``edgeattn batch`` in this process against ``--ray`` (a local Ray
cluster started for the job, ``--concurrency`` actors of ``--threads`` threads), on the same
export and input, one after the other; the outputs compared row for row.

    python benchmarks/batch_throughput.py NAME=EXPORT:INPUT[:TASK] [NAME=EXPORT:INPUT[:TASK] ...] (at fp32)
        [--concurrency 2] [--threads 1] [--chunk-rows 256] [--json FILE]

Rows a second count the whole job (loading the export, reading the input, writing the parts; on Ray
also starting the cluster and its actors), as a user waits for it. The in-process job runs on
every core (ONNX Runtime's threads); the Ray job's actors take ``--threads`` each.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np

from edgeattn.benchmark.machine import machine_info
from edgeattn.serving.batch import run_batch
from edgeattn.serving.ray_batch import run_batch_on_ray

log = logging.getLogger(__name__)


def same_rows(one: Path, other: Path) -> float:
    """The largest difference between two jobs' numbers, row for row, a part at a time (inf where
    parts, ids, text or errors differ)."""
    import pyarrow.parquet as pq

    parts = sorted(p.name for p in one.glob("part-*.parquet"))
    if parts != sorted(p.name for p in other.glob("part-*.parquet")):
        return float("inf")
    return max(_same_part(pq.read_table(one / n).to_pylist(), pq.read_table(other / n).to_pylist()) for n in parts)


def _same_part(a: list[dict], b: list[dict]) -> float:
    worst = 0.0
    if [r["id"] for r in a] != [r["id"] for r in b]:
        return float("inf")
    for x, y in zip(a, b, strict=True):
        for key, value in x.items():
            other = y[key]
            if isinstance(value, list):
                worst = max(worst, float(np.abs(np.array(value, dtype=np.float64) - np.array(other)).max()))
            elif value != other:
                return float("inf")
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jobs", nargs="+", help="NAME=EXPORT:INPUT")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chunk-rows", type=int, default=256)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for job in args.jobs:
            name, paths = job.split("=", 1)
            export, source, *task = paths.split(":")
            chosen = task[0] if task else None
            here = run_batch(Path(export), Path(source), Path(scratch) / f"{name}-here", chosen,
                             chunk_rows=args.chunk_rows, progress=False)  # fmt: skip
            ray = run_batch_on_ray(Path(export), Path(source), Path(scratch) / f"{name}-ray", chosen,
                                   chunk_rows=args.chunk_rows, concurrency=args.concurrency, threads=args.threads,
                                   progress=False)  # fmt: skip
            diff = same_rows(Path(scratch) / f"{name}-here", Path(scratch) / f"{name}-ray")
            rows.append({"job": name, "task": chosen, "rows": here.rows, "in-process rows/s": here.rows_per_s,
                         "in-process s": here.seconds, "ray rows/s": ray.rows_per_s, "ray s": ray.seconds,
                         "ray / in-process": ray.rows_per_s / here.rows_per_s, "max difference": diff,
                         "errors": here.errors})  # fmt: skip
            shutil.rmtree(Path(scratch) / f"{name}-here", ignore_errors=True)
    lines = [f"ray: {args.concurrency} actors x {args.threads} thread(s), chunks of {args.chunk_rows} rows",
             "| job | rows | in-process rows/s (s) | ray rows/s (s) | ray / in-process | max difference |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['job']} | {r['rows']} | {r['in-process rows/s']:.1f} ({r['in-process s']:.1f}) | "
                     f"{r['ray rows/s']:.1f} ({r['ray s']:.1f}) | {r['ray / in-process']:.2f}x | "
                     f"{r['max difference']:.2e} |")  # fmt: skip
    print("\n".join(lines))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"benchmark": "batch_throughput", "machine": machine_info(),
                                         "concurrency": args.concurrency, "threads": args.threads,
                                         "chunk_rows": args.chunk_rows, "rows": rows}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
