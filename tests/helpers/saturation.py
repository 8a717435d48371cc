"""A product that int8 kernels saturate on x86 CPUs without VNNI (shared by the runtime's and the
JavaScript bundles' tests)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def saturating_product() -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """(a MatMulInteger of signed int8 weights, activations, their exact int32 products): activations
    255 times weights 127 overflow the 16-bit pair sums of the u8 x s8 kernels of x86 CPUs without
    VNNI/AMX. IR version 10, which every ONNX Runtime the tests run (1.30 in JavaScript) reads."""
    weights = np.tile(np.array([[127], [127], [-128], [100]], np.int8), (16, 8))  # (64, 8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "saturate",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, 64])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [None, 8])],
        [numpy_helper.from_array(weights, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model)
    a = np.full((3, 64), 255, np.uint8)
    a[1] = np.arange(64, dtype=np.uint8) * 4
    return model, a, a.astype(np.int32) @ weights.astype(np.int32)
