"""Whether a ``decoder_fixed`` graph's cache can be written in place.

A runtime binds each ``updated_*`` output of that graph to the very buffer it feeds as the matching
``cache_*`` input, so the graph's ``ScatterND`` writes the step's keys and values into the cache
instead of copying it. That is safe only if every node that reads a cache input's contents has run
before the node that writes its updated output: the readers must all be that writer or lie
upstream of it (``Shape`` reads no contents).
Every ``decoder_fixed`` file an export writes (each precision's too) is checked here.
"""

from __future__ import annotations

import onnx

from edgeattn.errors import ExportError
from edgeattn.runtime.specs import SLOT_CACHE, SLOT_UPDATED, GraphSpec

#: Operators that read a tensor's shape, never its contents (a write in place leaves them right).
SHAPE_ONLY = {"Shape", "Size"}


def _upstream(graph: onnx.GraphProto, start: int, producer: dict[str, int]) -> set[int]:
    """Indices of the nodes ``start`` depends on, itself included."""
    seen: set[int] = set()
    stack = [start]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        stack.extend(producer[name] for name in graph.node[i].input if name in producer)
    return seen


def check_cache_writes(proto: onnx.ModelProto, spec: GraphSpec) -> None:
    """Raise an ExportError naming the cache a runtime could not update in place."""
    graph = proto.graph
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output}
    graph_outputs = {o.name for o in graph.output}
    for name in spec.input_names:
        if not name.startswith(SLOT_CACHE + "_"):
            continue
        updated = SLOT_UPDATED + name[len(SLOT_CACHE) :]
        if name in graph_outputs or updated not in producer:
            raise ExportError(f"{spec.name}: {updated} is not computed by a node from {name}; "
                              "its cache cannot be updated in place")  # fmt: skip
        writer = producer[updated]
        upstream = _upstream(graph, writer, producer)
        late = [node for i, node in enumerate(graph.node)
                if name in node.input and i not in upstream and node.op_type not in SHAPE_ONLY]  # fmt: skip
        if late:
            raise ExportError(
                f"{spec.name}: {late[0].op_type} node {late[0].name!r} reads {name} without {updated}'s writer "
                f"({graph.node[writer].op_type} {graph.node[writer].name!r}) depending on it, so writing the "
                "cache in place could change what it reads"
            )
