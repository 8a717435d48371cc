"""Benchmark smoke tests: tiny sizes, few runs; they check the report's fields, never the timings."""

from __future__ import annotations

import json

import pytest

from edgeattn.benchmark.generation import bench_generation, write_json
from edgeattn.config import get_preset
from edgeattn.exporters.package import export_model
from edgeattn.model import build_model


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "out"
    export_model(build_model(get_preset("tiny"), seed=0), out, verify=False)
    return out


def test_generation_benchmark_reports_every_position(tiny_export, tmp_path):
    result = bench_generation(tiny_export, positions=(4, 16), src_len=8, repeats=3, decode_tokens=8)
    assert [s.position for s in result.steps] == [4, 16]
    for step in result.steps:
        assert step.cached.median > 0 and step.recompute.median > 0 and step.cached.runs == 3
    assert result.cached_tokens_per_s > 0 and result.recompute_tokens_per_s > 0
    assert "recompute / cached" in result.table()
    write_json(result, tmp_path / "g.json")
    data = json.loads((tmp_path / "g.json").read_text())
    assert data["machine"]["cores"] >= 1 and "onnxruntime" in data["machine"]
    assert data["steps"][1]["speedup"] > 0 and data["flatness"] > 0


def test_bench_command_smoke(tmp_path):
    """The whole `edgeattn bench` path on a tiny preset: every variant timed, JSON and PNG written."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "edgeattn.cli", "bench", "--preset", "tiny", "--batch", "1,2", "--seq", "8,16",
         "--repeats", "3", "--json", "b.json", "--plot", "b.png", "--generation"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "b.json").read_text())
    names = set(data["variants"])
    assert {"eager fp32", "eager fp32 SDPA", "onnx fp32 CPU", "onnx fp32-opt CPU", "onnx int8 CPU",
            "onnx int8-static CPU", "onnx int4 CPU"} <= names  # fmt: skip
    for name in names:
        rows = [r for r in data["rows"] if r["variant"] == name]
        assert len(rows) == 4
        for r in rows:
            assert r["timing"]["median"] > 0 and r["tokens_per_s"] > 0 and r["gflops"] > 0
    assert data["gemm_ceiling_gflops"] > 0 and data["machine"]["cores"] >= 1
    assert data["generation"]["steps"] and data["generation"]["cached_tokens_per_s"] > 0
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ratio = median / eager fp32" in result.stdout
