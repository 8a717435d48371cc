"""Soak: N threads calling one loaded model with mixed shapes for a bounded time.

Every answer is checked against the serial answer for the same input; errors must be 0 and
resident memory must not grow after warm-up. Without an export directory it exports the demo
preset first (its encoder-decoder: encode and generate)::

    python benchmarks/soak.py --threads 8 --seconds 60 --json benchmarks/results/soak-demo.json
    python benchmarks/soak.py ./ner --threads 16 --seconds 300
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from edgeattn.benchmark.machine import machine_info
from edgeattn.benchmark.soak import soak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export_dir", nargs="?", type=Path, default=None, help="An export (default: the demo's).")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--json", type=Path, default=None, help="Write the report as JSON.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgeattn-soak-") as scratch:
        export_dir = args.export_dir
        if export_dir is None:
            from edgeattn.exporters.export import export_model
            from edgeattn.sources import resolve_model

            export_dir = Path(scratch) / "demo"
            export_model(resolve_model().model, export_dir, verify=False)
        report = soak(export_dir, threads=args.threads, seconds=args.seconds, precision=args.precision)
    print(report.table())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**report.to_dict(), "machine": machine_info()}, indent=2) + "\n")
        print(f"wrote {args.json}")
    sys.exit(1 if report.errors or report.mismatches else 0)


if __name__ == "__main__":
    main()
