"""edgeattn's serving: exports behind Triton Inference Server, every piece in one place.

- :mod:`~edgeattn.serving.tasks`: a served task's tensors, and the answers to a batch of requests,
  each with its own error (torch-free);
- :mod:`~edgeattn.serving.triton_backend`: the repository's Python-backend model, graphs over BLS
  or in-process (torch-free; vendored into every repository);
- :mod:`~edgeattn.serving.triton_server`: a real ``tritonserver`` process (nvidia-pytriton's, or
  one on PATH);
- :mod:`~edgeattn.serving.repository`: an export as a Triton model repository (needs onnx);
- :mod:`~edgeattn.serving.traffic`: the load benchmark through a real server.

This package module imports nothing heavy.
"""
