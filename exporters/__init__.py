"""edgeattn's exporters: PyTorch models to verified ONNX export directories.

Submodules import torch; this package module itself imports nothing heavy.
"""
