"""Row-wise activation scales for dynamic int8 graphs: each row's answer independent of its batch.

ONNX Runtime's dynamic quantisation (``DynamicQuantizeLinear``) takes one scale and zero point
for a whole activation tensor: the largest value of any row of the batch (padding included)
sets every row's step, so a row's int8 result changes with the rows it is batched with. Here
each ``DynamicQuantizeLinear`` whose outputs feed only ``MatMulInteger`` products and their scale
``Mul`` is replaced by a symmetric quantisation of each row (each token's vector) on its own:
scale = max|x| / 127 over the last axis, values ``round(x / scale) + 128`` as uint8 with the zero
point 128 (one scalar, as ``MatMulInteger`` needs). The scale, now one per row, broadcasts
through the existing ``Mul`` with the weights' per-channel scales. Fused ``QAttention`` nodes,
which take one input scale, are left alone: quantise without them (``Attention`` kept in
float32) where rows must be independent.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: The smallest row scale (an all-zero row keeps a finite scale).
TINY = 1e-12


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def rowwise_activation_scales(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s per-tensor dynamic activation quantisation to per-row; returns how many
    quantisations were rewritten (those feeding anything but MatMulInteger and Mul are kept).

    The row scale multiplies each product after the weights' per-column scale, not inside it:
    ONNX Runtime fuses MatMulInteger, Cast and the scale Mul into ``MatMulIntegerToFloat``, whose
    input scale is one value, so the fused scale stays the scalar 1."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    opset = _opset(model)
    replaced: dict[int, list[onnx.NodeProto]] = {}  # node id -> the nodes that take its place
    for node in model.graph.node:
        if node.op_type != "DynamicQuantizeLinear" or not _rewritable(node, consumers):
            continue
        replaced[id(node)] = _per_row(node, opset)
        scale = node.output[1]
        for product in consumers.get(scale, []):  # scale x weight scales: the row scale leaves it
            product.input[list(product.input).index(scale)] = "rowwise::one"
            for use in consumers.get(product.output[0], []):
                column = f"{use.output[0]}/per_column"
                row = helper.make_node("Mul", [column, scale], [use.output[0]], name=f"{use.name}/per_row")
                use.output[0] = column
                replaced[id(use)] = [use, row]
    if not replaced:
        return 0
    model.graph.initializer.extend([
        numpy_helper.from_array(np.array(TINY, np.float32), "rowwise::tiny"),
        numpy_helper.from_array(np.array(127.0, np.float32), "rowwise::qmax"),
        numpy_helper.from_array(np.array(128.0, np.float32), "rowwise::offset"),
        numpy_helper.from_array(np.array(1.0, np.float32), "rowwise::one"),
    ])  # fmt: skip
    nodes = [new for node in model.graph.node for new in replaced.get(id(node), [node])]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return sum(1 for nodes_ in replaced.values() if nodes_[0].op_type == "Abs")


def _rewritable(node: onnx.NodeProto, consumers: dict[str, list[onnx.NodeProto]]) -> bool:
    quantized, scale, zero_point = node.output
    return (
        all(c.op_type == "MatMulInteger" for c in consumers.get(quantized, []))
        and all(c.op_type == "Mul" for c in consumers.get(scale, []))
        and all(c.op_type == "MatMulInteger" and list(c.input).index(zero_point) == 2
                for c in consumers.get(zero_point, []))
    )  # fmt: skip


def _per_row(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    """Nodes computing ``node``'s three outputs with one scale per row."""
    x = node.input[0]
    quantized, scale, zero_point = node.output
    p = f"{node.name or quantized}/rowwise"
    if opset >= 18:
        axes = helper.make_node(
            "Constant", [], [f"{p}/axes"], name=f"{p}/Axes", value=numpy_helper.from_array(np.array([-1], np.int64))
        )
        reduce = helper.make_node("ReduceMax", [f"{p}/abs", f"{p}/axes"], [f"{p}/max"], keepdims=1,
                                  name=f"{p}/ReduceMax")  # fmt: skip
    else:
        axes = None
        reduce = helper.make_node("ReduceMax", [f"{p}/abs"], [f"{p}/max"], axes=[-1], keepdims=1, name=f"{p}/ReduceMax")
    return [
        helper.make_node("Abs", [x], [f"{p}/abs"], name=f"{p}/Abs"),
        *([axes] if axes is not None else []),
        reduce,
        helper.make_node("Max", [f"{p}/max", "rowwise::tiny"], [f"{p}/max_safe"], name=f"{p}/Max"),
        helper.make_node("Div", [f"{p}/max_safe", "rowwise::qmax"], [scale], name=f"{p}/Scale"),
        helper.make_node("Div", [x, scale], [f"{p}/scaled"], name=f"{p}/Div"),
        helper.make_node("Round", [f"{p}/scaled"], [f"{p}/rounded"], name=f"{p}/Round"),
        helper.make_node("Add", [f"{p}/rounded", "rowwise::offset"], [f"{p}/shifted"], name=f"{p}/Shift"),
        helper.make_node("Cast", [f"{p}/shifted"], [quantized], to=TensorProto.UINT8, name=f"{p}/Cast"),
        helper.make_node("Constant", [], [zero_point], name=f"{p}/ZeroPoint",
                         value=numpy_helper.from_array(np.array(128, np.uint8))),
    ]  # fmt: skip


#: Attributes ``QAttention`` and ``Attention`` share.
_ATTENTION_ATTRIBUTES = ("num_heads", "unidirectional", "scale", "mask_filter_value", "do_rotary",
                         "past_present_share_buffer")  # fmt: skip


def attention_in_float(model: onnx.ModelProto) -> int:
    """Replace each ``QAttention`` (one input scale for the whole batch) by ``Attention`` over its
    float input and its int8 weights dequantised (the values the int8 graph computes with);
    returns how many were replaced. The quantisation that fed them is dropped where nothing else
    reads it."""
    inits = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    nodes: list[onnx.NodeProto] = []
    replaced = 0
    for node in model.graph.node:
        if node.op_type != "QAttention" or node.domain != "com.microsoft":
            nodes.append(node)
            continue
        ins = list(node.input) + [""] * (9 - len(node.input))
        quantize = producers.get(ins[0])
        if (
            quantize is None
            or quantize.op_type != "DynamicQuantizeLinear"
            or ins[1] not in inits
            or ins[4] not in inits
        ):
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(inits[ins[1]]).astype(np.float32)
        zero = numpy_helper.to_array(inits[ins[7]]).astype(np.float32) if ins[7] in inits else np.float32(0)
        scale = numpy_helper.to_array(inits[ins[4]]).astype(np.float32)
        name = f"{node.name or node.output[0]}/float_weight"
        model.graph.initializer.append(numpy_helper.from_array(((weight - zero) * scale).astype(np.float32), name))
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in _ATTENTION_ATTRIBUTES}
        inputs = [quantize.input[0], name, ins[2], ins[5], ins[8]]
        while inputs and not inputs[-1]:
            inputs.pop()
        nodes.append(helper.make_node("Attention", inputs, list(node.output), name=f"{node.name}/float",
                                      domain="com.microsoft", **attrs))  # fmt: skip
        replaced += 1
    if replaced:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        _drop_dead(model)
    return replaced


def _drop_dead(model: onnx.ModelProto) -> None:
    """Remove nodes none of whose outputs is read, and initializers nothing reads."""
    outputs = {o.name for o in model.graph.output}
    while True:
        read = {i for n in model.graph.node for i in n.input} | outputs
        alive = [n for n in model.graph.node if any(o in read for o in n.output)]
        if len(alive) == len(model.graph.node):
            break
        del model.graph.node[:]
        model.graph.node.extend(alive)
    read = {i for n in model.graph.node for i in n.input}
    kept = [t for t in model.graph.initializer if t.name in read]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)


def row_independent(model: onnx.ModelProto) -> dict[str, int]:
    """A dynamic int8 graph whose every row's result is independent of the other rows of its
    batch: QAttention in float (:func:`attention_in_float`), then per-row activation scales
    (:func:`rowwise_activation_scales`). Returns what was changed."""
    attention = attention_in_float(model)
    rows = rowwise_activation_scales(model)
    left = sum(1 for n in model.graph.node if n.op_type == "DynamicQuantizeLinear")
    return {"attention_in_float": attention, "rowwise_quantizations": rows, "per_tensor_left": left}
