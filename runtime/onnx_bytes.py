"""A serialised ONNX model read straight from its protobuf bytes, without the ``onnx`` package.

Reads what the runtime needs to know before ONNX Runtime sees a file: the tensors a graph keeps
in external data (where, what shape and type), the operator domains its nodes use and the weights
it reads a row at a time. Values are
memoryviews into the bytes given (an ``mmap`` of the file reads only what it touches). Torch-free.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# ModelProto / GraphProto / NodeProto / AttributeProto / FunctionProto / TensorProto field numbers
# (onnx.proto3): the fields of each message that hold tensors, nodes, graphs, attributes or
# functions, and what each holds.
_MODEL = {7: "graph", 25: "function"}
_GRAPH = {1: "node", 5: "tensor", 15: "sparse"}
_FUNCTION = {7: "node"}
_NODE = {5: "attribute"}
_ATTRIBUTE = {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"}
_SPARSE = {1: "tensor", 2: "tensor"}
_KINDS = {"model": _MODEL, "graph": _GRAPH, "function": _FUNCTION, "node": _NODE, "attribute": _ATTRIBUTE,
          "sparse": _SPARSE}  # fmt: skip
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_NAME, _TENSOR_EXTERNAL, _TENSOR_LOCATION = 1, 2, 8, 13, 14
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL


class Malformed(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise Malformed("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf: memoryview) -> Iterator[tuple[int, int, memoryview | int]]:
    """(field number, wire type, value) of one protobuf message; length-delimited values as views."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 1 or wire == 5:
            pos += 8 if wire == 1 else 4
            if pos > len(buf):
                raise Malformed("truncated fixed-width field")
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise Malformed("a field runs past the end of its message")
            yield number, wire, buf[pos : pos + size]
            pos += size
        else:
            raise Malformed(f"wire type {wire}")


def _tensors(buf: memoryview, kind: str, depth: int = 0) -> Iterator[memoryview]:
    """Every TensorProto inside a message of ``kind``, graphs and attributes included."""
    if depth > 64:
        raise Malformed("graphs nested more than 64 deep")
    table = _KINDS[kind]
    for number, wire, value in _fields(buf):
        inner = table.get(number)
        if inner is None or wire != 2:
            continue
        assert isinstance(value, memoryview)
        if inner == "tensor":
            yield value
        else:
            yield from _tensors(value, inner, depth + 1)


@dataclass(frozen=True)
class ExternalTensor:
    """A tensor a serialised ONNX model keeps outside: its name, shape, element type and where."""

    name: str
    dims: tuple[int, ...]
    data_type: int
    pairs: dict[str, str]


def external_tensors(data: bytes | memoryview | mmap.mmap) -> list[ExternalTensor]:
    """Every tensor a serialised ONNX model keeps outside (external data), read without onnx."""
    found = []
    for tensor in _tensors(memoryview(data), "model"):
        name, location, pairs, dims, elem = "", 0, {}, [], 0
        for number, wire, value in _fields(tensor):
            if number == _TENSOR_NAME and wire == 2:
                name = bytes(value).decode("utf-8", "replace")  # type: ignore[arg-type]
            elif number == _TENSOR_LOCATION and wire == 0:
                location = int(value)  # type: ignore[arg-type]
            elif number == _TENSOR_DIMS and wire == 0:
                dims.append(int(value))  # type: ignore[arg-type]
            elif number == _TENSOR_DIMS and wire == 2:  # packed
                pos, buf = 0, value
                while pos < len(buf):  # type: ignore[arg-type]
                    dim, pos = _varint(buf, pos)  # type: ignore[arg-type]
                    dims.append(dim)
            elif number == _TENSOR_TYPE and wire == 0:
                elem = int(value)  # type: ignore[arg-type]
            elif number == _TENSOR_EXTERNAL and wire == 2:
                key = val = ""
                for n, w, v in _fields(value):  # type: ignore[arg-type]
                    if w == 2 and n in (1, 2):
                        text = bytes(v).decode("utf-8", "replace")  # type: ignore[arg-type]
                        key, val = (text, val) if n == 1 else (key, text)
                pairs[key] = val
        if location == _EXTERNAL or pairs:
            found.append(ExternalTensor(name, tuple(dims), elem, pairs))
    return found


def file_external_tensors(path: str | Path) -> list[ExternalTensor]:
    """:func:`external_tensors` of the file at ``path``, through a map of it: a graph's own weights
    are skipped, never read (reading a 200 MB int4 graph whole raised a load's peak memory by as much)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return []
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            try:
                return external_tensors(mapped)
            except Malformed as exc:  # raised again once the map is closed: its traceback holds views of it
                problem = str(exc)
    raise Malformed(f"{path}: {problem}")


def external_data_entries(data: bytes | memoryview | mmap.mmap) -> list[tuple[str, dict[str, str]]]:
    """(tensor name, external-data key/values) of every tensor a serialised ONNX model keeps outside."""
    return [(t.name, t.pairs) for t in external_tensors(data)]


_NODE_DOMAIN = 7
#: The ONNX standard's operator domain, which a node may also name as "".
STANDARD_DOMAIN = "ai.onnx"


def _node_domain(node: memoryview) -> str:
    for number, wire, value in _fields(node):
        if number == _NODE_DOMAIN and wire == 2:
            return bytes(value).decode("utf-8", "replace") or STANDARD_DOMAIN  # type: ignore[arg-type]
    return STANDARD_DOMAIN


def operator_domains(data: bytes | memoryview | mmap.mmap) -> set[str]:
    """The operator domains of a serialised ONNX model's nodes, subgraphs and functions included
    (the standard one as ``ai.onnx``): ``{"ai.onnx", "com.microsoft"}`` for a graph that also uses
    ONNX Runtime's own operators."""
    domains: set[str] = set()

    def walk(buf: memoryview, kind: str, depth: int) -> None:
        if depth > 64:
            raise Malformed("graphs nested more than 64 deep")
        for number, wire, value in _fields(buf):
            inner = _KINDS[kind].get(number)
            if wire != 2 or inner not in ("node", "graph", "function", "attribute"):
                continue
            assert isinstance(value, memoryview)
            if inner == "node":
                domains.add(_node_domain(value))
            walk(value, inner, depth + 1)

    walk(memoryview(data), "model", 0)
    return domains


_NODE_INPUT, _NODE_OP_TYPE = 1, 4
_GRAPH_NODE = 1
#: the operators that read their first input a row at a time (the rows their indices name)
ROW_READERS = frozenset({"Gather", "GatherBlockQuantized"})


def row_read_only(data: bytes | memoryview | mmap.mmap) -> set[str]:
    """The names a serialised ONNX model's main graph reads only as the table of a gather (the first
    input of a :data:`ROW_READERS` node, and no other node's input): a token embedding, which each
    call reads a few rows of."""
    rows: set[str] = set()
    other: set[str] = set()
    for number, wire, graph in _fields(memoryview(data)):
        if number != 7 or wire != 2:  # ModelProto.graph
            continue
        assert isinstance(graph, memoryview)
        for n, w, node in _fields(graph):
            if n != _GRAPH_NODE or w != 2:
                continue
            assert isinstance(node, memoryview)
            inputs, op = [], ""
            for f, fw, value in _fields(node):
                if f == _NODE_INPUT and fw == 2:
                    inputs.append(bytes(value).decode("utf-8", "replace"))  # type: ignore[arg-type]
                elif f == _NODE_OP_TYPE and fw == 2:
                    op = bytes(value).decode("utf-8", "replace")  # type: ignore[arg-type]
            for i, name in enumerate(inputs):
                (rows if i == 0 and op in ROW_READERS else other).add(name)
    return rows - other
