"""Weights written outside a graph: large ones page-aligned (ONNX Runtime maps them), a reshape of
a stored weight written as a view over the same bytes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeattn.exporters.compact import share_between
from edgeattn.exporters.external_data import ALIGNMENT, _reshaped, weight_views
from edgeattn.exporters.onnx_export import save_checked

pytestmark = pytest.mark.quick


def _graph() -> onnx.ModelProto:
    """y = x @ W, rows = Gather(Reshape(W, (256, -1)), ids): W (512, 512) float32 is 1 MiB, after
    a 2 KB weight that leaves the next offset unaligned."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 512)).astype(np.float32)
    bias = rng.standard_normal(512).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "bias"], ["y"]),
        helper.make_node("Reshape", ["w", "table_shape"], ["table"]),
        helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
    ]
    graph = helper.make_graph(
        nodes,
        "views",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 512]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["k"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 512]),
         helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["k", 1024])],
        [numpy_helper.from_array(bias, "bias"), numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(np.array([256, -1], np.int64), "table_shape")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(path: str) -> list[np.ndarray]:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((3, 512)).astype(np.float32)
    return session.run(None, {"x": x, "ids": np.array([0, 255, 7], np.int64)})


def test_reshaped_dims_follow_onnx_reshape() -> None:
    assert _reshaped([512, 512], np.array([256, -1])) == [256, 1024]
    assert _reshaped([4, 6, 8], np.array([0, -1])) == [4, 48]
    assert _reshaped([4, 6], np.array([5, -1])) is None  # 24 does not split into rows of 5
    assert _reshaped([4, 6], np.array([-1, -1])) is None
    assert _reshaped([4, 6], np.array([0, 0, 0])) is None  # a zero past the input's rank


def test_view_shares_the_weights_bytes_and_large_offsets_are_aligned(tmp_path) -> None:
    whole = tmp_path / "whole.onnx"
    onnx.save_model(_graph(), str(whole))
    split = tmp_path / "split.onnx"
    files = save_checked(_graph(), split, external_threshold=0)
    assert files == [split, tmp_path / "split.onnx.data"]
    saved = onnx.load(str(split), load_external_data=False)
    assert "Reshape" not in [n.op_type for n in saved.graph.node]
    regions = {t.name: {e.key: e.value for e in t.external_data} for t in saved.graph.initializer}
    assert regions["table"] == regions["w"]  # one region, two shapes
    assert int(regions["w"]["offset"]) % ALIGNMENT == 0 and int(regions["bias"]["offset"]) == 0
    assert "table_shape" not in regions  # the shape is gone with its Reshape
    # W once on disk (its 1 MiB, the 2 KB bias, the padding before W)
    assert (tmp_path / "split.onnx.data").stat().st_size == int(regions["w"]["offset"]) + 512 * 512 * 4
    for got, want in zip(_run(str(split)), _run(str(whole)), strict=True):
        np.testing.assert_array_equal(got, want)


def test_small_weights_and_graph_outputs_stay_reshapes() -> None:
    model = _graph()
    assert weight_views(model, min_bytes=2 << 20) == {}  # below the size asked for
    model.graph.output.append(helper.make_tensor_value_info("table", TensorProto.FLOAT, [256, 1024]))
    assert weight_views(model) == {}  # a graph output is computed, not stored
    assert weight_views(_graph()) == {"table": "w"}


def test_a_weight_shared_between_graphs_keeps_its_view_over_one_aligned_region(tmp_path) -> None:
    """Two graphs holding the same weight (a decoder in both cache forms) store it once, page-aligned
    after a small shared tensor, and each graph's Reshape of it reads the same region (ONNX Runtime
    would otherwise fold the Reshape into a copy of its own)."""
    protos = {"a": _graph(), "b": _graph()}
    whole = tmp_path / "whole.onnx"
    onnx.save_model(_graph(), str(whole))
    moved = share_between(protos, tmp_path / "shared.data")
    assert set(moved) == {"a", "b"}
    for name, proto in protos.items():
        assert "Reshape" not in [n.op_type for n in proto.graph.node]
        regions = {t.name: {e.key: e.value for e in t.external_data} for t in proto.graph.initializer}
        assert regions["table"] == regions["w"]
        assert int(regions["w"]["offset"]) % ALIGNMENT == 0
        path = tmp_path / f"{name}.onnx"
        onnx.save_model(proto, str(path))
        for got, want in zip(_run(str(path)), _run(str(whole)), strict=True):
            np.testing.assert_array_equal(got, want)
    # W and the bias once on disk
    assert (tmp_path / "shared.data").stat().st_size <= 512 * 512 * 4 + ALIGNMENT
