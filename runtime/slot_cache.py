"""A decoder's self-attention cache written in place: one buffer per ``cache_*`` input of a graph,
bound through IO binding as both that input and its ``updated_*`` output, so each run writes its
keys and values into the buffer (the export checks that nothing else reads the cache input).

Every decoding state that runs such a graph (the causal decoder's, the encoder-decoder and speech
decoders') keeps its cache in one of these. On the CPU the buffers are numpy arrays the session
writes into (:attr:`SlotCache.host`); on a device they stay there and only ids, masks and logits
cross. Torch-free: numpy and onnxruntime.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edgeattn.runtime.specs import SLOT_CACHE, SLOT_UPDATED, cache_names

#: the output every in-place decoder graph gives besides its updated caches
LOGITS = "logits"


def updated_name(cache: str) -> str:
    """The output a cache input is written back through: ``cache_key_0`` -> ``updated_key_0``."""
    return SLOT_UPDATED + cache[len(SLOT_CACHE) :]


def cache_contract(n_layers: int) -> dict[str, list[str]]:
    """A graph's in-place cache as a bundle tells the JS module: the cache inputs and, in the same
    order, the outputs they are written back through."""
    return {"inputs": cache_names(SLOT_CACHE, n_layers), "outputs": cache_names(SLOT_UPDATED, n_layers)}


def ort_value(array: np.ndarray, device: str) -> Any:
    """``array`` as an OrtValue on ``device``: on the CPU a view of the array's own memory (a
    contiguous array is not copied; the array must outlive every run that binds it)."""
    import onnxruntime as ort

    array = np.ascontiguousarray(array)
    if device == "cpu":
        return ort.OrtValue.ortvalue_from_numpy(array)
    return ort.OrtValue.ortvalue_from_numpy(array, device, 0)


class SlotCache:
    """The named cache buffers of a batch (rows first), on ``device``: bound into an IO binding,
    gathered along the rows for beam search, read back as numpy arrays."""

    def __init__(self, arrays: dict[str, np.ndarray], device: str) -> None:
        self.device = device
        self.on_host = device == "cpu"
        #: the buffers as numpy arrays over the bound memory (on the CPU; empty on a device)
        self.host = {n: np.ascontiguousarray(a) for n, a in arrays.items()} if self.on_host else {}
        self.values: dict[str, Any] = {n: ort_value(self.host.get(n, a), device) for n, a in arrays.items()}

    @classmethod
    def zeros(cls, names: Sequence[str], shape: tuple[int, ...], dtype: Any, device: str) -> SlotCache:
        """Buffers of zeros, not garbage: unwritten slots are masked, but a NaN there would still
        reach the attention's sums."""
        return cls({n: np.zeros(shape, dtype) for n in names}, device)

    def arrays(self) -> dict[str, np.ndarray]:
        """The buffers' contents as numpy arrays (on the CPU the buffers themselves)."""
        return self.host if self.on_host else {n: v.numpy() for n, v in self.values.items()}

    def bind(self, binding: Any, outputs: Sequence[str] = (LOGITS,)) -> None:
        """Bind each buffer as its cache input and its updated output, after the graph's other
        ``outputs``, bound to the host in that order (the order ``get_outputs()`` gives them).
        Outputs bound before are cleared: ONNX Runtime keeps a bound output of the last run's shape."""
        for name, value in self.values.items():
            binding.bind_ortvalue_input(name, value)
        binding.clear_binding_outputs()
        for name in outputs:
            binding.bind_output(name, "cpu")
        for name, value in self.values.items():
            binding.bind_ortvalue_output(updated_name(name), value)

    def reorder(self, index: np.ndarray) -> None:
        """Row ``i`` becomes what row ``index[i]`` held (beam search's reordering; on a device it
        gathers on the host: greedy decoding and sampling never reorder)."""
        for name, value in self.values.items():
            if self.on_host:
                self.host[name][:] = self.host[name][index]
            else:
                value.update_inplace(np.ascontiguousarray(value.numpy()[index]))
