"""Model weights that live in a file rather than in the process's own memory.

A model imported from a folder is built with its parameters on the ``meta`` device (no memory,
no random initialisation), then given storage in a temporary file mapped shared
(:func:`file_backed`): the folder's tensors are copied into pages the system writes back and may
drop, so a model several times larger than free memory can be imported and run, and a float32
model made from a bfloat16 folder never costs its float32 bytes of memory of its own. The file has
no name (``O_TMPFILE``, or unlinked as soon as it is mapped): nothing is left behind, even by a
killed process. Given the tensors of the checkpoint the model will be saved as, the file is laid
out as that safetensors checkpoint (:class:`CheckpointFile`), and saving it gives the file a name
instead of writing its bytes again.
:func:`write_safetensors` writes a safetensors file one tensor at a time (safetensors' own writer
holds every tensor's bytes at once).
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

#: each tensor of the backing file starts at a multiple of this (a page: mapped views stay aligned);
#: a checkpoint-shaped file's data starts at a multiple of it
ALIGNMENT = 4096
#: room left in a checkpoint-shaped file's header for the metadata to grow before it is saved
HEADER_ROOM = 4096

_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                       torch.uint8: "U8", torch.bool: "BOOL"}  # fmt: skip


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every parameter a module registers inside this block is made on the ``meta`` device (shape
    and dtype, no storage, initialisation skipped); buffers are made as usual."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            kind = type(param)
            module._parameters[name] = kind(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def has_meta_parameters(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def _nameless_file(size: int) -> tuple[int, bool]:
    """A descriptor of ``size`` bytes of a file without a name in ``TMPDIR``, and whether it can be
    given one later (``O_TMPFILE``; elsewhere a file unlinked at once, which cannot)."""
    directory = tempfile.gettempdir()
    fd, linkable = None, False
    try:
        try:
            fd, linkable = os.open(directory, os.O_TMPFILE | os.O_RDWR, 0o600), True
        except (AttributeError, OSError):  # no O_TMPFILE here, or not on this filesystem
            with tempfile.NamedTemporaryFile(dir=directory, prefix="edgeattn-weights-", delete=False) as f:
                path = f.name
            try:
                fd = os.open(path, os.O_RDWR)
            finally:
                os.unlink(path)
        os.ftruncate(fd, max(size, 1))
        return fd, linkable
    except OSError as exc:
        if fd is not None:
            os.close(fd)
        raise OSError(f"cannot hold the model's {size / 1e9:.2f} GB of weights in {directory} ({exc}); "
                      "set TMPDIR to a folder with room") from exc  # fmt: skip


def _mapped(fd: int, size: int) -> mmap.mmap:
    return mmap.mmap(fd, max(size, 1), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def _backing_file(size: int) -> mmap.mmap:
    """``size`` bytes of a temporary file without a name (in ``TMPDIR``), mapped shared and writable."""
    fd, _ = _nameless_file(size)
    try:
        return _mapped(fd, size)
    finally:
        os.close(fd)


def safetensors_header(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None,
                       data_start: int | None = None) -> bytes | None:  # fmt: skip
    """The length prefix and header of a safetensors file holding ``tensors`` (shapes and dtypes
    only: meta tensors will do) packed in their order. The header is padded with spaces to the next
    multiple of 8 bytes, or so that the data starts at ``data_start``: None when it does not fit."""
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name} has dtype {tensor.dtype}, which safetensors does not store")
        length = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + length]}  # fmt: skip
        offset += length
    text = json.dumps(header, separators=(",", ":")).encode()
    if data_start is None:
        text += b" " * (-len(text) % 8)
    elif 8 + len(text) > data_start:
        return None
    else:
        text += b" " * (data_start - 8 - len(text))
    return len(text).to_bytes(8, "little") + text


def checkpoint_data_start(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> int:
    """Where a checkpoint's data starts: past its header and :data:`HEADER_ROOM`, on a page (the
    same for a checkpoint written and one laid out by :class:`CheckpointFile`, so that an export
    is the same bytes either way)."""
    header = safetensors_header(tensors, metadata)
    assert header is not None
    return -(-(len(header) + HEADER_ROOM) // ALIGNMENT) * ALIGNMENT


def aligned(tensors: dict[str, torch.Tensor]) -> bool:
    """Whether every tensor, packed in order from a page, starts at a multiple of its element size."""
    offset = 0
    for tensor in tensors.values():
        if offset % tensor.element_size():
            return False
        offset += tensor.numel() * tensor.element_size()
    return True


class CheckpointFile:
    """A model's weights in a temporary file laid out as the safetensors checkpoint it will be
    saved as (:func:`file_backed` with a ``checkpoint``), mapped shared: saving the model links this
    file under the checkpoint's name instead of writing its bytes a second time."""

    def __init__(self, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> None:
        self.data_start = checkpoint_data_start(tensors, metadata)
        self.regions: dict[str, tuple[int, torch.dtype, tuple[int, ...]]] = {}
        offset = self.data_start
        for name, tensor in tensors.items():
            self.regions[name] = (offset, tensor.dtype, tuple(tensor.shape))
            offset += tensor.numel() * tensor.element_size()
        self.size = offset
        self._fd = -1
        self._fd, self._linkable = _nameless_file(offset)
        self._mapped = _mapped(self._fd, offset)
        self._bytes = torch.frombuffer(self._mapped, dtype=torch.uint8)
        first = safetensors_header(tensors, metadata, self.data_start)
        assert first is not None
        self._bytes[: len(first)] = torch.frombuffer(bytearray(first), dtype=torch.uint8)

    def view(self, name: str) -> torch.Tensor:
        """Tensor ``name``'s region of the file (writable, shared with the file)."""
        offset, dtype, shape = self.regions[name]
        count = 1
        for dim in shape:
            count *= dim
        if not count:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self._mapped, dtype=dtype, count=count, offset=offset).view(shape)

    def _holds(self, name: str, tensor: torch.Tensor) -> bool:
        offset = self.regions[name][0]
        return tensor.is_contiguous() and tensor.numel() > 0 and tensor.data_ptr() == self._bytes.data_ptr() + offset

    def save_as(self, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None, path: Path) -> bool:
        """Make this file the safetensors checkpoint of ``tensors`` at ``path``: tensors that do not
        already live in their region are copied there, the header rewritten, the file linked to
        ``path``. False (nothing at ``path``) where it cannot be: other names, shapes or dtypes than
        it was laid out for, metadata grown past the header's room, a file that cannot be given a
        name (no ``O_TMPFILE``, another filesystem than ``path``'s), or already saved once."""
        if self._fd < 0 or not self._linkable or list(tensors) != list(self.regions):
            return False
        if any((t.dtype, tuple(t.shape)) != self.regions[n][1:] for n, t in tensors.items()):
            return False
        header = safetensors_header(tensors, metadata, self.data_start)
        if header is None:
            return False
        with torch.no_grad():
            for name, tensor in tensors.items():
                if tensor.numel() and not self._holds(name, tensor):
                    self.view(name).copy_(tensor.detach().cpu())
        self._bytes[: len(header)] = torch.frombuffer(bytearray(header), dtype=torch.uint8)
        try:  # linkat(AT_SYMLINK_FOLLOW) through /proc: os.link's plain link() would link the symlink itself
            descriptors = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.link(str(self._fd), path, src_dir_fd=descriptors, follow_symlinks=True)
            finally:
                os.close(descriptors)
        except OSError as exc:
            log.debug("cannot link the weights' file to %s (%s): writing it instead", path, exc)
            return False
        os.chmod(path, 0o666 & ~_umask())  # made private (0600): readable as a file written here would be
        self.close()
        return True

    def close(self) -> None:
        """Let go of the descriptor and the mapping (which lives on while tensors view it)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._bytes = self._mapped = None  # type: ignore[assignment]

    def __del__(self) -> None:
        self.close()


def _umask() -> int:
    """The process's umask, read without changing it."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


_CHECKPOINT_FILES: weakref.WeakKeyDictionary[nn.Module, CheckpointFile] = weakref.WeakKeyDictionary()


def checkpoint_file(model: nn.Module) -> CheckpointFile | None:
    """The checkpoint-shaped file ``model``'s weights were given by :func:`file_backed`, if any and
    not yet saved."""
    held = _CHECKPOINT_FILES.get(model)
    return held if held is not None and held._fd >= 0 else None


def file_backed(model: nn.Module, checkpoint: dict[str, torch.Tensor] | None = None,
                metadata: dict[str, str] | None = None) -> int:  # fmt: skip
    """Give every ``meta`` parameter of ``model`` storage in one temporary file mapped shared
    (uninitialised: zeros until written); tied parameters keep sharing one tensor. With
    ``checkpoint`` (the named tensors the model will be saved as, in order, every ``meta``
    parameter among them) and its ``metadata``, the file is laid out as that safetensors file
    (:class:`CheckpointFile`). Returns the file's size in bytes."""
    unique: dict[int, nn.Parameter] = {}
    for param in model.parameters():
        if param.is_meta:
            unique[id(param)] = param
    if not unique:
        return 0
    names = {id(t): n for n, t in (checkpoint or {}).items() if t.is_meta}
    if checkpoint is not None and set(unique) <= set(names) and aligned(checkpoint):
        held = CheckpointFile(checkpoint, metadata)
        _CHECKPOINT_FILES[model] = held
        views = {key: held.view(names[key]) for key in unique}
        size = held.size
    else:
        offsets: dict[int, int] = {}
        size = 0
        for key, param in unique.items():
            size += -size % ALIGNMENT
            offsets[key] = size
            size += param.numel() * param.element_size()
        mapped = _backing_file(size)
        views = {}
        for key, param in unique.items():
            count = param.numel()
            flat = torch.frombuffer(mapped, dtype=param.dtype, count=count, offset=offsets[key]) if count else \
                torch.empty(0, dtype=param.dtype)  # fmt: skip
            views[key] = flat.view(param.shape)
    replaced = {key: type(param)(views[key], requires_grad=param.requires_grad) for key, param in unique.items()}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and id(param) in replaced:
                module._parameters[name] = replaced[id(param)]
    return size


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None,
                      data_start: int | None = None) -> Path:  # fmt: skip
    """Write ``tensors`` to ``path`` in the safetensors format, one tensor at a time (memory: the
    largest tensor, not the file); ``data_start``: where the data starts (the header padded)."""
    header = safetensors_header(tensors, metadata, data_start)
    if header is None:
        raise ValueError(f"the header of {path.name} does not fit before byte {data_start}")
    with open(path, "wb") as f:
        f.write(header)
        for tensor in tensors.values():
            flat = tensor.detach().cpu().contiguous().reshape(-1)
            if flat.numel():
                f.write(memoryview(flat.view(torch.uint8).numpy()))
    return path
