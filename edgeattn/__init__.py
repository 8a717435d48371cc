"""edgeattn: a transformer defined in PyTorch, exported to ONNX, run at the edge.

This module must stay torch-free: importing ``edgeattn.runtime`` runs it first.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
