"""What the sensitive-node search costs: a preset's int8 graphs searched as if each had failed its gate.

    python benchmarks/sensitivity.py [--preset reference] [--precision int8] [--graphs attention,encoder,...]
                                     [--threads 2] [--json FILE]

The model's fp32 graphs are exported (not verified), the precision's candidates are made and
gated once, and then, graph by graph, the search runs as it does when a gate fails: every
quantisable node quantised alone and measured, then the most damaging ones kept in float32 until
the graph passes, then the whole precision gated again. Prints and writes, per graph, the nodes,
the trials, the seconds and the nodes kept in float32.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from edgeattn.config import get_preset
from edgeattn.exporters.export import export_model
from edgeattn.exporters.gate import heldout_sources
from edgeattn.exporters.precision_builds import PrecisionBuilder, PrecisionOptions
from edgeattn.host import cpu_flags, cpu_model
from edgeattn.model import build_model
from edgeattn.runtime.manifest import read_manifest
from edgeattn.runtime.precisions import get_precision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="reference")
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--graphs", default=None, help="Comma-separated (default: every graph of the model).")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path("bench-results/sensitivity.json"))
    args = parser.parse_args()
    precision = get_precision(args.precision)
    if not precision.sensitive_search:
        parser.error(f"{precision.name} has no sensitive-node search")
    torch.set_num_threads(args.threads)
    model = build_model(get_preset(args.preset), seed=0).eval()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgeattn-sens-") as tmp:
        out = Path(tmp) / "export"
        start = time.perf_counter()
        export_model(model, out, verify=False)
        export_s = time.perf_counter() - start
        manifest = read_manifest(out)
        graphs = args.graphs.split(",") if args.graphs else list(manifest.graphs)
        heldout = heldout_sources(model.config)
        with PrecisionBuilder(model, manifest.graphs, out, heldout, PrecisionOptions()) as builder:
            start = time.perf_counter()
            candidates = {g: builder.candidate(precision, g) for g in manifest.graphs}
            gate = builder.gate(precision.name, candidates)
            build_s = time.perf_counter() - start
            for graph in graphs:
                start = time.perf_counter()
                _, final = builder.exclude_sensitive(precision, candidates, [graph])
                found = builder.searches[graph]
                row = {"graph": graph, "nodes": len(found.scores), "trials": found.trials,
                       "seconds": round(time.perf_counter() - start, 1), "passed": final.passed,
                       "excluded": found.excluded}  # fmt: skip
                print(json.dumps(row), flush=True)
                rows.append(row)
    result = {
        "preset": args.preset, "precision": precision.name, "threads": args.threads, "cpu": cpu_model(),
        "instruction_sets": cpu_flags(), "fp32_export_s": round(export_s, 1), "build_and_gate_s": round(build_s, 1),
        "gate_passed": gate.passed, "graphs": rows, "total_search_s": round(sum(r["seconds"] for r in rows), 1),
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"search on {len(rows)} graph(s): {result['total_search_s']} s; wrote {args.json}")


if __name__ == "__main__":
    main()
