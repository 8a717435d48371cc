"""Static int8's float operators read the float activation, not its quantise/dequantise copy.

``quantize_static`` (QDQ) puts a ``QuantizeLinear -> DequantizeLinear`` pair on every activation a
matrix product reads. When the same activation also feeds a float operator (the residual ``Add``
beside a layer's projections), that operator reads the dequantised copy: ONNX Runtime then runs
the ``DequantizeLinear`` as its own pass over the whole activation, and the residual stream is
rounded to 8 bits for nothing. Here such consumers read the activation the pair was made from;
the pair stays for the matrix products (``DequantizeLinear -> MatMul``, which ONNX Runtime runs
as one ``MatMulIntegerToFloat``), so the graph stays standard QDQ.
"""

from __future__ import annotations

import onnx

#: Consumers that keep reading the dequantised copy: the operators a QDQ engine runs in int8.
QUANTIZED_CONSUMERS = frozenset({"MatMul"})
#: Producers whose output pair is part of their own int8 form, left alone: ONNX Runtime gathers
#: embedding rows from the int8 table and dequantises only those; without the pair after the
#: Gather it dequantises the whole table every run.
QUANTIZED_PRODUCERS = frozenset({"Gather", "MatMul"})


def bypass_float_consumers(model: onnx.ModelProto) -> int:
    """Rewire, in place, every input that reads an activation's ``QuantizeLinear ->
    DequantizeLinear`` output from an operator not in :data:`QUANTIZED_CONSUMERS` to the float
    activation itself (unless that activation comes from one of :data:`QUANTIZED_PRODUCERS`);
    drop pairs nothing reads any more. Returns how many inputs were rewired."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    outputs = {o.name for o in graph.output}
    source: dict[str, str] = {}  # dequantised name -> the float activation it copies
    for node in graph.node:
        quantize = producer.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if quantize is None or quantize.op_type != "QuantizeLinear" or node.output[0] in outputs:
            continue
        made_by = producer.get(quantize.input[0])
        if made_by is None or made_by.op_type not in QUANTIZED_PRODUCERS:
            source[node.output[0]] = quantize.input[0]
    rewired = 0
    for node in graph.node:
        if node.op_type in QUANTIZED_CONSUMERS:
            continue
        for i, name in enumerate(node.input):
            if name in source:
                node.input[i] = source[name]
                rewired += 1
    _drop_unread(graph, {"QuantizeLinear", "DequantizeLinear"})
    return rewired


def _drop_unread(graph: onnx.GraphProto, op_types: set[str]) -> None:
    """Remove nodes of ``op_types`` whose outputs nothing reads, until none is left."""
    while True:
        read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if n.op_type in op_types and not any(o in read for o in n.output)]
        if not dead:
            return
        for node in dead:
            graph.node.remove(node)
