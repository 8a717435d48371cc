"""The name of every file in an export directory, and of the directories an export is built in.

```
<export>/
  manifest.json                 what the export holds (``edgeattn.runtime.manifest``)
  <graph>.onnx                  fp32 graphs
  <graph>.<precision>.onnx      other precisions
  <file>.onnx.data              external weights of a graph over protobuf's 2 GiB
  weights.safetensors           float32 weights, the verifier's and quantize's reference
  tokenizer.json                the tokenizer, when the model has one
  chat_template.json            a language model's chat template, when its folder has one
.<export>.partial-XXXX/         an export or quantize under construction (renamed into place)
.<export>.old-PID/              the previous export while it is being replaced
```
Torch-free.
"""

from __future__ import annotations

from edgeattn.runtime.precisions import FP32, get_precision

MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
TOKENIZER = "tokenizer.json"
CHAT_TEMPLATE = "chat_template.json"
#: a family's own settings its runtime reads (a speech model's features and decoding)
SETTINGS = "settings.json"
#: Written beside a safetensors checkpoint by ``save_weights``; an export keeps its config in the manifest.
CHECKPOINT_CONFIG = "config.json"
#: A Triton repository's end-to-end model keeps its settings here, beside its model.py.
TRITON_SETTINGS = "edgeattn.json"
EXTERNAL_DATA_SUFFIX = ".data"
ONNX_SUFFIX = ".onnx"


def graph_file(graph: str, precision: str = FP32) -> str:
    """``encoder.onnx`` for fp32, ``encoder.int8.onnx`` for int8 and so on."""
    get_precision(precision)
    return f"{graph}{ONNX_SUFFIX}" if precision == FP32 else f"{graph}.{precision}{ONNX_SUFFIX}"


def shared_data_file(precision: str) -> str:
    """``weights.int8.data``: the weights several of one precision's graphs hold alike, stored once."""
    get_precision(precision)
    return f"weights.{precision}{EXTERNAL_DATA_SUFFIX}"


def external_data_file(onnx_file: str) -> str:
    """The file that holds a graph's weights when they are stored outside it."""
    return onnx_file + EXTERNAL_DATA_SUFFIX


def partial_prefix(export_name: str) -> str:
    """Prefix of the temporary directory an export is built in, beside the target."""
    return f".{export_name}.partial-"


def previous_prefix(export_name: str) -> str:
    """Prefix of the name the previous export waits under while a new one is renamed into place."""
    return f".{export_name}.old-"


def previous_name(export_name: str, pid: int) -> str:
    """Where the previous export waits while a new one is renamed into place."""
    return f"{previous_prefix(export_name)}{pid}"


def lock_name(export_name: str) -> str:
    """The file beside an export that its writer (export or quantize) holds locked."""
    return f".{export_name}.lock"


def optimized_cache_file(sha256: str, graph: str) -> str:
    """ONNX Runtime's optimised copy of a graph in a ``load(optimized_cache=...)`` directory."""
    return f"{sha256[:24]}.{graph}.opt{ONNX_SUFFIX}"


#: Suffix of the checkpoint initializer a ``Transpose`` node reads when a graph needs a checkpoint
#: matrix transposed (see ``edgeattn.exporters.compact``).
TRANSPOSED_SUFFIX = "::checkpoint"
