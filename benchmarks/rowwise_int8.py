"""What one activation scale per row costs dynamic int8: the ``reference`` preset's encoder (random
weights) exported at int8, then rewritten as ``edgeattn triton`` serves it (see
``edgeattn.exporters.rowwise``); both timed in one process, interleaved, 2 threads, at 1 x 128
and 8 x 128 (batch-mates padded to 100 tokens), with each graph's cosine to float32 and how far
row 0's output moves between running alone and in the batch. Prints a table, writes the JSON.

    python benchmarks/rowwise_int8.py [--repeats 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from edgeattn.benchmark.machine import machine_info
from edgeattn.config import get_preset
from edgeattn.exporters.export import export_model
from edgeattn.exporters.rowwise import row_independent
from edgeattn.model import build_model
from edgeattn.runtime.manifest import read_manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/rowwise-int8.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "reference"
        export_model(build_model(get_preset("reference"), seed=0), out, graphs=["encoder"], precisions=["int8"],
                     verify=False)  # fmt: skip
        per_tensor = out / read_manifest(out).entry("encoder", "int8").file
        model = onnx.load(str(per_tensor))
        changes = row_independent(model)
        per_row = Path(tmp) / "encoder.rows.onnx"
        onnx.save(model, str(per_row))
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        sessions = {name: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
                    for name, path in (("fp32", out / "encoder.onnx"), ("int8 per tensor", per_tensor),
                                       ("int8 per row", per_row))}  # fmt: skip
        rng = np.random.default_rng(0)
        rows = []
        for batch in (1, 8):
            ids = rng.integers(5, 32000, (batch, 128)).astype(np.int64)
            mask = np.ones_like(ids)
            mask[1:, 100:] = 0
            feeds = {"input_ids": ids, "attention_mask": mask}
            times: dict[str, list[float]] = {name: [] for name in sessions}
            for _ in range(args.repeats):
                for name, session in sessions.items():
                    start = time.perf_counter()
                    session.run(None, feeds)
                    times[name].append(time.perf_counter() - start)
            reference = sessions["fp32"].run(None, feeds)[0]
            for name, session in sessions.items():
                hidden = session.run(None, feeds)[0]
                alone = session.run(None, {"input_ids": ids[:1], "attention_mask": mask[:1]})[0]
                cosine = (
                    (hidden * reference).sum(-1) / np.linalg.norm(hidden, axis=-1) / np.linalg.norm(reference, axis=-1)
                )
                rows.append({"variant": name, "batch": batch, "ms": round(float(np.median(times[name])) * 1000, 2),
                             "cosine_min": round(float(cosine[mask == 1].min()), 6),
                             "row0_alone_vs_batched": float(np.abs(hidden[0] - alone[0]).max())})  # fmt: skip
    base = {(r["batch"]): r["ms"] for r in rows if r["variant"] == "int8 per tensor"}
    print(f"{'variant':<16} {'batch':>5} {'ms':>8} {'vs per-tensor':>13} {'cosine min':>10} {'row 0 moves':>11}")
    for r in rows:
        print(f"{r['variant']:<16} {r['batch']:>5} {r['ms']:>8.1f} {r['ms'] / base[r['batch']]:>12.2f}x "
              f"{r['cosine_min']:>10.6f} {r['row0_alone_vs_batched']:>11.2e}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "rewrite": changes, "threads": args.threads,
                                    "machine": machine_info()}, indent=2) + "\n")  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
