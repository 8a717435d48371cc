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
import itertools
import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgeattn.exporters.external_data import (
    ALIGN_ABOVE,
    ALIGNMENT,
    external_region,
    external_view,
    point_at,
    weight_views,
)
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
    """The tensors of a safetensors file by content: as stored, and 2-D ones transposed.

    Only the header is read when the index is made; a tensor's bytes are hashed the first time a
    weight of its shape and type is looked up (:meth:`find`), so a graph whose weights match no
    tensor's shape (a quantised one) reads nothing of a checkpoint of several GB."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:  # mapped: each tensor's bytes are read as it is hashed, none kept
            self._raw = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (size,) = struct.unpack("<Q", self._raw[:8])
        header = json.loads(self._raw[8 : 8 + size])
        start = 8 + size
        #: (element type, dims) -> the regions of the tensors of that shape, as stored / transposed
        self._exact: dict[tuple[int, tuple[int, ...]], list[Region]] = {}
        self._transposed: dict[tuple[int, tuple[int, ...]], list[tuple[Region, tuple[int, ...]]]] = {}
        self._digests: dict[tuple[Region, bool], str] = {}
        #: name -> (region, element type, dims) of every tensor of a type weights come in
        self.named: dict[str, tuple[Region, int, tuple[int, ...]]] = {}
        for name, info in header.items():
            if name == "__metadata__" or info["dtype"] not in _DTYPES:
                continue
            elem, dims = _DTYPES[info["dtype"]], tuple(int(d) for d in info["shape"])
            begin, end = info["data_offsets"]
            self.named[name] = (Region(start + begin, end - begin), elem, dims)
            if end - begin < MIN_SHARED_BYTES:
                continue
            region = Region(start + begin, end - begin)
            self._exact.setdefault((elem, dims), []).append(region)
            if len(dims) == 2 and elem == onnx.TensorProto.FLOAT:
                self._transposed.setdefault((elem, dims[::-1]), []).append((region, dims))

    def candidates(self, elem: int, dims: tuple[int, ...]) -> bool:
        """Whether any tensor has this type and shape, as stored or transposed (a weight that has
        none needs no reading or hashing)."""
        return (elem, dims) in self._exact or (elem, dims) in self._transposed

    def _digest(self, region: Region, dims: tuple[int, ...] | None) -> str:
        """The sha256 of a tensor's bytes (``dims``: of its transpose, a float32 matrix of these dims)."""
        key = (region, dims is not None)
        if key not in self._digests:
            data = memoryview(self._raw)[region.offset : region.offset + region.length]
            self._digests[key] = (hashlib.sha256(data) if dims is None else _transposed_sha256(data, dims)).hexdigest()
            del data
        return self._digests[key]

    def view(self, region: Region) -> memoryview:
        """A region's bytes, mapped (read-only)."""
        return memoryview(self._raw)[region.offset : region.offset + region.length]

    def find(self, elem: int, dims: tuple[int, ...], data: bytes | memoryview
             ) -> tuple[Region, tuple[int, ...] | None] | None:  # fmt: skip
        """Where a weight of type ``elem``, ``dims`` and bytes ``data`` lies in the checkpoint:
        (its region, None) stored as it is, (the region, the stored dims) stored transposed, or None."""
        if not self.candidates(elem, dims):
            return None
        digest = hashlib.sha256(data).hexdigest()
        for region in self._exact.get((elem, dims), []):
            if self._digest(region, None) == digest:
                return region, None
        for region, stored in self._transposed.get((elem, dims), []):
            if self._digest(region, stored) == digest:
                return region, stored
        return None


#: the most bytes of a tensor compared with the checkpoint at once
COMPARE_CHUNK = 64 * 2**20


class CheckpointParts:
    """Where a model's tensors lie in the checkpoint it was saved as, looked up by the tensors
    themselves: a graph writer asks for a weight made of one or several of them (concatenated on
    their first axis) and points at their bytes there instead of writing them again."""

    def __init__(self, index: CheckpointIndex, model: Any) -> None:
        self.index = index
        self.location = index.path.name
        self._names = {id(param): name for name, param in model.named_parameters()}
        self._equal: set[int] = set()  # tensors found equal to their stored bytes

    def region(self, parts: list[Any]) -> tuple[Region, tuple[int, ...]] | None:
        """The region of the checkpoint holding ``parts`` side by side (each equal to its stored
        tensor byte for byte, float32, one after the other in the file), and the dims of them
        concatenated; None where they are not so stored."""
        found = []
        for part in parts:
            entry = self.index.named.get(self._names.get(id(part), ""))
            if entry is None or entry[1] != onnx.TensorProto.FLOAT or entry[2] != tuple(part.shape) or \
                    str(part.dtype) != "torch.float32":  # fmt: skip
                return None
            found.append(entry)
        for (a, _, a_dims), (b, _, b_dims) in itertools.pairwise(found):
            if a.offset + a.length != b.offset or a_dims[1:] != b_dims[1:]:
                return None
        for part, (region, _, _) in zip(parts, found, strict=True):
            if id(part) in self._equal:
                continue
            stored = np.frombuffer(self.index.view(region), dtype=np.uint32)
            ours = part.detach().contiguous().numpy().view(np.uint32).reshape(-1)
            step = COMPARE_CHUNK // 4
            if any(not np.array_equal(ours[i : i + step], stored[i : i + step]) for i in range(0, len(ours), step)):
                return None  # changed since it was saved
            del stored, ours
            self._equal.add(id(part))
        first = found[0][0]
        dims = (sum(e[2][0] for e in found), *found[0][2][1:])
        return Region(first.offset, sum(e[0].length for e in found)), dims


#: the most bytes of a transposed matrix copied at once to be hashed
HASH_CHUNK = 64 * 2**20


def _transposed_sha256(data: memoryview, dims: tuple[int, ...]) -> Any:
    """The sha256 of the bytes of float32 matrix ``data`` (``dims``) transposed, a few of its
    transposed rows copied at a time (a 1 GB table is not copied whole)."""
    flipped = np.frombuffer(data, dtype=np.float32).reshape(dims).T
    digest = hashlib.sha256()
    step = max(1, HASH_CHUNK // max(1, flipped.shape[1] * 4))
    for row in range(0, flipped.shape[0], step):
        digest.update(np.ascontiguousarray(flipped[row : row + step]).data)
    return digest


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
        outside = tensor.data_location == onnx.TensorProto.EXTERNAL
        if outside and external_region(tensor)[0] == location:  # written pointing at the checkpoint
            kept.append(tensor)
            continue
        if (outside and external_dir is None) or not index.candidates(tensor.data_type, tuple(tensor.dims)):
            kept.append(tensor)
            continue
        if outside:
            data = external_view(tensor, external_dir)  # mapped and compared: a match or not, it stays outside
        else:
            data = np.ascontiguousarray(numpy_helper.to_array(tensor)).tobytes()
        if len(data) < MIN_SHARED_BYTES:
            kept.append(tensor)
            continue
        found = index.find(tensor.data_type, tuple(tensor.dims), data)
        del data
        if found is None:
            kept.append(tensor)
        elif found[1] is None:
            point_at(tensor, location, found[0].offset, found[0].length)
            kept.append(tensor)
            moved += found[0].length
        else:
            region, dims = found
            source = onnx.TensorProto(name=tensor.name + TRANSPOSED_SUFFIX, data_type=tensor.data_type, dims=dims)
            point_at(source, location, region.offset, region.length)
            kept.append(source)
            transposes.append(helper.make_node("Transpose", [source.name], [tensor.name], perm=[1, 0],
                                               name=f"{tensor.name}/from_checkpoint"))  # fmt: skip
            moved += region.length
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
    fresh = path.with_name(data_name + ".compacting")
    kept = copy_regions(proto, path, fresh, data_name)
    if kept:
        fresh.replace(path)
    else:
        path.unlink(missing_ok=True)
    return kept


def data_locations(proto: onnx.ModelProto) -> list[str]:
    """The data files ``proto``'s external initializers are in, as it names them, in order."""
    return list(dict.fromkeys(external_region(t)[0] for t in proto.graph.initializer
                              if t.data_location == onnx.TensorProto.EXTERNAL))  # fmt: skip


def copy_regions(proto: onnx.ModelProto, sources: Path | list[Path], target: Path, data_name: str | None = None
                 ) -> int:  # fmt: skip
    """Copy the regions of the data files ``sources`` that ``proto``'s initializers point at (by
    each file's name) into a new file ``target`` (in their order, large ones page-aligned), a
    region at a time, and point them there by ``data_name`` (default: ``target``'s name, as the
    graph beside it reads it). Writes nothing and returns 0 when no initializer points into a
    source; else the bytes copied."""
    sources = [sources] if isinstance(sources, Path) else sources
    by_name = {source.name: source for source in sources}
    users: dict[tuple[str, int, int], list[onnx.TensorProto]] = {}
    for tensor in proto.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location, offset, length = external_region(tensor)
            if location in by_name:
                users.setdefault((location, offset, length), []).append(tensor)
    if not users:
        return 0
    kept = 0
    with open(target, "wb") as out:
        for (location, offset, length), tensors in users.items():
            align = ALIGNMENT if length >= ALIGN_ABOVE else 64
            out.write(b"\0" * (-out.tell() % align))
            region = Region(out.tell(), length)
            with open(by_name[location], "rb") as src:
                src.seek(offset)
                left = length
                while left:
                    chunk = src.read(min(left, 1 << 26))
                    if not chunk:
                        raise OSError(f"{by_name[location]} ends before the {length} bytes at {offset} a weight "
                                      "points at")  # fmt: skip
                    out.write(chunk)
                    left -= len(chunk)
            for tensor in tensors:
                point_at(tensor, data_name or target.name, region.offset, region.length)
            kept += length
    return kept


def share_between(protos: dict[str, onnx.ModelProto], path: Path, sources: dict[str, list[Path]] | None = None
                  ) -> dict[str, int]:  # fmt: skip
    """Write each initializer that several of ``protos`` hold alike (byte for byte, still inside the
    graph: a quantised embedding, a decoder's weights in both of its cache forms) once into
    ``path`` and point every graph at it; returns the bytes each graph no longer holds. Writes no
    file when nothing is shared.

    A ``Reshape`` of a shared weight by a constant shape (the tied table a GatherBlockQuantized
    reads by row) becomes a view over the same bytes (:func:`weight_views`), and large tensors start
    at page-aligned offsets, so that ONNX Runtime maps them rather than folding the Reshape into a
    copy of its own: the real Whisper tiny.en's int8 decoder held a 20 MB copy of its table.

    ``sources`` names each graph's own data files (a candidate kept in a file): initializers there
    are compared too, read a tensor at a time."""
    if len(protos) < 2:
        return {}
    files = {graph: {f.name: f for f in found} for graph, found in (sources or {}).items()}

    def data_of(graph: str, tensor: onnx.TensorProto) -> bytes | memoryview | None:
        """Its bytes (raw_data is already what external data holds, packed types included; mapped
        where they are in its graph's own data file), or None for one kept outside in another file."""
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            return tensor.raw_data
        own = files.get(graph, {}).get(external_region(tensor)[0])
        return None if own is None else external_view(tensor, own.parent)

    users: dict[tuple[int, tuple[int, ...], str], list[tuple[str, onnx.TensorProto]]] = {}
    for graph, proto in protos.items():
        for tensor in proto.graph.initializer:
            data = data_of(graph, tensor)
            if data is None or len(data) < MIN_SHARED_BYTES:
                continue
            # by bytes, whatever the shape: a view a graph's data file already holds (a tied table
            # over its weight) keeps sharing its weight's region
            users.setdefault(_key(tensor.data_type, (), data), []).append((graph, tensor))
            del data
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
            data = data_of(*tensors[0])
            assert data is not None
            align = ALIGNMENT if len(data) >= ALIGN_ABOVE else 64
            out.write(b"\0" * (-out.tell() % align))
            region = Region(out.tell(), len(data))
            out.write(data)
            for graph, tensor in tensors:
                point_at(tensor, path.name, region.offset, region.length)
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
