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


@pytest.mark.parametrize("int8", [False, True])
def test_floor_graph_computes_every_projection_of_a_layer(int8):
    """The floor is timed on real products of the layer's shapes: its outputs match numpy's."""
    import tempfile
    from pathlib import Path

    import numpy as np
    import onnx
    from onnx import numpy_helper

    from edgeattn.benchmark.floors import _layer_graph, projection_shapes
    from edgeattn.runtime.session import create_session

    config = get_preset("tiny")
    data = _layer_graph(config, int8)
    model = onnx.load_from_string(data)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "layer.onnx"
        path.write_bytes(data)
        session = create_session(path)
    rng = np.random.default_rng(0)
    feeds = {f"x_{k}": rng.standard_normal((5, k)).astype(np.float32) for k, _ in projection_shapes(config)}
    outputs = session.run(None, feeds)
    assert len(outputs) == len(projection_shapes(config)) == 4
    for i, ((k, n), y) in enumerate(zip(projection_shapes(config), outputs, strict=True)):
        w = weights[f"w{i}"].astype(np.float32) * (weights[f"s{i}"] if int8 else 1.0)
        expected = feeds[f"x_{k}"] @ w
        assert y.shape == (5, n)
        tol = 0.02 * np.abs(expected).max() if int8 else 1e-4
        np.testing.assert_allclose(y, expected, atol=tol)


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
    assert [(f["batch"], f["seq"]) for f in data["floors"]] == [(1, 8), (1, 16), (2, 8), (2, 16)]
    for f in data["floors"]:
        assert 0 < f["attention_ms"] < f["fp32_ms"] and f["int8_ms"] > f["attention_ms"] and f["fp32_ratio"] > 0
    assert "floors (projections alone" in result.stdout
    assert data["generation"]["steps"] and data["generation"]["cached_tokens_per_s"] > 0
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ratio = median / eager fp32" in result.stdout
