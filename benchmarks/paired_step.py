"""Two exports' decoding step against each other, paired and in both load orders (see
``edgeattn.benchmark.paired``): the honest way to A/B a change to the decoder graphs.

    python benchmarks/paired_step.py BEFORE_DIR AFTER_DIR [--precision fp32] [--batch 8] [--out FILE]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from edgeattn.benchmark.machine import machine_info
from edgeattn.benchmark.paired import PairedSteps, paired, step_loader
from edgeattn.benchmark.report import publish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="the export to compare against (A)")
    parser.add_argument("b", help="the export compared (B); the ratio is B's time over A's")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--src-len", type=int, default=128)
    parser.add_argument("--position", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/paired-step.json"))
    args = parser.parse_args()
    loaders = [step_loader(d, args.precision, args.batch, args.src_len, args.position, args.threads)
               for d in (args.a, args.b)]  # fmt: skip
    result = paired(*loaders, pairs=args.pairs)
    publish(PairedSteps(args.a, args.b, args.precision, args.batch, result, machine_info()), args.out)


if __name__ == "__main__":
    main()
