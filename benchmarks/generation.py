"""Generation benchmark: cached decoder step against recomputing the prefix, on the CPU provider.

    python benchmarks/generation.py [--preset reference] [--batch 1] [--threads 2] [--json FILE]

Exports the preset (random weights, no verification: parity is the tests' job) to a temporary
directory, or measures an existing export with --export-dir.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from edgeattn.benchmark.report import publish
from edgeattn.families.seq2seq.generation_bench import bench_generation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="reference")
    parser.add_argument("--export-dir", type=Path, default=None)
    parser.add_argument("--positions", default="16,64,256")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--src-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--decode-tokens", type=int, default=None)
    parser.add_argument("--json", type=Path, default=Path("bench-results/generation.json"))
    args = parser.parse_args()
    positions = tuple(int(p) for p in args.positions.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        export_dir = args.export_dir
        if export_dir is None:
            from edgeattn.exporters.export import export_model
            from edgeattn.sources import resolve_model

            export_dir = Path(tmp) / "export"
            export_model(resolve_model(args.preset).model, export_dir, verify=False)
        result = bench_generation(
            export_dir, positions, args.batch, args.src_len, args.threads, args.repeats, args.decode_tokens
        )
    publish(result, args.json)


if __name__ == "__main__":
    main()
