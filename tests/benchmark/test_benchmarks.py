"""Benchmark smoke tests: tiny sizes, few runs; they check the report's fields, never the timings."""

from __future__ import annotations

import json
import time

import pytest

from edgeattn.benchmark.report import write_json
from edgeattn.config import get_preset
from edgeattn.families.seq2seq.generation_bench import bench_generation


@pytest.fixture(scope="module")
def tiny_export(shared_export):
    return shared_export("tiny")


def test_generation_benchmark_reports_every_position(tiny_export, tmp_path):
    result = bench_generation(tiny_export, positions=(4, 16), src_len=8, repeats=3, decode_tokens=8)
    assert [s.position for s in result.steps] == [4, 16]
    for step in result.steps:
        assert step.cached.median > 0 and step.recompute.median > 0 and step.cached.runs == 3
    assert result.cached_tokens_per_s > 0 and result.recompute_tokens_per_s > 0
    assert result.capacity == 17 and result.slots_tokens_per_s > 0  # the export has decoder_fixed
    assert all(step.slots is not None and step.slots.runs == 3 for step in result.steps)
    assert "recompute / cached" in result.table() and "slots (17) ms" in result.table()
    write_json(result, tmp_path / "g.json")
    data = json.loads((tmp_path / "g.json").read_text())
    assert data["machine"]["cores"] >= 1 and "onnxruntime" in data["machine"]
    assert data["steps"][1]["speedup"] > 0 and data["flatness"] > 0


@pytest.mark.parametrize("int8", [None, "int8", "uint8"])
def test_floor_graph_computes_every_projection_of_a_layer(int8):
    """The floor is timed on real products of the layer's shapes (``int8``: the weight type, None
    for float32): its outputs match numpy's."""
    import tempfile
    from pathlib import Path

    import numpy as np
    import onnx
    from onnx import numpy_helper

    from edgeattn.benchmark.floors import _layer_graph, projection_shapes
    from edgeattn.host import has_vnni
    from edgeattn.runtime.session import create_session

    if int8 == "int8" and not has_vnni():
        pytest.skip("full-range signed weights saturate the u8 x s8 kernels of CPUs without VNNI (int8 uses uint8)")
    config = get_preset("tiny")
    data = _layer_graph(config, int8 is not None, weights=int8)
    model = onnx.load_from_string(data)
    assert model.ir_version == 8  # what every supported onnxruntime loads (1.24 reads up to IR 13; onnx writes 14)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "layer.onnx"
        path.write_bytes(data)
        session = create_session(path)
    rng = np.random.default_rng(0)
    feeds = {f"x_{k}": rng.standard_normal((5, k)).astype(np.float32) for k, _ in projection_shapes(config)}
    outputs = session.run(None, feeds)
    assert len(outputs) == len(projection_shapes(config)) == 4
    three = onnx.load_from_string(_layer_graph(config, int8 is not None, weights=int8, layers=3))
    own_weights = {t.raw_data for t in three.graph.initializer if t.name[0] == "w"}  # every layer its own
    assert len(three.graph.output) == 12 and len(own_weights) == 12
    for i, ((k, n), y) in enumerate(zip(projection_shapes(config), outputs, strict=True)):
        w = weights[f"w{i}"].astype(np.float32)
        if int8:
            assert weights[f"w{i}"].dtype == np.dtype(int8)
            w = (w - weights[f"z{i}"].astype(np.float32)) * weights[f"s{i}"]
        expected = feeds[f"x_{k}"] @ w
        assert y.shape == (5, n)
        tol = 0.02 * np.abs(expected).max() if int8 else 1e-4
        np.testing.assert_allclose(y, expected, atol=tol)


@pytest.mark.parametrize("kind", ["int8-static", "int4"])
def test_converted_floor_graph_runs_the_precisions_kernels(kind, tmp_path):
    """The int8-static and int4 floors are the float32 layer through the export's own converter:
    they run that precision's kernels and still compute the layer's products."""
    from collections import Counter

    import numpy as np
    import onnx
    from onnx import numpy_helper

    from edgeattn.benchmark.floors import _converted_layer, _layer_graph, projection_shapes
    from edgeattn.runtime.session import create_session

    config = get_preset("tiny")
    path = _converted_layer(config, kind, tmp_path)
    cache = tmp_path / "optimized.onnx"
    session = create_session(path, optimized_cache=cache)
    ops = Counter(n.op_type for n in onnx.load(str(cache)).graph.node)
    expected_op = "MatMulIntegerToFloat" if kind == "int8-static" else "MatMulNBits"
    assert ops[expected_op] == len(projection_shapes(config)) and ops["MatMul"] == 0
    weights = {
        t.name: numpy_helper.to_array(t) for t in onnx.load_from_string(_layer_graph(config, False)).graph.initializer
    }
    rng = np.random.default_rng(0)
    feeds = {f"x_{k}": rng.standard_normal((5, k)).astype(np.float32) for k, _ in projection_shapes(config)}
    for i, ((k, _), y) in enumerate(zip(projection_shapes(config), session.run(None, feeds), strict=True)):
        expected = feeds[f"x_{k}"] @ weights[f"w{i}"]
        cosine = (y * expected).sum(-1) / np.linalg.norm(y, axis=-1) / np.linalg.norm(expected, axis=-1)
        assert y.shape == expected.shape and cosine.min() > 0.99, cosine  # quantisation noise, not another product


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
    for name, info in data["variants"].items():  # each variant alone in a fresh process, at 2 x 16
        assert info["memory_shape"] == "2x16", (name, info.get("memory_error"))
        assert 0 < info["baseline_rss_mb"] < info["peak_rss_mb"] and info["added_rss_mb"] > 0
    assert "peak MB" in result.stdout
    assert [(f["batch"], f["seq"]) for f in data["floors"]] == [(1, 8), (1, 16), (2, 8), (2, 16)]
    for f in data["floors"]:
        assert 0 < f["attention_ms"] < f["fp32_ms"] and f["int8_ms"] > f["attention_ms"] and f["fp32_ratio"] > 0
        # the attention core at ONNX Runtime's faster kernel, each kernel and the arithmetic alone beside it
        assert set(f["attention_kernels_ms"]) == {"fused", "unfused"}
        assert f["attention_ms"] == min(f["attention_kernels_ms"].values()) and f["attention_ceiling_ms"] > 0
    assert "floors (projections alone" in result.stdout
    for f in data["floors"]:  # every CPU precision's own kernels, each variant against its own floor
        assert set(f["kinds"]) == {"fp32", "int8", "int8-static", "int4"} and min(f["kinds"].values()) > 0
    held = {r["variant"] for r in data["rows"] if r["floor_ratio"] is not None}
    assert held == {"onnx fp32 CPU", "onnx fp32-opt CPU", "onnx int8 CPU", "onnx int8-static CPU", "onnx int4 CPU"}
    assert "time / the variant's own floor" in result.stdout
    # every ONNX variant's encoder states against eager float32 (the OpenVINO ones too, where they run)
    agreement = data["agreement"]
    assert "eager PyTorch float32" in data["agreement_note"] and "eager fp32" not in agreement
    assert agreement["onnx fp32 CPU"]["max_abs"] < 1e-4 and agreement["onnx fp32-opt CPU"]["max_abs"] < 1e-4
    assert 0.99 < agreement["onnx int8 CPU"]["cosine_min"] < 1.0
    assert data["generation"]["steps"] and data["generation"]["cached_tokens_per_s"] > 0
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ratio = median / eager fp32" in result.stdout


def test_memory_probe_counts_the_variants_own_memory_not_its_parents(tmp_path):
    """A 40 MB embedding table shows up in the child's added memory; the 400 MB this (parent)
    process holds does not leak into the child's peak."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgeattn.benchmark.memory import measure_peak, onnx_probe

    table = np.random.default_rng(0).standard_normal((10_000, 1024)).astype(np.float32)  # 41 MB
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["rows"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "axis"], ["m3"]),
        helper.make_node("Mul", ["rows", "m3"], ["last_hidden_state"]),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "s"]) for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["b", "s", 1024])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array([-1], np.int64), "axis")],
    )  # fmt: skip
    path = tmp_path / "table.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    ballast = np.ones(100_000_000, dtype=np.float32)  # 400 MB resident in this process
    peak = measure_peak(onnx_probe(str(path), "CPUExecutionProvider", 1), 2, 16, vocab_size=10_000)
    assert ballast.sum() > 0
    assert 38 < peak["added_mb"] < 300, peak
    assert peak["peak_mb"] < 350, peak


def test_io_bound_runner_matches_a_plain_run(tiny_export):
    """IO binding on the CPU device: same output as session.run, for two shapes in turn."""
    import numpy as np

    from edgeattn.benchmark.bound import BoundRunner
    from edgeattn.runtime.session import create_session

    session = create_session(tiny_export / "encoder.onnx")
    runner = BoundRunner(session, "cpu")
    rng = np.random.default_rng(0)
    for shape in ((1, 16), (3, 8), (1, 16)):
        ids = rng.integers(3, 50, size=shape, dtype=np.int64)
        mask = np.ones_like(ids)
        mask[1:, shape[1] // 2 :] = 0
        want = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask})[0]
        np.testing.assert_array_equal(runner.output(ids, mask), want)


def test_a_variant_that_fails_at_one_shape_is_reported_and_the_rest_are_timed():
    """A variant that raises (a refused CUDA-graph capture, a shape a provider rejects) is named in
    ``skipped`` with its error for that shape; every other figure is still measured."""
    from edgeattn.benchmark.latency import Variant, bench_latency
    from edgeattn.errors import EdgeattnError

    def fine(ids, mask):
        return ids.sum()

    def refuses_long(ids, mask):
        if ids.shape[1] > 8:
            raise RuntimeError("capture refused")
        return ids.sum()

    config = get_preset("tiny")
    variants = [Variant("base", fine), Variant("fragile", refuses_long)]
    report = bench_latency(variants, config, [(1, 8), (2, 16)], threads=1, repeats=2, warmup=1,
                           floors=False, memory=False)  # fmt: skip
    timed = {(r.variant, r.batch, r.seq) for r in report.rows}
    assert timed == {("base", 1, 8), ("fragile", 1, 8), ("base", 2, 16)}
    assert report.skipped == {"fragile at 2x16": "failed: capture refused"}
    assert "skipped fragile at 2x16: failed: capture refused" in report.table()
    assert "-" in report.table().splitlines()[3]  # the fragile row has no 2x16 figure

    with pytest.raises(EdgeattnError, match="baseline fragile failed at 2x16"):
        bench_latency([Variant("fragile", refuses_long)], config, [(2, 16)], threads=1, repeats=1,
                      floors=False, memory=False)  # fmt: skip


def test_a_provider_onnx_runtime_leaves_out_is_skipped_not_timed_on_the_cpu(tiny_export, monkeypatch):
    """When ONNX Runtime builds a session without the provider asked for (it falls back to the CPU
    when CUDA's libraries are missing), the variant is skipped with the reason, never timed under
    the provider's name."""
    import onnxruntime as ort

    from edgeattn.benchmark.latency import onnx_variants

    real = ort.get_available_providers
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", *real()])
    variants, skipped = onnx_variants(tiny_export, ["fp32"], ["CUDAExecutionProvider"], threads=1)
    assert variants == []
    assert "did not register CUDAExecutionProvider" in skipped["onnx fp32 CUDA"]


def test_soak_answers_every_concurrent_call_like_the_serial_one(tiny_export):
    """A few seconds of the soak benchmark: encode and generate from 4 threads, every answer checked."""
    from edgeattn.benchmark.soak import soak

    report = soak(tiny_export, threads=4, seconds=3)
    assert report.errors == 0 and report.mismatches == 0, report.first_errors
    assert report.requests > 20 and set(report.kinds) == {"encode", "generate"}
    assert report.p99_ms >= report.p50_ms > 0 and report.rss_end_mb > 0
    assert "errors 0, answers unlike the serial ones 0" in report.table()


def test_soak_counts_a_wrong_answer(tiny_export, monkeypatch):
    """The check can fail: a model whose answers drift is reported, not passed."""
    from edgeattn.benchmark import soak as soak_module

    calls = {"n": 0}
    real = soak_module._answer

    def drifting(model, request):
        calls["n"] += 1
        got = real(model, request)
        return got + 1 if calls["n"] % 5 == 0 else got

    monkeypatch.setattr(soak_module, "_answer", drifting)
    report = soak_module.soak(tiny_export, threads=2, seconds=1)
    assert report.mismatches > 0 and "answer unlike the serial one" in report.first_errors[0]


def test_interleaving_shuffles_so_no_variant_always_follows_the_same_one():
    """A variant's run can slow the next one (eager PyTorch's spinning OpenMP threads): each round
    runs the variants in a new order, so a variant follows different ones from round to round,
    and the same seed gives the same orders."""
    from edgeattn.benchmark.timing import interleaved

    names = ["eager", "a", "b", "c", "d"]

    def calls_of(seed: int) -> list[str]:
        calls: list[str] = []
        timings = interleaved({n: (lambda n=n: calls.append(n)) for n in names}, repeats=20, warmup=1, seed=seed)
        assert all(timings[n].runs == 20 for n in names)
        return calls

    calls = calls_of(0)
    assert calls[: len(names)] == names  # the warm-up round, in order
    timed = calls[len(names) :]
    rounds = [tuple(timed[i : i + len(names)]) for i in range(0, len(timed), len(names))]
    assert all(sorted(r) == sorted(names) for r in rounds) and len(set(rounds)) > 10
    for n in names:  # every variant is preceded by at least three different ones over 20 rounds
        before = {timed[i - 1] for i in range(1, len(timed)) if timed[i] == n}
        assert len(before) >= 3, (n, before)
    assert calls_of(0) == calls and calls_of(1) != calls


def test_interleaving_waits_out_a_variant_that_keeps_the_cores_busy():
    """``settle``: the run after such a variant starts that long after it returned, untimed."""
    from edgeattn.benchmark.timing import interleaved

    ends: dict[str, float] = {}
    gaps: list[float] = []

    def run(name: str) -> None:
        if "eager" in ends:
            gaps.append(time.perf_counter() - ends.pop("eager"))
        if name == "eager":
            ends["eager"] = time.perf_counter()

    timings = interleaved({n: (lambda n=n: run(n)) for n in ("eager", "a", "b")}, repeats=6, warmup=1,
                          settle={"eager": 0.01})  # fmt: skip
    assert len(gaps) >= 5 and min(gaps) >= 0.01
    assert timings["a"].median < 5  # ms: the wait is not in anyone's timing


@pytest.mark.parametrize("fused", [True, False])
def test_attention_floor_graphs_compute_attention(fused):
    """The floor's attention cores are real attention, softmax(q k^T) v, by either kernel (the
    fused one with its padding mask honoured), chained layer after layer."""
    import numpy as np

    from edgeattn.benchmark.floors import _attention_graph
    from edgeattn.runtime.session import create_session

    config = get_preset("tiny")
    b, s, h, d = 2, 6, config.n_heads, config.head_dim
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(3))
    mask = np.ones((b, s), np.int32)
    mask[1, 4:] = 0

    def attend(q: np.ndarray) -> np.ndarray:  # (B, H, S, D)
        scores = q @ k.transpose(0, 1, 3, 2) + (0 if not fused else np.where(mask[:, None, None, :] > 0, 0, -1e9))
        p = np.exp(scores - scores.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ v

    for layers in (1, 3):
        want = q
        for _ in range(layers):
            want = attend(want)
        session = create_session(_attention_graph(config, fused, layers), threads=1)
        if fused:
            feeds = {n: x.transpose(0, 2, 1, 3).reshape(b, s, h * d) for n, x in zip("qkv", (q, k, v), strict=True)}
            got = session.run(None, {**feeds, "mask": mask})[0].reshape(b, s, h, d).transpose(0, 2, 1, 3)
        else:
            got = session.run(None, {"q": q, "kt": k.transpose(0, 1, 3, 2).copy(), "v": v})[0]
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_paired_timing_cancels_the_load_order():
    """On a made-up clock B takes half A's time and whichever variant is loaded second runs 10%
    faster: pairing in both load orders gives B / A = 0.5 and reports the 0.9 order effect, where
    one order alone would say 0.45 or 0.55."""
    from edgeattn.benchmark.paired import paired

    now = [0.0]
    loads = [0]

    def loader(cost: float):
        def load():
            loads[0] += 1
            factor = 0.9 if loads[0] % 2 == 0 else 1.0  # the second load of each order

            def call() -> None:
                now[0] += cost * factor

            return call

        return load

    result = paired(loader(1.0), loader(0.5), pairs=11, warmup=2, clock=lambda: now[0])
    assert loads[0] == 4  # each variant loaded once per order
    assert result.ratio == pytest.approx(0.5) and result.order_effect == pytest.approx(0.9)
    assert result.a_ms == pytest.approx(950.0) and result.b_ms == pytest.approx(475.0)


def test_serving_load_counts_failed_requests_apart_from_answered_ones():
    """A request that raises is an error, not throughput: the rate and the latencies are the
    answered requests', and the table shows the errors."""
    from edgeattn.serving.traffic import ServingBench, _row, drive

    def call(thread: int, text: str) -> None:
        if text == "too long":
            raise ValueError(text)
        time.sleep(0.002)

    result = drive(call, ["fine", "too long", "fine", "fine"], concurrency=2, duration=0.2)
    latencies, elapsed, errors = result
    assert errors > 0 and latencies and min(latencies) >= 0.002  # every failure was instant: none is timed
    row = _row("m", "classify", "embedded runtime", 2, result, None)
    assert row.requests == len(latencies) and row.errors == errors
    assert row.rps == pytest.approx(len(latencies) / elapsed, rel=0.01)
    table = ServingBench(rows=[row]).table()
    assert table.splitlines()[0].split()[-1] == "errors" and table.splitlines()[-1].split()[-1] == str(errors)


def test_bf16_is_not_timed_as_a_graph_of_its_own(tiny_export):
    """bf16's graphs are fp32's, run by OpenVINO with a bf16 hint: the benchmark times that as an
    fp32 variant on OpenVINO, never a bf16 row on another provider (it would be float32 there)."""
    from edgeattn.benchmark.latency import onnx_variants

    variants, skipped = onnx_variants(tiny_export, ["bf16"], ["CPUExecutionProvider"], threads=1)
    assert variants == [] and "timed as fp32 on OpenVINOExecutionProvider" in skipped["onnx bf16 CPU"]
