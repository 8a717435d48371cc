"""edgeattn's embedded runtime: exported graphs run through ONNX Runtime with numpy alone.

Importing this package never imports torch.
"""

from edgeattn.runtime.manifest import ManifestError, read_manifest
from edgeattn.runtime.model import ExportedModel, InputError, check_feeds
from edgeattn.runtime.specs import GRAPH_NAMES, GraphSpec, TensorSpec, graph_spec

__all__ = [
    "GRAPH_NAMES",
    "ExportedModel",
    "GraphSpec",
    "InputError",
    "ManifestError",
    "TensorSpec",
    "check_feeds",
    "graph_spec",
    "read_manifest",
]
