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


@pytest.mark.parametrize("in_files", [False, True], ids=["held", "in-files"])
def test_a_weight_shared_between_graphs_keeps_its_view_over_one_aligned_region(tmp_path, in_files) -> None:
    """Two graphs holding the same weight (a decoder in both cache forms) store it once, page-aligned
    after a small shared tensor, and each graph's Reshape of it reads the same region (ONNX Runtime
    would otherwise fold the Reshape into a copy of its own); alike where each graph's weights are
    still in its own data file (a candidate kept in a file), read from there."""
    protos = {"a": _graph(), "b": _graph()}
    sources = None
    if in_files:
        sources = {}
        for name in protos:
            (tmp_path / name).mkdir()
            save_checked(_graph(), tmp_path / name / "g.onnx", external_threshold=0)
            protos[name] = onnx.load(str(tmp_path / name / "g.onnx"), load_external_data=False)
            sources[name] = [tmp_path / name / "g.onnx.data"]
    whole = tmp_path / "whole.onnx"
    onnx.save_model(_graph(), str(whole))
    moved = share_between(protos, tmp_path / "shared.data", sources)
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


def _external_copy(tmp_path) -> tuple[onnx.ModelProto, str]:
    """_graph() saved with every weight of 1 KB or more in its data file; the loaded graph, unread."""
    path = tmp_path / "g.onnx"
    save_checked(_graph(), path, external_threshold=0)
    return onnx.load(str(path), load_external_data=False), "g.onnx.data"


def test_a_compacted_data_file_keeps_only_what_the_graph_points_at(tmp_path) -> None:
    from edgeattn.exporters.compact import compact_data_file

    proto, data = _external_copy(tmp_path)
    reference = _run(str(tmp_path / "g.onnx"))
    size = (tmp_path / data).stat().st_size
    bias = next(t for t in proto.graph.initializer if t.name == "bias")
    bias.CopyFrom(numpy_helper.from_array(np.zeros(512, np.float32), "bias"))  # no longer in the file
    kept = compact_data_file(proto, tmp_path, data)
    assert kept == 512 * 512 * 4 and (tmp_path / data).stat().st_size < size
    offsets = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "offset"}
    assert all(int(o) % ALIGNMENT == 0 for o in offsets)
    onnx.save(proto, str(tmp_path / "g.onnx"))
    got = _run(str(tmp_path / "g.onnx"))
    np.testing.assert_allclose(got[0], reference[0] - numpy_helper.to_array(_graph().graph.initializer[0]),
                               rtol=1e-5, atol=1e-4)  # fmt: skip
    np.testing.assert_array_equal(got[1], reference[1])
    for tensor in proto.graph.initializer:  # nothing external left: the file goes
        if tensor.data_location == TensorProto.EXTERNAL:
            tensor.CopyFrom(numpy_helper.from_array(np.zeros(tuple(tensor.dims), np.float32), tensor.name))
    assert compact_data_file(proto, tmp_path, data) == 0 and not (tmp_path / data).exists()


def test_lazy_weights_are_read_from_their_file_when_used(tmp_path) -> None:
    from edgeattn.exporters.external_data import array_of, read_in_place

    proto, _ = _external_copy(tmp_path)
    inline = {t.name: numpy_helper.to_array(t) for t in _graph().graph.initializer}
    read_in_place(proto, tmp_path, lazy={"w"})
    by_name = {t.name: t for t in proto.graph.initializer}
    assert by_name["w"].data_location == TensorProto.EXTERNAL and by_name["bias"].HasField("raw_data")
    location = next(e.value for e in by_name["w"].external_data if e.key == "location")
    assert location == str((tmp_path / "g.onnx.data").resolve())
    for name in ("w", "bias"):
        np.testing.assert_array_equal(array_of(by_name[name]), inline[name])
    read_in_place(proto, tmp_path, lazy=set())
    assert all(t.data_location != TensorProto.EXTERNAL for t in proto.graph.initializer)
    np.testing.assert_array_equal(numpy_helper.to_array(by_name["w"]), inline["w"])


@pytest.mark.parametrize("head_bits", [4, 8])
def test_block_quantising_a_graph_with_external_weights_reads_them_lazily_alike(tmp_path, head_bits) -> None:
    """quantize_blockwise of a graph whose weights sit in its data file (read a product at a time)
    writes the very graph it writes from the same graph held inline."""
    from edgeattn.exporters.quantize import ConversionJob, quantize_blockwise

    rng = np.random.default_rng(2)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="inner"),
         helper.make_node("Add", ["h", "bias"], ["hb"]),
         helper.make_node("MatMul", ["hb", "w2"], ["y"], name="head")],
        "products",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 128])],
        [numpy_helper.from_array(rng.standard_normal((256, 512)).astype(np.float32), "w1"),
         numpy_helper.from_array(rng.standard_normal(512).astype(np.float32), "bias"),
         numpy_helper.from_array(rng.standard_normal((512, 128)).astype(np.float32), "w2")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inline, outside = tmp_path / "inline.onnx", tmp_path / "outside.onnx"
    onnx.save(model, str(inline))
    save_checked(model, outside, external_threshold=0)
    made = []
    for src in (inline, outside):
        dst = tmp_path / f"q-{src.name}"
        quantize_blockwise(src, dst, ConversionJob(), bits=4, block_size=32, accuracy_level=0,
                           head_bits=head_bits)  # fmt: skip
        made.append(onnx.load(str(dst)))
    for a, b in zip(*(sorted(m.graph.initializer, key=lambda t: t.name) for m in made), strict=True):
        assert a.name == b.name
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
    assert [n.op_type for n in made[0].graph.node] == [n.op_type for n in made[1].graph.node]
    assert "MatMulNBits" in {n.op_type for n in made[1].graph.node}
