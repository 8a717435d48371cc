"""A session's mapped weights: pages read at load and kept are dropped from the process, a table
read by row is read by row, and the answers stay those of the weights held in memory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeattn.exporters.external_data import write_external_data
from edgeattn.runtime.mapped_weights import file_mappings, release_mapped_weights, row_tables
from edgeattn.runtime.onnx_bytes import row_read_only
from edgeattn.runtime.session import create_session, external_data_files

pytestmark = [
    pytest.mark.quick,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the mapped pages are Linux's"),
]

N, K, BLOCK, ROWS, WIDTH = 4096, 2048, 32, 8192, 128


def _graph() -> onnx.ModelProto:
    """y = MatMulNBits(x, 4-bit W (4 MiB), scales (1 MiB)); rows = Gather(table (4 MiB), ids)."""
    rng = np.random.default_rng(0)
    blocks = K // BLOCK
    packed = rng.integers(0, 256, (N, blocks, BLOCK // 2), dtype=np.uint8)
    scales = (rng.random(N * blocks, dtype=np.float32) + 0.5) / 64
    table = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    nodes = [
        helper.make_node("MatMulNBits", ["x", "w", "scales"], ["y"], domain="com.microsoft", K=K, N=N, bits=4,
                         block_size=BLOCK, accuracy_level=4),
        helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "mapped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", K]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["k"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", N]),
         helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["k", WIDTH])],
        [numpy_helper.from_array(packed, "w"), numpy_helper.from_array(scales, "scales"),
         numpy_helper.from_array(table, "table")],
    )  # fmt: skip
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def _inputs() -> dict[str, np.ndarray]:
    x = np.random.default_rng(1).standard_normal((2, K)).astype(np.float32)
    return {"x": x, "ids": np.array([5, ROWS - 1, 4000], np.int64)}


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mapped") / "g.onnx"
    write_external_data(_graph(), path, "g.onnx.data")
    with open(path.parent / "g.onnx.data", "rb+") as f:  # written back: clean pages the kernel may drop
        os.fsync(f.fileno())
    return path


def test_kept_pages_dropped_tables_read_by_row_answers_unchanged(split) -> None:
    data = split.parent / "g.onnx.data"
    assert external_data_files(split) == [data]
    session = create_session(split, threads=1)
    maps = file_mappings([data])
    offsets = {t.name: int(t.external_data[1].value) for t in onnx.load(str(split), load_external_data=False)
               .graph.initializer}  # fmt: skip
    by_offset = {m.offset: m for m in maps}
    scales, table = by_offset[offsets["scales"]], by_offset[offsets["table"]]
    assert scales.rss == 0  # read at load, kept beside the packed weight: dropped from the process
    assert "rr" in table.flags  # not read at load: marked to be read by row

    want = ort.InferenceSession(_graph().SerializeToString(), providers=["CPUExecutionProvider"]).run(None, _inputs())
    got = session.run(None, _inputs())
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    table = {m.offset: m for m in file_mappings([data])}[offsets["table"]]
    assert table.rss <= 3 * 64 * 1024, f"three rows of the table brought {table.rss >> 10} KiB in"


def test_nothing_to_release_where_nothing_is_mapped(tmp_path) -> None:
    assert release_mapped_weights([tmp_path / "absent.onnx.data"]).dropped == 0
    assert external_data_files(tmp_path / "absent.onnx") == []
    (tmp_path / "model.ort").write_bytes(b"\x10\x00\x00\x00ORTM")  # not an ONNX protobuf
    assert external_data_files(tmp_path / "model.ort") == []


def test_only_tables_read_by_row_lose_their_read_ahead(tmp_path) -> None:
    """A weight every call reads whole (position embeddings added to the input) keeps its cached
    pages and read-ahead; the gather's table is read by row; a table another node also reads whole
    is not a table read by row."""
    rng = np.random.default_rng(2)
    positions = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    table = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "positions"], ["y"]),
         helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)],
        "whole_and_rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, WIDTH]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["k"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, WIDTH]),
         helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["k", WIDTH])],
        [numpy_helper.from_array(positions, "positions"), numpy_helper.from_array(table, "table")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert row_read_only(model.SerializeToString()) == {"table"}
    path = tmp_path / "g.onnx"
    write_external_data(model, path, "g.onnx.data")
    data = path.parent / "g.onnx.data"
    with open(data, "rb+") as f:
        os.fsync(f.fileno())
    assert [(t.offset, t.length) for t in row_tables(path)] == [(ROWS * WIDTH * 4, ROWS * WIDTH * 4)]
    session = create_session(path, threads=1)
    by_offset = {m.offset: m for m in file_mappings([data])}
    assert "rr" in by_offset[ROWS * WIDTH * 4].flags and "rr" not in by_offset[0].flags
    x = np.ones((ROWS, WIDTH), np.float32)
    y, rows = session.run(None, {"x": x, "ids": np.array([3, 9], np.int64)})
    np.testing.assert_array_equal(y, x + positions)
    np.testing.assert_array_equal(rows, table[[3, 9]])

    both = helper.make_model(helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
         helper.make_node("Add", ["x", "table"], ["y"])],
        "both", graph.input, graph.output, [numpy_helper.from_array(table, "table")],
    ), opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    assert row_read_only(both.SerializeToString()) == set()


def test_a_file_that_is_not_an_onnx_protobuf_has_no_tables(tmp_path) -> None:
    (tmp_path / "model.ort").write_bytes(b"\x10\x00\x00\x00ORTM\xff\xff\xff\xff")  # ONNX Runtime's own format
    assert row_tables(tmp_path / "model.ort") == []
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert row_tables(tmp_path / "empty.onnx") == []


def test_a_session_without_prepacking_multiplies_a_transposed_weight_where_it_lies(tmp_path) -> None:
    """A graph multiplying by a mapped weight transposed (how an export points at its checkpoint's
    ``Linear`` weights): without prepacking the transpose is not folded into a copy of the weight
    (ONNX Runtime's optimised graph holds no transposed initializer), and the answer is x Wᵀ."""
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((512, 256)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "wt"], ["y"])],
        "transposed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 512])],
        [numpy_helper.from_array(weight, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "transposed.onnx"
    write_external_data(model, path, "transposed.onnx.data")
    x = rng.standard_normal((3, 256)).astype(np.float32)
    for prepacking, folded in ((True, True), (False, False)):
        cache = tmp_path / f"optimised-{prepacking}.onnx"
        session = create_session(path, prepacking=prepacking, optimized_cache=cache)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], x @ weight.T, rtol=1e-4, atol=1e-4)
        optimised = onnx.load(str(cache), load_external_data=False)
        shapes = [tuple(t.dims) for t in optimised.graph.initializer]
        assert ((256, 512) in shapes) is folded, (prepacking, shapes)
