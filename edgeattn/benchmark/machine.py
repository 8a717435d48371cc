"""A description of the machine and software a benchmark ran on."""

from __future__ import annotations

import os
import platform
from typing import Any

from edgeattn.host import cpu_flags, cpu_model
from edgeattn.runtime.providers import describe_plugins, onnxruntime_package


def machine_info() -> dict[str, Any]:
    """CPU model, cores, instruction sets, and the versions of the libraries in play."""
    import numpy as np
    import onnxruntime as ort

    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "instruction_sets": cpu_flags(),
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
