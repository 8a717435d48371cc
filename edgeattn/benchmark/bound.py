"""Encoder runners that keep data on the session's device: IO binding, and CUDA graphs.

With plain ``session.run`` every call copies its inputs to the device and its output back; on a
GPU that copy can cost as much as the encoder (a 32 x 128 x 768 float32 output is 12.6 MB).
:class:`BoundRunner` copies each input array to the device once and leaves the output there, as
an application that chains GPU work would. :class:`CudaGraphRunner` also gives every shape its own
session with the CUDA provider's graph capture on and fixed device buffers, so a run is one graph
replay instead of one launch per kernel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.padding import right_padded
from edgeattn.runtime.specs import encoder_feeds

OUTPUT = "last_hidden_state"


def input_key(ids: np.ndarray, mask: np.ndarray) -> tuple[Any, ...]:
    """Identity of an input pair: the benchmark reuses the same arrays for every run of a shape."""
    return (ids.__array_interface__["data"][0], ids.shape, mask.__array_interface__["data"][0], mask.shape)


class BoundRunner:
    """Runs ``session`` through IO binding on ``device`` ("cpu" or "cuda"); the output stays there.

    Only the latest input pair is kept bound, so device memory holds one shape at a time."""

    def __init__(self, session: Any, device: str) -> None:
        self.session = session
        self.device = device
        self._bound: tuple[tuple[Any, ...], Any, list[Any]] | None = None

    def binding(self, ids: np.ndarray, mask: np.ndarray) -> Any:
        """The IO binding for this input pair (inputs copied to the device on first use)."""
        import onnxruntime as ort

        key = input_key(ids, mask)
        if self._bound is None or self._bound[0] != key:
            binding = self.session.io_binding()
            values = []
            names = [i.name for i in self.session.get_inputs()]
            for name, array in encoder_feeds(names, ids, mask).items():
                value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.device, 0)
                binding.bind_ortvalue_input(name, value)
                values.append(value)  # the binding does not keep its inputs alive
            binding.bind_output(OUTPUT, self.device)
            self._bound = (key, binding, values)
        return self._bound[1]

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> Any:
        binding = self.binding(ids, mask)
        self.session.run_with_iobinding(binding)
        return binding

    def output(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Run once and copy the output to the host (for checks, not timing)."""
        return self(ids, mask).copy_outputs_to_cpu()[0]


class CudaGraphRunner:
    """One CUDA-graph session per input shape, run through IO binding with fixed device buffers.

    The provider captures the graph on an early run and replays it afterwards; a new shape gets a
    new session (the previous one is dropped). Inputs are copied into the same device buffers
    when their contents change, never reallocated."""

    def __init__(self, path: str | Path | bytes, d_model: int, threads: int, tf32: bool = False) -> None:
        self.path = path if isinstance(path, bytes) else Path(path)  # a file, or a serialised graph
        self.d_model = d_model
        self.threads = threads
        self.tf32 = tf32
        self._state: dict[str, Any] | None = None

    def _open(self, ids: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
        import onnxruntime as ort

        from edgeattn.runtime.session import CUDA, create_session
        from edgeattn.runtime.specs import BATCH, SRC_LEN

        session = create_session(self.path, providers=[CUDA], threads=self.threads, tf32=self.tf32, cuda_graph=True,
                                 require=True, fixed_dims={BATCH: ids.shape[0], SRC_LEN: ids.shape[1]})  # fmt: skip
        feeds = encoder_feeds([i.name for i in session.get_inputs()], ids, mask)
        inputs = {n: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a), "cuda", 0) for n, a in feeds.items()}
        output = ort.OrtValue.ortvalue_from_shape_and_type((*ids.shape, self.d_model), np.float32, "cuda", 0)
        binding = session.io_binding()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_output(OUTPUT, output)
        return {"shape": ids.shape, "key": input_key(ids, mask), "session": session, "binding": binding,
                "inputs": inputs, "output": output}  # fmt: skip

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> Any:
        state = self._state
        if state is None or state["shape"] != ids.shape:
            self._state = None  # free the previous shape's session and buffers first
            state = self._state = self._open(ids, mask)
        elif state["key"] != input_key(ids, mask):
            for name, array in encoder_feeds(list(state["inputs"]), ids, mask).items():
                state["inputs"][name].update_inplace(np.ascontiguousarray(array))
            state["key"] = input_key(ids, mask)
        state["session"].run_with_iobinding(state["binding"])
        return state["output"]

    def output(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Run once and copy the output to the host (for checks, not timing)."""
        return self(ids, mask).numpy()


class RightPadded:
    """Runs ``runner`` on right-padded batches only: a graph taking the padding as key lengths
    (:mod:`edgeattn.exporters.mask_forms`) would answer other batches wrongly. The host-side check
    is part of what is timed, as it would be in the runtime."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> Any:
        if not right_padded(mask):
            raise EdgeattnError("the key-lengths form runs right-padded batches only")
        return self.runner(ids, mask)
