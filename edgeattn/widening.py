"""A model computed in a wider float type a module at a time: each module's own parameters and
buffers take the wider type only while its forward runs, and are put back after (exact: every
narrower float is one of the wider type's), so no more than one module's weights are ever held
twice. The root's own tensors stay wide for the whole context (its forward spans every call)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


def _own(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
    return [(name, t) for name, t in tensors if t is not None and t.is_floating_point()]


def _widen(module: nn.Module, dtype: torch.dtype, kept: dict[int, torch.Tensor]) -> None:
    for _, tensor in _own(module):
        if id(tensor) not in kept and tensor.dtype != dtype:  # a tied tensor is widened once
            kept[id(tensor)] = tensor.data
            tensor.data = tensor.data.to(dtype)


def _narrow(module: nn.Module, kept: dict[int, torch.Tensor]) -> None:
    for _, tensor in _own(module):
        original = kept.pop(id(tensor), None)
        if original is not None:
            tensor.data = original


@contextlib.contextmanager
def module_at_a_time(model: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Within: ``model``'s forward computes in ``dtype`` (feed it inputs of that type), a module's
    own tensors widened while it runs. A forward that reads another module's weights outside that
    module's own call (a head tied by hand) meets them narrow: torch raises a dtype mismatch, and
    the caller widens the whole model instead."""
    kept: dict[int, torch.Tensor] = {}
    depth: dict[int, int] = {}

    def before(module: nn.Module, args: object) -> None:
        depth[id(module)] = depth.get(id(module), 0) + 1
        if depth[id(module)] == 1:
            _widen(module, dtype, kept)

    def after(module: nn.Module, args: object, output: object) -> None:
        depth[id(module)] -= 1
        if depth[id(module)] == 0:
            _narrow(module, kept)

    hooks = []
    for module in model.modules():
        if module is not model and _own(module):
            hooks += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    _widen(model, dtype, kept)
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        _narrow(model, kept)
        for module in model.modules():  # a forward that raised left its modules wide
            _narrow(module, kept)
