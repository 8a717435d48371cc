"""The targets' lint (what ONNX Runtime 1.30, which onnxruntime-web and -node run, cannot run,
found node by node before a bundle is written) and the split of a graph's weights into files
under the browser's size limit."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeattn.errors import ExportError
from edgeattn.exporters.kernel_table import read_table
from edgeattn.exporters.target_lint import lint, summary, webgpu_gaps
from edgeattn.exporters.web import write_graph

pytestmark = pytest.mark.quick


def _model(nodes, inputs, outputs, initializers=(), opsets=(("", 17),)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _value(name: str, elem: int, shape=(2, 3)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


def test_the_table_is_onnx_runtime_1_30s_cpu_kernels():
    table = read_table()
    assert table["onnxruntime"] == "1.30.0" and table["provider"] == "CPUExecutionProvider"
    assert len(table["kernels"]) > 250 and "com.microsoft::MatMulNBits" in table["kernels"]
    gqa = table["schemas"]["com.microsoft::GroupQueryAttention"][-1]
    assert gqa["max_inputs"] == 16  # onnxruntime 1.32 added a 17th (query_seqlens)


def test_a_graph_the_target_runs_has_no_findings():
    x = _value("x", TensorProto.FLOAT)
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"), helper.make_node("Softmax", ["y"], ["z"]),
             helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.ones(1, np.float32))),
             helper.make_node("Add", ["z", "one"], ["p"])]  # Constant: an initializer once loaded, no kernel
    assert lint(_model(nodes, [x], [_value("p", TensorProto.FLOAT, (2, 4))], [w])) == []


def test_the_lint_names_inputs_types_operators_and_domains_the_target_lacks():
    f = _value("x", TensorProto.FLOAT, (1, 2, 16))
    ints = _value("i", TensorProto.INT32)
    gqa = helper.make_node("GroupQueryAttention", ["x"] * 16 + ["seqlens"], ["a"], name="gqa", domain="com.microsoft",
                           num_heads=1, kv_num_heads=1)  # fmt: skip
    sin = helper.make_node("Sin", ["i"], ["s"], name="sin_of_ints")  # Sin's kernels take float and double
    made_up = helper.make_node("Frobnicate", ["x"], ["m"], name="made_up", domain="com.example")
    model = _model([gqa, sin, made_up], [f, ints], [_value("a", TensorProto.FLOAT), _value("s", TensorProto.INT32)],
                   opsets=(("", 17), ("com.microsoft", 1)))  # fmt: skip
    found = {f.node: f.reason for f in lint(model)}
    assert "17 inputs" in found["gqa"] and "takes 7 to 16" in found["gqa"]
    assert "do not take its types (T=tensor(int32))" in found["sin_of_ints"]
    assert "imports no opset of the domain com.example" in found["made_up"]
    assert "gqa (com.microsoft::GroupQueryAttention)" in summary(lint(model))


def test_contrib_outputs_carry_their_types_to_the_nodes_after_them():
    """ONNX's inference does not know ONNX Runtime's operators: the table's schemas type their outputs."""
    x = _value("x", TensorProto.FLOAT, (2, 8))
    nodes = [helper.make_node("FastGelu", ["x"], ["g"], domain="com.microsoft"),
             helper.make_node("Cast", ["g"], ["c"], to=TensorProto.INT32),
             helper.make_node("Sin", ["c"], ["s"], name="sin_after")]  # fmt: skip
    model = _model(nodes, [x], [_value("s", TensorProto.INT32, (2, 8))], opsets=(("", 17), ("com.microsoft", 1)))
    assert [f.node for f in lint(model)] == ["sin_after"]


def test_weights_over_the_limit_split_into_files_that_load_as_one(tmp_path):
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((32, 32)).astype(np.float32) for _ in range(5)]  # 4 KB each
    nodes, x = [], "x"
    for i in range(5):
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]))
        x = f"h{i}"
    model = _model(nodes, [_value("x", TensorProto.FLOAT, (2, 32))], [_value(x, TensorProto.FLOAT, (2, 32))],
                   [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)])  # fmt: skip
    feed = {"x": rng.standard_normal((2, 32)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feed)[0]
    entry = write_graph(onnx.ModelProto.FromString(model.SerializeToString()), tmp_path, "onnx/model.onnx", 9_000)
    files = [tmp_path / d["file"] for d in entry["external_data"]]
    assert len(files) == 3 and all(f.stat().st_size <= 9_000 for f in files), entry
    assert (tmp_path / "onnx/model.onnx").stat().st_size < 9_000
    got = ort.InferenceSession(str(tmp_path / "onnx/model.onnx")).run(None, feed)[0]
    np.testing.assert_array_equal(got, want)
    small = write_graph(model, tmp_path, "onnx/whole.onnx")  # under the 2 GB limit: one file
    assert "external_data" not in small
    with pytest.raises(ExportError, match="the tensor w0 alone is"):
        write_graph(onnx.ModelProto.FromString(model.SerializeToString()), tmp_path / "b", "m.onnx", 3_000)


def test_what_the_webgpu_build_refuses_is_named():
    x = _value("x", TensorProto.FLOAT, (1, 4, 8))
    mha = [helper.make_node("MultiHeadAttention", ["x", "x", "x", "", m], ["y"], name=f"mha_{m or 'plain'}",
                            domain="com.microsoft", num_heads=2) for m in ("mask", "")]  # fmt: skip
    gbq = helper.make_node("GatherBlockQuantized", ["t", "i", "s"], ["e"], name="table", domain="com.microsoft")
    model = _model([*mha, gbq], [x], [_value("y", TensorProto.FLOAT)], opsets=(("", 17), ("com.microsoft", 1)))
    found = {f.node: f.reason for f in webgpu_gaps(model)}
    assert set(found) == {"mha_mask", "table"}  # a MultiHeadAttention without the mask runs
    assert "key_padding_mask" in found["mha_mask"] and "no kernel" in found["table"]
