"""What an export directory may name, checked before anything opens it.

Someone who controls a whole export directory controls its hashes too, so matching sha256 sums
prove nothing about where a file leads. Every file the manifest names must be a plain name
inside the directory, a regular file that is neither a symbolic link nor hard-linked elsewhere;
and every external-data entry of an ONNX graph must name such a file beside the graph, its
``offset`` and ``length`` inside that file. The graph's entries are read from its protobuf
bytes here, without the ``onnx`` package and before ONNX Runtime sees the file.
"""

from __future__ import annotations

import mmap
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edgeattn.runtime.manifest import ManifestError


class UnsafeFileError(ManifestError):
    """A file an export names that leads outside it, is a link or a device, or an ONNX graph
    whose external data does."""


def member_path(export_dir: str | Path, name: str, what: str = "file") -> Path:
    """``export_dir / name`` after checking that ``name`` is a plain file name and the file is a
    regular file inside ``export_dir``, not a symbolic link, with no other hard link."""
    export_dir = Path(export_dir)
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or Path(name).is_absolute():
        raise UnsafeFileError(f"{export_dir}: the {what} {name!r} is not a plain file name inside the directory")
    path = export_dir / name
    try:
        info = path.lstat()
    except FileNotFoundError as exc:
        raise ManifestError(f"{path} is listed in the manifest but missing") from exc
    except OSError as exc:
        raise UnsafeFileError(f"{path}: cannot be examined: {exc}") from exc
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeFileError(f"{path} is a symbolic link (to {os.readlink(path)!r}); an export holds its files itself")
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFileError(f"{path} is not a regular file")
    if info.st_nlink > 1:
        raise UnsafeFileError(f"{path} has {info.st_nlink} hard links; an export holds its own copy of each file")
    return path


# ------------------------------------------------------------------------- ONNX external data
# ModelProto / GraphProto / NodeProto / AttributeProto / FunctionProto / TensorProto field numbers
# that can hold tensors (onnx.proto3): where a TensorProto may sit, and what each holds.
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


class _Malformed(ValueError):
    pass


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _Malformed("truncated or overlong varint")
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
                raise _Malformed("truncated fixed-width field")
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise _Malformed("a field runs past the end of its message")
            yield number, wire, buf[pos : pos + size]
            pos += size
        else:
            raise _Malformed(f"wire type {wire}")


def _tensors(buf: memoryview, kind: str, depth: int = 0) -> Iterator[memoryview]:
    """Every TensorProto inside a message of ``kind``, graphs and attributes included."""
    if depth > 64:
        raise _Malformed("graphs nested more than 64 deep")
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


def external_data_entries(data: bytes | memoryview | mmap.mmap) -> list[tuple[str, dict[str, str]]]:
    """(tensor name, external-data key/values) of every tensor a serialised ONNX model keeps outside."""
    return [(t.name, t.pairs) for t in external_tensors(data)]


def check_external_data(path: str | Path) -> list[Path]:
    """The external-data files of the ONNX graph at ``path``, after checking every entry names a
    regular file beside it (see :func:`member_path`) and lies inside that file. UnsafeFileError
    names the graph, the tensor and the entry."""
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ManifestError(f"{path} is empty, not an ONNX graph")
        error = None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            try:
                entries = external_data_entries(mapped)
            except _Malformed as exc:  # its traceback holds views of the map: leave the block first
                error = str(exc)
    if error is not None:
        raise ManifestError(f"{path} is not a readable ONNX graph: {error}")
    return check_entries(entries, path.parent, str(path))


def check_entries(entries: list[tuple[str, dict[str, str]]], directory: Path | None, where: str) -> list[Path]:
    """The files ``entries`` name inside ``directory`` (None: a graph held in memory, which may not
    have external data), each checked; UnsafeFileError names ``where``, the tensor and the entry."""
    files: dict[str, tuple[Path, int]] = {}  # location -> (checked path, size)
    for tensor, pairs in entries:
        location = pairs.get("location", "")
        said = f"{where}: tensor {tensor!r} keeps its data in {location!r}"
        if directory is None:
            raise UnsafeFileError(f"{said}, but a graph held in memory has no directory to keep it in")
        if location not in files:
            try:
                data = member_path(directory, location, "external-data file")
            except ManifestError as exc:
                raise UnsafeFileError(f"{said}: {exc}") from exc
            files[location] = (data, data.stat().st_size)
        size = files[location][1]
        try:
            offset, length = int(pairs.get("offset", "0")), int(pairs.get("length", "-1"))
        except ValueError as exc:
            raise UnsafeFileError(f"{said} at a non-integer offset or length") from exc
        end = size if length < 0 else offset + length
        if offset < 0 or end > size or (length < 0 and "length" in pairs):
            raise UnsafeFileError(f"{said} at bytes {offset}..{end}, past the end of the file ({size} bytes)")
    return [path for path, _ in files.values()]


def graph_bytes(*paths: str | Path) -> int:
    """What loading the ONNX graph(s) at ``paths`` reads: each file and every external-data region
    they name, once each (a shared file counts only for the tensors these graphs use, once)."""
    regions = set()
    total = 0
    for path in map(Path, paths):
        total += path.stat().st_size
        for t in external_tensors(path.read_bytes()):
            location = t.pairs.get("location", "")
            length = t.pairs.get("length")
            if length is None:
                data = path.parent / location
                regions.add((location, 0, data.stat().st_size if data.is_file() else 0))
            else:
                regions.add((location, int(t.pairs.get("offset", "0")), int(length)))
    return total + sum(r[2] for r in regions)
