"""transformers' own model of a Hugging Face folder, served to edgeattn's import check from another
Python: the one whose transformers major wrote the folder (transformers 4.x reads a 5.x folder's
``rope_parameters`` as an unknown key and builds another model).

Run by path, so it needs neither edgeattn nor anything but numpy, torch and transformers:
``python hf_reference_worker.py FOLDER ARCHITECTURE [MEMORY]``. It loads the folder in float32
with eager attention (:func:`load_reference`; MEMORY: the bytes of weights to hold, the rest
offloaded to disk) and answers ``{"transformers": version}`` (or ``{"error": message}``) on stdout; then
each pickled dictionary of keyword arguments (numpy arrays) read from stdin is answered with the
model's outputs (numpy arrays, tuples of them), until stdin closes. Anything else the libraries
print goes to stderr.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import sys
import tempfile
import typing


def _version(text: str) -> tuple[int, int]:
    parts = re.match(r"(\d+)(?:\.(\d+))?", text)
    return (int(parts[1]), int(parts[2] or 0)) if parts else (0, 0)


def load_reference(folder: str, architecture: str, memory: int | None, scratch: str) -> object:
    """transformers' float32 model of ``folder`` with eager attention (its own reference: the sdpa
    path leaves Gemma 2's soft-capping out). With ``memory``, about that many bytes of its weights
    stay in memory and the rest go to ``scratch`` on disk, read as each layer runs (accelerate's
    offload: the same float32 weights, the same answers, a model larger than memory can hold);
    without accelerate installed, the whole model is loaded and stderr says so."""
    import torch
    import transformers

    # transformers 4.56 renamed torch_dtype dtype (the old name warns that it is deprecated)
    dtype_key = "dtype" if _version(transformers.__version__) >= (4, 56) else "torch_dtype"
    kwargs: dict[str, object] = {"attn_implementation": "eager", dtype_key: torch.float32}
    if memory is not None:
        try:
            import accelerate  # noqa: F401
        except ImportError:
            print("accelerate is not installed: the import check holds the whole float32 model", file=sys.stderr)
        else:
            kwargs.update(device_map=device_map(folder, architecture, memory), offload_folder=scratch)
    return getattr(transformers, architecture).from_pretrained(folder, **kwargs).eval()


def device_map(folder: str, architecture: str, memory: int) -> dict[str, str]:
    """accelerate's map of the model's modules to memory ("cpu") or ``disk`` for about ``memory``
    bytes of float32 weights in memory, with every module holding a tied weight in memory: a tied
    weight is not in the folder, so the offload's index lacks it (Whisper's ``proj_out`` tied to
    its decoder's embedding: a KeyError on the first forward)."""
    import torch
    import transformers
    from accelerate import infer_auto_device_map, init_empty_weights
    from accelerate.utils import find_tied_parameters

    config = transformers.AutoConfig.from_pretrained(folder)
    with init_empty_weights():
        empty = getattr(transformers, architecture)._from_config(config)
    empty.tie_weights()
    whole = list(getattr(empty, "_no_split_modules", None) or [])
    placed = infer_auto_device_map(empty, {"cpu": memory}, no_split_module_classes=whole, dtype=torch.float32)
    for name in (n for group in find_tied_parameters(empty) for n in group):
        _in_memory(placed, name.rsplit(".", 1)[0], empty)
    return placed


def _in_memory(placed: dict[str, str], module: str, model: object) -> None:
    """Put ``module`` in memory in the device map ``placed``: an entry above it on disk is split
    into its children, down to ``module``."""
    owner = next((k for k in placed if k == "" or module == k or module.startswith(k + ".")), None)
    if owner is None or placed[owner] != "disk":
        return
    if owner == module:
        placed[owner] = "cpu"
        return
    del placed[owner]
    parent = model.get_submodule(owner)  # type: ignore[attr-defined]
    for child, _ in parent.named_children():
        placed[f"{owner}.{child}" if owner else child] = "disk"
    for tensor, _ in list(parent.named_parameters(recurse=False)) + list(parent.named_buffers(recurse=False)):
        placed[f"{owner}.{tensor}" if owner else tensor] = "disk"
    _in_memory(placed, module, model)


def offloaded(model: object) -> int:
    """How many of the model's parameters are on disk (left on ``meta`` by the offload)."""
    return sum(1 for p in model.parameters() if p.is_meta)  # type: ignore[attr-defined]


def main(folder: str, architecture: str, memory: int | None = None) -> int:
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the libraries print stays off the answers
    scratch = tempfile.mkdtemp(prefix="edgeattn-check-")
    try:
        return _serve(folder, architecture, memory, scratch, answers)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _serve(folder: str, architecture: str, memory: int | None, scratch: str, answers: typing.BinaryIO) -> int:
    try:
        import numpy as np
        import torch
        import transformers

        model = load_reference(folder, architecture, memory, scratch)
    except Exception as exc:  # the caller shows it with this process's stderr
        pickle.dump({"error": f"{type(exc).__name__}: {exc}"}, answers)
        answers.flush()
        return 1
    pickle.dump({"transformers": transformers.__version__, "offloaded": offloaded(model)}, answers)
    answers.flush()
    while True:
        try:
            kwargs = pickle.load(sys.stdin.buffer)
        except EOFError:
            return 0
        feeds = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
        with torch.no_grad():
            result = model(**feeds)
        out = {}
        for key, value in result.items():
            if isinstance(value, torch.Tensor):
                out[key] = value.numpy()
            elif isinstance(value, tuple) and all(isinstance(v, torch.Tensor) for v in value):
                out[key] = tuple(v.numpy() for v in value)
        pickle.dump(out, answers)
        answers.flush()


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or not all(a.isdigit() for a in sys.argv[3:]):
        raise SystemExit("usage: hf_reference_worker.py FOLDER ARCHITECTURE [MEMORY]")
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) == 4 else None))
