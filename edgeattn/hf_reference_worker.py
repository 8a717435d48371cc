"""transformers' own model of a Hugging Face folder, served to edgeattn's import check from another
Python: the one whose transformers major wrote the folder (transformers 4.x reads a 5.x folder's
``rope_parameters`` as an unknown key and builds another model).

Run by path, so it needs neither edgeattn nor anything but numpy, torch and transformers:
``python hf_reference_worker.py FOLDER ARCHITECTURE``. It loads the folder in float32 with eager
attention and answers ``{"transformers": version}`` (or ``{"error": message}``) on stdout; then
each pickled dictionary of keyword arguments (numpy arrays) read from stdin is answered with the
model's outputs (numpy arrays, tuples of them), until stdin closes. Anything else the libraries
print goes to stderr.
"""

from __future__ import annotations

import os
import pickle
import re
import sys


def _version(text: str) -> tuple[int, int]:
    parts = re.match(r"(\d+)(?:\.(\d+))?", text)
    return (int(parts[1]), int(parts[2] or 0)) if parts else (0, 0)


def main(folder: str, architecture: str) -> int:
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the libraries print stays off the answers
    try:
        import numpy as np
        import torch
        import transformers

        dtype_key = "dtype" if _version(transformers.__version__) >= (4, 56) else "torch_dtype"
        model = getattr(transformers, architecture).from_pretrained(
            folder, attn_implementation="eager", **{dtype_key: torch.float32}
        ).eval()
    except Exception as exc:  # the caller shows it with this process's stderr
        pickle.dump({"error": f"{type(exc).__name__}: {exc}"}, answers)
        answers.flush()
        return 1
    pickle.dump({"transformers": transformers.__version__}, answers)
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
    if len(sys.argv) != 3:
        raise SystemExit("usage: hf_reference_worker.py FOLDER ARCHITECTURE")
    sys.exit(main(sys.argv[1], sys.argv[2]))
