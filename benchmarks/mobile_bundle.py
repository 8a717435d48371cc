"""The mobile bundle (``edgeattn package --target mobile``) of a MiniLM-shaped and a BERT-base-shaped
encoder (random weights) at fp32 and int8: each ORT file's size beside its self-contained ONNX
graph, the kernels it needs, the time ONNX Runtime takes to create a session from each (median of
3), its answers against the export, and the time packaging took. Prints the table, writes the JSON.

    python benchmarks/mobile_bundle.py [--models minilm,bert-base] [--out FILE]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx

from edgeattn.benchmark.machine import machine_info
from edgeattn.benchmark.report import publish
from edgeattn.benchmark.results_page import bundle_table
from edgeattn.config import get_preset
from edgeattn.exporters.export import export_model
from edgeattn.exporters.mobile import package_mobile
from edgeattn.model import build_model
from edgeattn.runtime.layout import graph_file
from edgeattn.runtime.manifest import check_file, read_manifest
from edgeattn.runtime.session import create_session

SHAPES = {
    "minilm": {"d_model": 384, "n_heads": 12, "d_ff": 1536, "n_encoder_layers": 6},
    "bert-base": {},
}


@dataclass
class BundleBench:
    rows: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"benchmark": "mobile bundle", "machine": machine_info(), "rows": self.rows}

    def table(self) -> str:
        return bundle_table(self.to_dict())


def _load_ms(path: Path, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        create_session(path, threads=2)
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 1)


def measure(name: str, work: Path) -> list[dict]:
    config = replace(get_preset("bert-base"), **SHAPES[name], max_len=128)
    export = work / name
    export_model(build_model(config, seed=0), export, graphs=["encoder"], precisions=["int8"], verify=False)
    start = time.perf_counter()
    bundle = package_mobile(export, work / f"{name}-mobile")
    seconds = time.perf_counter() - start
    manifest = read_manifest(export)
    rows = []
    for f in bundle.files:
        whole = work / "whole" / graph_file(f.graph, f.precision)
        whole.parent.mkdir(exist_ok=True)
        source = check_file(export, manifest.entry(f.graph, f.precision))
        onnx.save_model(onnx.load(str(source)), str(whole))  # self-contained, as the ORT file is
        rows.append({"model": name, "file": f.file, "precision": f.precision, "onnx_bytes": whole.stat().st_size,
                     "ort_bytes": f.bytes, "kernels": len(f.operators), "max_abs": f.max_abs,
                     "load_ms_onnx": _load_ms(whole), "load_ms_ort": _load_ms(work / f"{name}-mobile" / f.file),
                     "package_seconds": round(seconds, 1), "config_kernels": len(bundle.operators)})  # fmt: skip
        logging.info("%s", rows[-1])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SHAPES))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mobile-bundle.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [row for name in args.models.split(",") for row in measure(name, Path(tmp))]
    publish(BundleBench(rows), args.out)


if __name__ == "__main__":
    main()
