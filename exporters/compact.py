"""One copy of every weight on disk: graphs keep their float32 weights inside the export's
``weights.safetensors``.

An ONNX initializer can live in any file at any offset (external data), and a safetensors file is a
JSON header followed by each tensor's raw bytes. So every initializer of an exported graph that
equals a tensor of the checkpoint, byte for byte, points at that tensor's bytes in the checkpoint,
and one that equals a checkpoint matrix transposed (a ``Linear`` weight as ``MatMul`` takes it, a
tied output layer) becomes a ``Transpose`` node over it, which ONNX Runtime folds when it loads the
graph. A weight several graphs use (the shared embedding, the relative-position tables, the first
encoder layer in the attention graph) is then stored once, and the copy kept for ``verify`` and for
making precisions is the same bytes. Initializers that match nothing (folded constants) stay in the
graph file.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgeattn.exporters.external_data import ALIGN_ABOVE, ALIGNMENT, external_bytes, external_region, weight_views
from edgeattn.runtime.layout import TRANSPOSED_SUFFIX

#: safetensors dtype -> ONNX element type, for the types weights come in
_DTYPES = {"F32": onnx.TensorProto.FLOAT, "F16": onnx.TensorProto.FLOAT16, "I64": onnx.TensorProto.INT64,
           "BF16": onnx.TensorProto.BFLOAT16}  # fmt: skip
#: Initializers smaller than this stay in the graph file.
MIN_SHARED_BYTES = 1024


@dataclass(frozen=True)
class Region:
    """Where one tensor's bytes lie in the checkpoint file."""

    offset: int
    length: int


def _key(elem: int, dims: tuple[int, ...], data: bytes | memoryview) -> tuple[int, tuple[int, ...], str]:
    return elem, dims, hashlib.sha256(data).hexdigest()


class CheckpointIndex:
    """The tensors of a safetensors file by content: as stored, and 2-D ones transposed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.exact: dict[tuple[int, tuple[int, ...], str], Region] = {}
        self.transposed: dict[tuple[int, tuple[int, ...], str], tuple[Region, tuple[int, ...]]] = {}
        with open(path, "rb") as f:  # mapped: each tensor's bytes are read as it is hashed, none kept
            raw = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (size,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + size])
        start = 8 + size
        view = memoryview(raw)  # slices of it are views, not copies
        from tqdm import tqdm

        for name, info in tqdm(header.items(), desc="indexing the checkpoint", unit="tensor", disable=None,
                               leave=False):  # fmt: skip
            if name == "__metadata__" or info["dtype"] not in _DTYPES:
                continue
            elem, dims = _DTYPES[info["dtype"]], tuple(int(d) for d in info["shape"])
            begin, end = info["data_offsets"]
            data = view[start + begin : start + end]
            if end - begin < MIN_SHARED_BYTES:
                continue
            region = Region(start + begin, end - begin)
            self.exact.setdefault(_key(elem, dims, data), region)
            if len(dims) == 2 and elem == onnx.TensorProto.FLOAT:
                flipped = np.frombuffer(data, dtype=np.float32).reshape(dims).T.tobytes()
                self.transposed.setdefault(_key(elem, dims[::-1], flipped), (region, dims))
                del flipped


def _external(tensor: onnx.TensorProto, location: str, region: Region) -> None:
    tensor.ClearField("raw_data")
    for field in ("float_data", "int64_data", "int32_data", "double_data"):
        tensor.ClearField(field)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for k, v in (("location", location), ("offset", str(region.offset)), ("length", str(region.length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = k, v


def share_weights(proto: onnx.ModelProto, index: CheckpointIndex, external_dir: Path | None = None) -> int:
    """Point ``proto``'s initializers at the checkpoint where they equal one of its tensors, as
    stored or transposed (see the module docstring); returns the bytes no longer in the graph.
    With ``external_dir``, initializers kept in external data files there are compared too (read a
    tensor at a time); those that match nothing stay where they are (see :func:`compact_data_file`)."""
    location = index.path.name
    moved = 0
    transposes = []
    kept = []
    from tqdm import tqdm

    for tensor in tqdm(proto.graph.initializer, desc="sharing weights with the checkpoint", unit="weight",
                       disable=None, leave=False):  # fmt: skip
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            if external_dir is None:
                kept.append(tensor)
                continue
            data = external_bytes(tensor, external_dir)  # compared, not kept: a match or not, it stays outside
        else:
            data = np.ascontiguousarray(numpy_helper.to_array(tensor)).tobytes()
        if len(data) < MIN_SHARED_BYTES:
            kept.append(tensor)
            continue
        key = _key(tensor.data_type, tuple(tensor.dims), data)
        del data
        if key in index.exact:
            _external(tensor, location, index.exact[key])
            kept.append(tensor)
            moved += index.exact[key].length
        elif key in index.transposed:
            region, dims = index.transposed[key]
            source = onnx.TensorProto(name=tensor.name + TRANSPOSED_SUFFIX, data_type=tensor.data_type, dims=dims)
            _external(source, location, region)
            kept.append(source)
            transposes.append(helper.make_node("Transpose", [source.name], [tensor.name], perm=[1, 0],
                                               name=f"{tensor.name}/from_checkpoint"))  # fmt: skip
            moved += region.length
        else:
            kept.append(tensor)
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(kept)
    for node in reversed(transposes):
        proto.graph.node.insert(0, node)
    return moved


def compact_data_file(proto: onnx.ModelProto, folder: Path, data_name: str) -> int:
    """Rewrite ``folder / data_name`` to hold only the regions ``proto``'s initializers still point
    at (in their order, large ones page-aligned), copied a region at a time; the file is removed
    when nothing points at it. Returns the bytes kept."""
    path = folder / data_name
    users: dict[tuple[int, int], list[onnx.TensorProto]] = {}
    for tensor in proto.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location, offset, length = external_region(tensor)
            if location == data_name:
                users.setdefault((offset, length), []).append(tensor)
    if not users:
        path.unlink(missing_ok=True)
        return 0
    fresh = path.with_name(data_name + ".compacting")
    kept = 0
    with open(path, "rb") as src, open(fresh, "wb") as out:
        for (offset, length), tensors in users.items():
            align = ALIGNMENT if length >= ALIGN_ABOVE else 64
            out.write(b"\0" * (-out.tell() % align))
            region = Region(out.tell(), length)
            src.seek(offset)
            left = length
            while left:
                chunk = src.read(min(left, 1 << 26))
                if not chunk:
                    raise OSError(f"{path} ends before the {length} bytes at {offset} a weight points at")
                out.write(chunk)
                left -= len(chunk)
            for tensor in tensors:
                _external(tensor, data_name, region)
            kept += length
    fresh.replace(path)
    return kept


def share_between(protos: dict[str, onnx.ModelProto], path: Path) -> dict[str, int]:
    """Write each initializer that several of ``protos`` hold alike (byte for byte, still inside the
    graph: a quantised embedding, a decoder's weights in both of its cache forms) once into
    ``path`` and point every graph at it; returns the bytes each graph no longer holds. Writes no
    file when nothing is shared.

    A ``Reshape`` of a shared weight by a constant shape (the tied table a GatherBlockQuantized
    reads by row) becomes a view over the same bytes (:func:`weight_views`), and large tensors start
    at page-aligned offsets, so that ONNX Runtime maps them rather than folding the Reshape into a
    copy of its own: the real Whisper tiny.en's int8 decoder held a 20 MB copy of its table."""
    users: dict[tuple[int, tuple[int, ...], str], list[tuple[str, onnx.TensorProto]]] = {}
    for graph, proto in protos.items():
        for tensor in proto.graph.initializer:
            # raw_data is already the bytes external data holds, packed types (int4) included
            data = tensor.raw_data
            if tensor.data_location == onnx.TensorProto.EXTERNAL or len(data) < MIN_SHARED_BYTES:
                continue
            users.setdefault(_key(tensor.data_type, tuple(tensor.dims), data), []).append((graph, tensor))
    shared = [tensors for tensors in users.values() if len({g for g, _ in tensors}) > 1]
    if not shared:
        return {}
    for graph, proto in protos.items():
        group = {t.name: tensors for tensors in shared for g, t in tensors if g == graph}
        views = weight_views(proto, MIN_SHARED_BYTES, only=set(group))
        by_name = {t.name: t for t in proto.graph.initializer}
        for view, weight in views.items():
            group[weight].append((graph, by_name[view]))
    moved = dict.fromkeys(protos, 0)
    with path.open("wb") as out:
        for tensors in shared:
            data = tensors[0][1].raw_data
            align = ALIGNMENT if len(data) >= ALIGN_ABOVE else 64
            out.write(b"\0" * (-out.tell() % align))
            region = Region(out.tell(), len(data))
            out.write(data)
            for graph, tensor in tensors:
                _external(tensor, path.name, region)
                moved[graph] += region.length
    return {graph: n for graph, n in moved.items() if n}


def fold_transposes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with the Transpose nodes :func:`share_weights` added folded back into plain
    initializers (external data loaded), for tools that need a MatMul's weight as an initializer
    (ONNX Runtime's quantisers)."""
    inits = {t.name: t for t in proto.graph.initializer}
    folded = []
    for node in proto.graph.node:
        source = node.input[0] if node.op_type == "Transpose" and node.input else ""
        if source.endswith(TRANSPOSED_SUFFIX) and source in inits:
            array = numpy_helper.to_array(inits[source]).T
            folded.append((node, numpy_helper.from_array(np.ascontiguousarray(array), node.output[0])))
    for node, tensor in folded:
        proto.graph.node.remove(node)
        proto.graph.initializer.remove(inits[node.input[0]])
        proto.graph.initializer.append(tensor)
    return proto
