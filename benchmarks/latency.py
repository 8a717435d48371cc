"""Encoder latency benchmark: eager PyTorch and every exported precision, side by side.

    python benchmarks/latency.py [--preset reference | --export-dir DIR] [--batch 1,8] [--seq 32,128,512]
                                 [--threads 2] [--repeats 20] [--json FILE] [--plot FILE.png]

The same engine as ``edgeattn bench``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from edgeattn.benchmark.run import BenchOptions, run_benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="reference")
    parser.add_argument("--export-dir", type=Path, default=None)
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--seq", default="32,128,512")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path, default=Path("bench-results/latency.json"))
    parser.add_argument("--plot", type=Path, default=Path("bench-results/latency.png"))
    args = parser.parse_args()
    options = BenchOptions(
        batches=tuple(int(b) for b in args.batch.split(",")),
        seqs=tuple(int(s) for s in args.seq.split(",")),
        threads=args.threads,
        repeats=args.repeats,
    )
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    preset = None if args.export_dir else args.preset
    report, _ = run_benchmark(args.export_dir, preset, options, args.json, args.plot, progress=True)
    print(report.table())
    print(f"wrote {args.json} and {args.plot}")


if __name__ == "__main__":
    main()
