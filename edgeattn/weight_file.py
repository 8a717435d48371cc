"""Model weights that live in a file rather than in the process's own memory.

A model imported from a folder is built with its parameters on the ``meta`` device (no memory,
no random initialisation), then given storage in a temporary file mapped shared
(:func:`file_backed`): the folder's tensors are copied into pages the system writes back and may
drop, so a model several times larger than free memory can be imported and run, and a float32
model made from a bfloat16 folder never costs its float32 bytes of memory of its own. The file is
unlinked as soon as it is mapped: nothing is left behind, even by a killed process.
:func:`write_safetensors` writes a safetensors file one tensor at a time (safetensors' own writer
holds every tensor's bytes at once).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

#: each tensor of the backing file starts at a multiple of this (a page: mapped views stay aligned)
ALIGNMENT = 4096

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


def _backing_file(size: int) -> mmap.mmap:
    """``size`` bytes of an unlinked temporary file (in ``TMPDIR``), mapped shared and writable."""
    directory = tempfile.gettempdir()
    with tempfile.NamedTemporaryFile(dir=directory, prefix="edgeattn-weights-", delete=False) as f:
        path = f.name
    try:
        fd = os.open(path, os.O_RDWR)
        try:
            os.ftruncate(fd, max(size, 1))
            return mmap.mmap(fd, max(size, 1), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
    except OSError as exc:
        raise OSError(f"cannot hold the model's {size / 1e9:.2f} GB of weights in {directory} ({exc}); "
                      "set TMPDIR to a folder with room") from exc  # fmt: skip
    finally:
        os.unlink(path)


def file_backed(model: nn.Module) -> int:
    """Give every ``meta`` parameter of ``model`` storage in one temporary file mapped shared
    (uninitialised: zeros until written); tied parameters keep sharing one tensor. Returns the
    file's size in bytes."""
    unique: dict[int, nn.Parameter] = {}
    for param in model.parameters():
        if param.is_meta:
            unique[id(param)] = param
    offsets: dict[int, int] = {}
    size = 0
    for key, param in unique.items():
        size += -size % ALIGNMENT
        offsets[key] = size
        size += param.numel() * param.element_size()
    if not unique:
        return 0
    mapped = _backing_file(size)
    replaced: dict[int, nn.Parameter] = {}
    for key, param in unique.items():
        count = param.numel()
        flat = torch.frombuffer(mapped, dtype=param.dtype, count=count, offset=offsets[key]) if count else \
            torch.empty(0, dtype=param.dtype)  # fmt: skip
        replaced[key] = type(param)(flat.view(param.shape), requires_grad=param.requires_grad)
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and id(param) in replaced:
                module._parameters[name] = replaced[id(param)]
    return size


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> Path:
    """Write ``tensors`` to ``path`` in the safetensors format, one tensor at a time (memory: the
    largest tensor, not the file)."""
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
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for tensor in tensors.values():
            flat = tensor.detach().cpu().contiguous().reshape(-1)
            if flat.numel():
                f.write(memoryview(flat.view(torch.uint8).numpy()))
    return path
