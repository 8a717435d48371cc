"""Running code where ``import torch`` fails (shared by the tests of torch-free writers)."""

from __future__ import annotations

import subprocess
import sys


def run_without_torch(code: str, timeout: float = 300) -> None:
    """Run ``code`` in a fresh Python where any ``import torch`` fails; AssertionError with its
    standard error if it does not succeed."""
    prelude = "import sys\nsys.modules['torch'] = None  # any 'import torch' now fails\n"
    done = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
