"""A graph's weights written outside it, laid out for ONNX Runtime to map instead of copy.

ONNX Runtime memory-maps an external initializer on the CPU when its offset in the data file is a
multiple of the allocation granularity (4 KiB on Linux and macOS, 64 KiB on Windows); an
unaligned one is read into memory it allocates. A mapped weight that a kernel packs at load
(MatMulNBits) is unmapped once packed; one read in place (a GatherBlockQuantized table) stays
mapped: its pages are the page cache's, shared by every process that serves the same file, and
resident where read (the runtime's ``mapped_weights`` makes that the rows read, not the large
folios the kernel cached the file in).
:func:`write_external_data` therefore starts every large tensor at an aligned offset, and writes a
``Reshape`` of a stored weight by a constant shape as a second initializer over the same bytes (a
*view*), which ONNX Runtime would otherwise fold into a copy of its own: the int4 language
model's tied embedding table, the output layer's 4-bit weights read by row. Measured (int4, a
128-token prompt and 128 new tokens, same logits): on a Qwen2.5-0.5B shape (a 68 MB table) the
process peaked at 488 MiB instead of 535, the copy no longer made beside the packed weights; on
a SmolLM2-360M shape (22 MB) the load's peak fell by 22 MiB but not the generation's, whose
random token ids brought the whole table in (until ``mapped_weights``).
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.external_data_helper import set_external_data

if TYPE_CHECKING:
    from edgeattn.exporters.compact import CheckpointParts

#: Offsets of tensors of at least ``ALIGN_ABOVE`` bytes are multiples of this: the page, which Linux
#: and macOS map at (Windows' 64 KiB granularity would cost up to 64 KB of padding a tensor; there
#: ONNX Runtime reads them, as it read every weight before)
ALIGNMENT = 4096
ALIGN_ABOVE = 1 << 20
#: Tensors smaller than this stay in the graph file (onnx.save_model's default threshold)
SIZE_THRESHOLD = 1024


def _reshaped(dims: list[int], shape: np.ndarray) -> list[int] | None:
    """ONNX Reshape's output dims (``allowzero`` 0) for input ``dims``, or None where they do not fit."""
    out = [int(d) if d != 0 else (dims[i] if i < len(dims) else -2) for i, d in enumerate(shape.tolist())]
    if -2 in out or out.count(-1) > 1:
        return None
    total, known = int(np.prod(dims)), int(np.prod([d for d in out if d != -1]))
    if -1 in out:
        if known == 0 or total % known:
            return None
        out[out.index(-1)] = total // known
    return out if int(np.prod(out)) == total else None


def weight_views(model: onnx.ModelProto, min_bytes: int = ALIGN_ABOVE, only: set[str] | None = None) -> dict[str, str]:
    """Replace each ``Reshape`` of a weight (of ``min_bytes`` or more; of those named ``only``, where
    given) by a constant shape with an initializer of the reshaped dims sharing that weight's data:
    the view's ``raw_data`` is the same bytes until its writer points both at one region. Returns
    {view: weight}."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    views: dict[str, str] = {}
    for node in list(graph.node):
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        weight, shape = inits.get(node.input[0]), inits.get(node.input[1])
        if weight is None or shape is None or node.output[0] in outputs or len(weight.raw_data) < min_bytes:
            continue
        if only is not None and weight.name not in only:
            continue
        if any(a.name == "allowzero" and a.i for a in node.attribute):
            continue
        dims = _reshaped(list(weight.dims), numpy_helper.to_array(shape))
        if dims is None:
            continue
        view = onnx.TensorProto()
        view.CopyFrom(weight)
        view.name = node.output[0]
        del view.dims[:]
        view.dims.extend(dims)
        graph.initializer.append(view)
        graph.node.remove(node)
        views[view.name] = weight.name
        if not any(shape.name in n.input for n in graph.node):
            graph.initializer.remove(shape)
    return views


def point_at(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Make ``tensor`` read its values from ``length`` bytes at ``offset`` of the file ``location``
    (its values in the graph, if any, dropped)."""
    for field in ("raw_data", "float_data", "int64_data", "int32_data", "double_data"):
        tensor.ClearField(field)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)


class DataSink:
    """A graph's external data file written while the graph is made: each weight's bytes go to the
    file as it is created (large ones at :data:`ALIGNMENT`-aligned offsets, as
    :func:`write_external_data` lays them out), and its tensor only points at them, so a graph of
    several GB is never held in memory whole."""

    def __init__(self, path: Path, checkpoint: CheckpointParts | None = None) -> None:
        self.path = path
        #: the checkpoint beside the file, where weights made of model tensors are pointed at
        self.checkpoint = checkpoint
        self._file = open(path, "wb")  # noqa: SIM115 (closed by close)

    def refer(self, tensor: onnx.TensorProto, parts: list[Any]) -> tuple[int, ...] | None:
        """Point ``tensor`` at the checkpoint's bytes of model tensors ``parts`` side by side (see
        :meth:`CheckpointParts.region`) and give it their dims; None (``tensor`` untouched) where the
        checkpoint does not hold them so."""
        found = None if self.checkpoint is None else self.checkpoint.region(parts)
        if found is None:
            return None
        region, dims = found
        tensor.data_type = onnx.TensorProto.FLOAT
        del tensor.dims[:]
        tensor.dims.extend(dims)
        point_at(tensor, self.checkpoint.location, region.offset, region.length)
        return dims

    def put(self, tensor: onnx.TensorProto, array: np.ndarray) -> None:
        """``array``'s bytes into the file, ``tensor`` pointing at them; a tensor under
        :data:`SIZE_THRESHOLD` bytes keeps them in the graph."""
        data = np.ascontiguousarray(array)
        size = data.nbytes
        if size < SIZE_THRESHOLD:
            tensor.raw_data = data.tobytes()
            return
        f = self._file
        if size >= ALIGN_ABOVE and f.tell() % ALIGNMENT:
            f.write(b"\0" * (ALIGNMENT - f.tell() % ALIGNMENT))
        f.write(memoryview(data.reshape(-1)).cast("B"))
        del tensor.external_data[:]
        for key, value in (("location", self.path.name), ("offset", f.tell() - size), ("length", size)):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
        tensor.data_location = onnx.TensorProto.EXTERNAL

    def close(self) -> None:
        self._file.close()


def write_external_data(model: onnx.ModelProto, path: Path, data_name: str) -> Path:
    """Move ``model``'s initializers of :data:`SIZE_THRESHOLD` bytes or more into ``data_name``
    beside ``path`` (large ones at :data:`ALIGNMENT`-aligned offsets, a view over its weight's
    region, see :func:`weight_views`; after what is there when the graph already points into it)
    and save the graph to ``path``. Returns the data file."""
    views = weight_views(model)
    data = path.with_name(data_name)
    # a graph written into its data file as it was made (:class:`DataSink`): the rest added after it
    appending = data.is_file() and any(e.key == "location" and e.value == data_name
                                       for t in model.graph.initializer for e in t.external_data)  # fmt: skip
    with open(data, "r+b" if appending else "wb") as f:
        f.seek(0, 2)
        for tensor in model.graph.initializer:
            if tensor.name in views or not tensor.HasField("raw_data") or len(tensor.raw_data) < SIZE_THRESHOLD:
                continue
            size = len(tensor.raw_data)
            if size >= ALIGN_ABOVE and f.tell() % ALIGNMENT:
                f.write(b"\0" * (ALIGNMENT - f.tell() % ALIGNMENT))
            f.write(tensor.raw_data)
            set_external_data(tensor, data_name, offset=f.tell() - size, length=size)
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
    by_name = {t.name: t for t in model.graph.initializer}
    for view, weight in views.items():
        tensor, source = by_name[view], by_name[weight]
        tensor.ClearField("raw_data")
        del tensor.external_data[:]
        tensor.external_data.extend(source.external_data)
        tensor.data_location = onnx.TensorProto.EXTERNAL
    onnx.save_model(model, str(path))
    return data


def external_region(tensor: onnx.TensorProto) -> tuple[str, int, int]:
    """An external initializer's file (as the graph names it), offset and length."""
    info = {e.key: e.value for e in tensor.external_data}
    return info["location"], int(info.get("offset", 0)), int(info["length"])


def external_bytes(tensor: onnx.TensorProto, folder: Path) -> bytes:
    """An external initializer's bytes, read from its file (relative to ``folder``, or absolute)."""
    location, offset, length = external_region(tensor)
    with open(folder / location, "rb") as f:  # (an absolute location stays itself under /)
        f.seek(offset)
        return f.read(length)


def external_view(tensor: onnx.TensorProto, folder: Path) -> memoryview:
    """An external initializer's bytes as a read-only view of its file, mapped: nothing is copied
    into the process (the pages read are the page cache's)."""
    location, offset, length = external_region(tensor)
    if length == 0:
        return memoryview(b"")
    with open(folder / location, "rb") as f:  # (an absolute location stays itself under /)
        raw = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(raw)[offset : offset + length]
    if len(view) != length:
        raise OSError(f"{folder / location} ends before the {length} bytes at {offset} a weight points at")
    return view


def read_in_place(model: onnx.ModelProto, folder: Path, lazy: set[str]) -> None:
    """Read every external initializer of ``model`` (a graph in ``folder``) into the graph, but
    those named in ``lazy``: their locations become absolute paths, so that each is read from its
    file when it is used (:func:`array_of`, ONNX Runtime's weight-only quantiser) and a graph of
    several GB is never held whole. :func:`read_in_place` with nothing lazy reads what is left."""
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        if tensor.name in lazy:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = str((folder / entry.value).resolve())
            continue
        tensor.raw_data = external_bytes(tensor, folder)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT


def array_of(tensor: onnx.TensorProto) -> np.ndarray:
    """An initializer's values, read from its file where :func:`read_in_place` left it outside."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return numpy_helper.to_array(tensor)
    location, offset, length = external_region(tensor)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    shape = tuple(tensor.dims)
    return np.fromfile(location, dtype=dtype, count=length // dtype.itemsize, offset=offset).reshape(shape)
