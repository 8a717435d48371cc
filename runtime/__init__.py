"""edgeattn's embedded runtime: exported graphs run through ONNX Runtime with numpy alone.

Importing this package never imports torch.
"""

from edgeattn.runtime.generate import GenerationConfig, GenerationOutput
from edgeattn.runtime.manifest import ManifestError, read_manifest
from edgeattn.runtime.model import ExportedModel, InputError, check_feeds, load
from edgeattn.runtime.specs import GRAPH_NAMES, GraphSpec, TensorSpec, graph_spec
from edgeattn.runtime.tokenizer import TokenizerError, WordTokenizer

__all__ = [
    "GRAPH_NAMES",
    "ExportedModel",
    "GenerationConfig",
    "GenerationOutput",
    "GraphSpec",
    "InputError",
    "ManifestError",
    "TensorSpec",
    "TokenizerError",
    "WordTokenizer",
    "check_feeds",
    "graph_spec",
    "load",
    "read_manifest",
]
