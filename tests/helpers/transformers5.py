"""The transformers 5 environment .ci/transformers5.sh makes beside the project's transformers 4."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")


def transformers5_python() -> Path:
    """The transformers 5 environment's python; a test needing it skips without it (fails in CI)."""
    venv = Path(os.environ.get("EDGEATTN_TF5", Path.home() / ".cache" / "edgeattn-tf5"))
    python = venv / "bin" / "python"
    if not (venv / ".edgeattn-ready-1").is_file():
        if os.environ.get("CI"):
            pytest.fail(f"no transformers 5 environment at {venv}: .ci/run makes it with .ci/transformers5.sh")
        pytest.skip(f"no transformers 5 environment at {venv} (bash .ci/transformers5.sh makes it)")
    return python
