"""The CUDA provider: parity, generation with IO binding, reduced precisions. Skipped without CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeattn.config import ModelConfig
from edgeattn.exporters.export import export_model
from edgeattn.exporters.reference import eager_generate
from edgeattn.exporters.verify import verify_graphs
from edgeattn.model import build_model
from edgeattn.runtime import load

pytestmark = pytest.mark.cuda

CFG = ModelConfig(
    vocab_size=64, d_model=64, n_heads=4, d_ff=128, n_encoder_layers=2, n_decoder_layers=2, max_len=128, dropout=0.0
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("cuda") / "out"
    model = build_model(CFG, seed=0)
    export_model(model, out, precisions=["fp32-opt", "fp16"])
    return out, model


def test_float32_parity_on_cuda(exported):
    out, model = exported
    rt = load(out, providers=["CUDAExecutionProvider"])
    assert rt.providers[0] == "CUDAExecutionProvider" and rt.io_binding
    report = verify_graphs(model, rt)
    assert report.passed, report.table()


def test_generation_with_io_binding_matches_eager(exported):
    out, model = exported
    rt = load(out, providers=["CUDAExecutionProvider"])
    ids = np.random.default_rng(0).integers(3, 64, size=(4, 17), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1:, 12:] = 0
    for options in ({"strategy": "greedy"}, {"strategy": "beam", "num_beams": 3}):
        got = rt.generate(ids, mask, 20, **options)
        want = eager_generate(model, ids, mask, 20, **options)
        np.testing.assert_array_equal(got.tokens, want.tokens)


def test_cache_stays_on_the_device(exported):
    out, _ = exported
    rt = load(out, providers=["CUDAExecutionProvider"])
    ids = np.ones((2, 5), dtype=np.int64)
    stepper = rt.stepper(*rt.check_source(ids))
    stepper.step(np.full(2, CFG.bos_id, dtype=np.int64))
    value = next(iter(stepper.past.values()))
    assert value.device_name().lower() == "cuda"


def test_fixed_cache_is_written_in_place_on_the_device(exported):
    out, _ = exported
    rt = load(out, providers=["CUDAExecutionProvider"])
    ids = np.ones((2, 5), dtype=np.int64)
    stepper = rt.stepper(*rt.check_source(ids), capacity=4)
    before = {name: value.data_ptr() for name, value in stepper.cache.values.items()}
    stepper.step(np.full(2, CFG.bos_id, dtype=np.int64))
    stepper.reorder(np.array([1, 0]))
    stepper.step(np.full(2, 5, dtype=np.int64))
    for name, value in stepper.cache.values.items():
        assert value.device_name().lower() == "cuda" and value.data_ptr() == before[name]
        written = value.numpy()
        assert np.abs(written[:, :, :2]).sum() > 0 and not written[:, :, 2:].any()


def test_fp16_runs_on_cuda(exported):
    out, model = exported
    rt = load(out, providers=["CUDAExecutionProvider"], precision="fp16")
    ids = np.random.default_rng(1).integers(3, 64, size=(2, 9), dtype=np.int64)
    with torch.no_grad():
        ref = model.encode(torch.from_numpy(ids)).numpy()
    got = rt.encode(ids)
    cos = (got * ref).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(ref, axis=-1)
    assert cos.min() > 0.999


def test_cuda_graph_replays_give_the_same_output_as_plain_io_binding(exported):
    """A captured CUDA graph must recompute on new input contents and on a new shape."""
    from edgeattn.benchmark.bound import BoundRunner, CudaGraphRunner
    from edgeattn.runtime.session import CUDA, create_session

    out, _ = exported
    path = out / "encoder.fp32-opt.onnx"
    plain = BoundRunner(create_session(path, providers=[CUDA]), "cuda")
    graph = CudaGraphRunner(path, CFG.d_model, threads=1)
    rng = np.random.default_rng(3)
    for shape in ((2, 16), (2, 16), (4, 32)):  # new contents, then a new shape
        ids = rng.integers(3, 64, size=shape, dtype=np.int64)
        mask = np.ones_like(ids)
        mask[1:, shape[1] // 2 :] = 0
        want = plain.output(ids, mask)
        for _ in range(3):  # capture happens on an early run; later runs replay it
            np.testing.assert_allclose(graph.output(ids, mask), want, atol=1e-4)


def test_bench_on_cuda_times_io_bound_graph_and_eager_fp16_variants(exported, tmp_path):
    from edgeattn.benchmark.run import BenchOptions, run_benchmark

    out, _ = exported
    options = BenchOptions(shapes=((1, 16), (4, 32)), providers=("CUDAExecutionProvider",), repeats=3,
                           precisions=("fp32", "fp32-opt", "fp16"), peers=False)  # fmt: skip
    report, _ = run_benchmark(out, None, options, tmp_path / "b.json")
    names = set(report.variants)
    assert {"eager fp32 CUDA", "eager fp16 SDPA CUDA", "onnx fp16 CUDA", "onnx fp16 CUDA graph"} <= names
    assert not any(n.startswith("eager fp32") and "CUDA" not in n for n in names)  # no CPU variants
    assert len(report.rows) == 2 * len(names), report.skipped  # every variant at every shape
    assert all(r.timing.median > 0 for r in report.rows)
    assert "IO binding" in report.variants["onnx fp16 CUDA"]["note"]


def test_torch_free_process_runs_on_cuda(exported):
    """The runtime alone (no torch in the process) finds the CUDA libraries and runs there."""
    import subprocess
    import sys

    out, _ = exported
    code = (
        "import sys, numpy as np\n"
        "from edgeattn.runtime import load\n"
        f"m = load({str(out)!r}, providers=['CUDAExecutionProvider'])\n"
        "assert m.providers[0] == 'CUDAExecutionProvider', m.providers\n"
        "assert m.encode(np.ones((2, 7), dtype=np.int64)).shape == (2, 7, 64)\n"
        "assert 'torch' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_t5_fp16_stays_finite_on_cuda_where_a_plain_conversion_overflows(tmp_path):
    """A T5 whose feed-forward passes float16's range: a plain float16 conversion gives inf / NaN on
    the GPU, edgeattn's fp16 (those nodes kept float32) stays finite and close to float32."""
    pytest.importorskip("transformers")
    import onnx
    import onnxruntime as ort
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from edgeattn.exporters.compact import fold_transposes
    from tests.helpers.t5_folders import export_variant, overflowing_t5, t5_batch

    ids, mask = t5_batch()
    _, result, manifest = export_variant(tmp_path, overflowing_t5(), ["fp32-opt", "fp16"])
    source = fold_transposes(onnx.load(tmp_path / "out" / manifest.entry("encoder", "fp32-opt").file))
    naive = convert_float_to_float16(source, keep_io_types=True)
    plain = ort.InferenceSession(naive.SerializeToString(), providers=["CUDAExecutionProvider"])
    assert not np.isfinite(plain.run(None, {"input_ids": ids, "attention_mask": mask})[0]).all()
    fp16 = load(tmp_path / "out", precision="fp16", providers=["CUDAExecutionProvider"])
    fp32 = load(tmp_path / "out", providers=["CPUExecutionProvider"])
    got, want = fp16.encode(ids, mask), fp32.encode(ids, mask)
    assert np.isfinite(got).all() and result.gates["fp16"].passed
    cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cos[mask.astype(bool)].min() > 0.999
