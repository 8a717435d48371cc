"""The values a graph computes from its initializers alone: each initializer, and the transpose of
a 2-D one (a checkpoint's ``[out, in]`` Linear weight read by a MatMul, which takes ``[in, out]``).
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from edgeattn.exporters.external_data import array_of


@dataclass(frozen=True)
class ConstantWeight:
    """A value a graph computes from an initializer alone: the initializer itself, or its
    transpose (``transpose`` names the node)."""

    tensor: onnx.TensorProto
    transpose: onnx.NodeProto | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """The value's shape (the initializer's, reversed where transposed)."""
        dims = tuple(self.tensor.dims)
        return dims[::-1] if self.transpose is not None else dims

    def array(self) -> np.ndarray:
        """The value (read from its file where the initializer is outside the graph)."""
        values = array_of(self.tensor)
        return values.T if self.transpose is not None else values


def _is_matrix_transpose(node: onnx.NodeProto, tensor: onnx.TensorProto | None) -> bool:
    if node.op_type != "Transpose" or tensor is None or len(tensor.dims) != 2:
        return False
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
    return perm == [1, 0]


def constant_weights(model: onnx.ModelProto) -> dict[str, ConstantWeight]:
    """{value name: where it comes from} for every initializer and every Transpose of a 2-D one."""
    inits = {t.name: t for t in model.graph.initializer}
    found = {name: ConstantWeight(tensor) for name, tensor in inits.items()}
    for node in model.graph.node:
        if node.input and _is_matrix_transpose(node, inits.get(node.input[0])):
            found[node.output[0]] = ConstantWeight(inits[node.input[0]], node)
    return found
