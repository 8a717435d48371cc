"""A description of the machine and software a benchmark ran on."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from typing import Any

from edgeattn.host import cpu_flags, cpu_model
from edgeattn.runtime.providers import describe_plugins, onnxruntime_package


def machine_info() -> dict[str, Any]:
    """CPU model, cores, instruction sets, GPU ("none" where nvidia-smi finds none), and the
    versions of the libraries in play."""
    import numpy as np
    import onnxruntime as ort

    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "instruction_sets": cpu_flags(),
        "gpu": gpu_name(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "onnxruntime": ort.__version__,
        "onnxruntime_package": onnxruntime_package(),
        "providers": ort.get_available_providers(),
        "plugin_providers": describe_plugins(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    try:
        import onnx

        info["onnx"] = onnx.__version__
    except ImportError:
        pass
    return info


def gpu_name() -> str:
    """The NVIDIA GPUs nvidia-smi lists (names joined), or "none"."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "none"
    try:
        done = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "none"
    names = [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []
    return ", ".join(names) or "none"
