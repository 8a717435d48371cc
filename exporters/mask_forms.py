"""The fused encoder's padding mask as key lengths: the form ONNX Runtime's fast CUDA attention takes.

ONNX Runtime's fused ``Attention`` (input 3, ``mask_index``) and ``MultiHeadAttention`` (input 4,
``key_padding_mask``) take the padding mask as a (batch, keys) matrix or as one length per row,
"keys 0 .. length-1 are real". With the matrix the CUDA provider's flash and memory-efficient
kernels do not run and the attention scores are written out; the lengths form leaves them open.
The lengths are the row sums of ``attention_mask``, right only for right-padded batches, which
the caller checks on the host (:func:`edgeattn.runtime.padding.right_padded`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeattn.errors import ExportError

#: Fused attention operators (Microsoft domain) and the input index of their padding mask.
MASK_INPUTS = {"Attention": 3, "MultiHeadAttention": 4}
#: The graph input the masks come from.
MASK_INPUT = "attention_mask"
#: Names of the tensors the rewrite adds.
LENGTHS = "edgeattn_key_lengths"


def _graph_inputs_behind(graph: onnx.GraphProto, tensor: str) -> set[str]:
    """The graph inputs ``tensor`` is computed from."""
    producer = {o: n for n in graph.node for o in n.output}
    inputs = {i.name for i in graph.input} - {t.name for t in graph.initializer}
    seen, found, todo = set(), set(), [tensor]
    while todo:
        name = todo.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        if name in inputs:
            found.add(name)
        elif name in producer:
            todo.extend(producer[name].input)
    return found


def lengths_form(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose fused attention nodes take key lengths (B,) int32 computed from
    ``attention_mask`` instead of the mask matrix; the mask's old path is removed. Raises
    :class:`ExportError` when the graph has no fused attention or a node's mask is computed from
    anything besides ``attention_mask``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    if MASK_INPUT not in {i.name for i in graph.input}:
        raise ExportError(f"the graph has no {MASK_INPUT!r} input")
    fused = [n for n in graph.node if n.domain == "com.microsoft" and n.op_type in MASK_INPUTS]
    masked = [n for n in fused if len(n.input) > MASK_INPUTS[n.op_type] and n.input[MASK_INPUTS[n.op_type]]]
    if not masked:
        raise ExportError("the graph has no fused attention node with a padding mask (export fp32-opt or fp16)")
    for node in masked:
        behind = _graph_inputs_behind(graph, node.input[MASK_INPUTS[node.op_type]])
        if behind != {MASK_INPUT}:
            raise ExportError(f"{node.name}'s mask is computed from {', '.join(sorted(behind)) or 'constants'}, "
                              f"not from {MASK_INPUT} alone: its lengths form would not be the same mask")  # fmt: skip
        node.input[MASK_INPUTS[node.op_type]] = LENGTHS
    axes = f"{LENGTHS}_axes"
    graph.initializer.append(numpy_helper.from_array(np.array([1], dtype=np.int64), axes))
    graph.node.insert(0, helper.make_node("Cast", [f"{LENGTHS}_int64"], [LENGTHS], to=TensorProto.INT32,
                                          name="edgeattn/key_lengths/Cast"))  # fmt: skip
    graph.node.insert(0, helper.make_node("ReduceSum", [MASK_INPUT, axes], [f"{LENGTHS}_int64"], keepdims=0,
                                          name="edgeattn/key_lengths/ReduceSum"))  # fmt: skip
    _remove_dead_nodes(graph)
    return out


def _remove_dead_nodes(graph: onnx.GraphProto) -> None:
    """Drop nodes none of whose outputs is used (the old mask path), repeatedly."""
    outputs = {o.name for o in graph.output}
    while True:
        used = {i for n in graph.node for i in n.input} | outputs
        dead = [i for i, n in enumerate(graph.node) if not any(o in used for o in n.output)]
        if not dead:
            return
        for i in reversed(dead):
            del graph.node[i]


def lengths_form_bytes(path: str | Path) -> bytes:
    """The lengths form of the ONNX file at ``path`` with its weights inline, serialised, for a
    session created from memory (graphs whose weights pass 2 GB do not fit one protobuf)."""
    return lengths_form(onnx.load(str(path))).SerializeToString()
