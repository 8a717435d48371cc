"""Memory and time of exports against model size: ``edgeattn export`` on Hugging Face folders,
each in its own process, its peak anonymous memory and resident set sampled from outside.

    python benchmarks/export_memory.py NAME=FOLDER [NAME=FOLDER ...] [--precision int8,int4]
        [--heldout FILE] [--check-python PY | --no-check] [--max-anon-gb G] [--json FILE]
        [--float-pass-tokens N]

Exits non-zero when an export fails, or peaks above ``--max-anon-gb`` of anonymous memory (the
memory an export and the processes it starts hold of their own: CI's bound on the real 1.5B).
Prints each export's phases with their time and peaks (what the export announced as it ran).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from pathlib import Path

from edgeattn.benchmark.export_memory import ExportMemoryResult, float32_pass, measure_export
from edgeattn.benchmark.machine import machine_info
from edgeattn.benchmark.report import publish

log = logging.getLogger(__name__)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="NAME=FOLDER")
    parser.add_argument("--precision", default="int8,int4")
    parser.add_argument("--heldout", type=Path, default=None)
    parser.add_argument("--check-python", default=None)
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--max-anon-gb", type=float, default=None)
    parser.add_argument("--json", type=Path, default=Path("bench-results/export-memory.json"))
    parser.add_argument("--keep", type=Path, default=None, help="keep the exports under this folder")
    parser.add_argument("--float-pass-tokens", type=int, default=None,
                        help="after each export, time one float32 pass over the held-out text (on this "
                             "many tokens spread over it, 0: all); the export's time is given as a multiple "
                             "of it")  # fmt: skip
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    extra = (["--heldout", str(args.heldout)] if args.heldout else []) + (["--no-check"] if args.no_check else []) \
        + (["--check-python", args.check_python] if args.check_python else [])  # fmt: skip
    runs = []
    work = Path(tempfile.mkdtemp(prefix="export-memory-")) if args.keep is None else args.keep
    try:
        for item in args.folders:
            name, _, folder = item.partition("=")
            log.info("exporting %s (%s) at %s", name, folder, args.precision)
            run = measure_export(name, Path(folder), work / name, args.precision, extra)
            runs.append(run)
            if args.float_pass_tokens is not None and args.heldout and run.exit_code == 0:
                run.float_pass = float32_pass(work / name, args.heldout, args.float_pass_tokens)
                log.info("%s: one float32 pass %.0f s; the export %.2fx that", name, run.float_pass.whole_seconds,
                         run.times_float_pass)  # fmt: skip
            log.info("%s: %.0f s, anon %.2f GB, resident %.2f GB, exit %d", name, run.seconds, run.peak_anon_gb,
                     run.peak_rss_gb, run.exit_code)  # fmt: skip
            if args.keep is None:
                shutil.rmtree(work / name, ignore_errors=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    publish(ExportMemoryResult(runs, machine_info()), args.json)
    failed = [r for r in runs if r.exit_code != 0]
    over = [r for r in runs if args.max_anon_gb is not None and r.peak_tree_anon_gb > args.max_anon_gb]
    for r in failed:
        print(f"{r.name}: the export failed (exit {r.exit_code}):\n{r.tail}", file=sys.stderr)
    for r in over:
        worst = max(r.phases, key=lambda p: p.peak_anon_gb, default=None)
        where = f" (in {worst.name})" if worst is not None else ""
        print(f"{r.name}: peak anonymous memory {r.peak_tree_anon_gb:.2f} GB (with its children){where} is over the "
              f"bound of {args.max_anon_gb} GB", file=sys.stderr)  # fmt: skip
    return 1 if failed or over else 0


if __name__ == "__main__":
    sys.exit(main())
