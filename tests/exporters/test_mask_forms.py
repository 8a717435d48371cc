"""The fused encoder with its padding given as key lengths (the form ONNX Runtime's fast CUDA
attention takes), checked on the CPU: equal to the mask-matrix form on right-padded batches,
wrong on others, which the host-side check keeps it from."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from edgeattn.benchmark.memory import bench_inputs
from edgeattn.config import get_preset
from edgeattn.errors import EdgeattnError, ExportError
from edgeattn.exporters.export import export_model
from edgeattn.exporters.mask_forms import LENGTHS, MASK_INPUTS, lengths_form, lengths_form_bytes
from edgeattn.model import build_model
from edgeattn.runtime.padding import key_lengths, right_padded
from edgeattn.runtime.session import CPU, create_session

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    out = tmp_path_factory.mktemp("lengths") / "out"
    export_model(build_model(get_preset("tiny"), seed=0), out, graphs=["encoder"], verify=False,
                 precisions=["fp32-opt"])  # fmt: skip
    return out


def test_right_padding_is_told_apart_from_other_padding():
    right = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    assert right_padded(right) and key_lengths(right).tolist() == [3, 2, 1]
    assert key_lengths(right).dtype == np.int32
    assert not right_padded(right[:, ::-1])  # left padding
    assert not right_padded(np.array([[1, 0, 1]]))  # a hole
    assert not right_padded(np.array([[0, 1, 1]]))
    assert right_padded(np.ones((2, 1), np.int64)) and not right_padded(np.ones(3))


def _run(session, ids, mask):
    return session.run(None, {"input_ids": ids, "attention_mask": mask})[0]


def test_lengths_form_equals_the_mask_form_on_right_padding_only(export):
    path = export / "encoder.fp32-opt.onnx"
    rewritten = onnx.load_from_string(lengths_form_bytes(path))
    fused = [n for n in rewritten.graph.node if n.op_type in MASK_INPUTS]
    assert fused and all(n.input[MASK_INPUTS[n.op_type]] == LENGTHS for n in fused)
    produced = {o for n in rewritten.graph.node for o in n.output}
    used = {i for n in rewritten.graph.node for i in n.input} | {o.name for o in rewritten.graph.output}
    assert produced <= used  # the old mask path is gone
    matrix, lengths = create_session(path), create_session(rewritten.SerializeToString())
    rng = np.random.default_rng(0)
    for seq in (7, 19):  # lengths never used at export
        ids = rng.integers(4, get_preset("tiny").vocab_size, (3, seq)).astype(np.int64)
        right = np.ones_like(ids)
        right[1, seq - 3 :] = 0
        right[2, 2:] = 0
        real = right.astype(bool)
        np.testing.assert_allclose(_run(lengths, ids, right)[real], _run(matrix, ids, right)[real], atol=1e-5)
        left = right[:, ::-1].copy()
        wrong = np.abs(_run(lengths, ids, left) - _run(matrix, ids, left))[left.astype(bool)].max()
        assert wrong > 1e-2  # why the runtime must check the padding before it uses this form


def test_lengths_form_refuses_graphs_it_cannot_rewrite(export):
    with pytest.raises(ExportError, match="no fused attention node"):
        lengths_form(onnx.load(str(export / "encoder.onnx")))
    model = onnx.load(str(export / "encoder.fp32-opt.onnx"))
    node = next(n for n in model.graph.node if n.op_type in MASK_INPUTS)
    node.input[MASK_INPUTS[node.op_type]] = "input_ids"  # a mask computed from something else
    with pytest.raises(ExportError, match="not from attention_mask alone"):
        lengths_form(model)


def test_benchmark_times_the_lengths_form_on_right_padded_batches(export):
    from edgeattn.benchmark.latency import onnx_variants

    variants, skipped = onnx_variants(export, ["fp32-opt"], [CPU], threads=1, lengths=True)
    by_name = {v.name: v for v in variants}
    assert set(by_name) == {"onnx fp32-opt CPU", "onnx fp32-opt CPU lengths"}, skipped
    ids, mask = bench_inputs(get_preset("tiny").vocab_size, 3, 16)  # the benchmark's padding is on the right
    assert right_padded(mask) and not mask.all()
    got = by_name["onnx fp32-opt CPU lengths"].answer(ids, mask)["last_hidden_state"]
    want = by_name["onnx fp32-opt CPU"].answer(ids, mask)["last_hidden_state"]
    np.testing.assert_allclose(got[mask.astype(bool)], want[mask.astype(bool)], atol=1e-5)
    by_name["onnx fp32-opt CPU lengths"].run(ids, mask)
    with pytest.raises(EdgeattnError, match="right-padded batches only"):
        by_name["onnx fp32-opt CPU lengths"].run(ids, mask[:, ::-1].copy())
