"""edgeattn's embedded runtime: exported graphs run through ONNX Runtime with numpy alone.

Importing this package never imports torch. Its names load on first use, so that the small
torch- and onnxruntime-free modules (``precisions``, ``layout``, ``specs``) stay cheap to import
(the command line reads the precision registry before it knows which command runs).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ChatTemplate": "chat",
    "ChatTemplateError": "chat",
    "load_chat_template": "chat",
    "GenerationConfig": "generate",
    "GenerationOutput": "generate",
    "Manifest": "manifest",
    "ManifestError": "manifest",
    "read_manifest": "manifest",
    "UnsafeFileError": "safety",
    "ExportedModel": "exported_model",
    "InputError": "exported_model",
    "check_feeds": "exported_model",
    "load": "exported_model",
    "GRAPH_NAMES": "specs",
    "GraphSpec": "specs",
    "TensorSpec": "specs",
    "graph_spec": "specs",
    "TextTokenizer": "tokenizer",
    "TokenizerError": "tokenizer",
    "WordTokenizer": "tokenizer",
}

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "GRAPH_NAMES",
    "ExportedModel",
    "GenerationConfig",
    "GenerationOutput",
    "GraphSpec",
    "InputError",
    "Manifest",
    "ManifestError",
    "TensorSpec",
    "TextTokenizer",
    "TokenizerError",
    "UnsafeFileError",
    "WordTokenizer",
    "check_feeds",
    "graph_spec",
    "load",
    "load_chat_template",
    "read_manifest",
]

if TYPE_CHECKING:  # pragma: no cover
    from edgeattn.runtime.exported_model import ExportedModel, InputError, check_feeds, load
    from edgeattn.runtime.families.causal.chat import ChatTemplate, ChatTemplateError, load_chat_template
    from edgeattn.runtime.generate import GenerationConfig, GenerationOutput
    from edgeattn.runtime.manifest import Manifest, ManifestError, read_manifest
    from edgeattn.runtime.safety import UnsafeFileError
    from edgeattn.runtime.specs import GRAPH_NAMES, GraphSpec, TensorSpec, graph_spec
    from edgeattn.runtime.tokenizer import TextTokenizer, TokenizerError, WordTokenizer


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'edgeattn.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"edgeattn.runtime.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
