"""The export directory's ``manifest.json``: schema, reading with checks, and file hashes.

Torch-free: the exporter writes it, the runtime and the verifier read it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from edgeattn.config import ModelConfig
from edgeattn.errors import EdgeattnError

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1

#: Keys every ONNX file of an export carries in its ``metadata_props``.
META_CONFIG = "edgeattn.config"
META_GRAPH = "edgeattn.graph"
META_PRECISION = "edgeattn.precision"
META_VERSION = "edgeattn.version"
META_FORMAT = "edgeattn.format_version"
META_SPEC = "edgeattn.spec"


class ManifestError(EdgeattnError):
    """An export directory whose manifest is missing, malformed or does not match its files."""


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_manifest(export_dir: str | Path) -> dict[str, Any]:
    """Load and check the shape of ``export_dir/manifest.json``."""
    export_dir = Path(export_dir)
    path = export_dir / MANIFEST_NAME
    if not export_dir.is_dir():
        raise ManifestError(f"{export_dir} is not a directory (expected an edgeattn export)")
    if not path.is_file():
        raise ManifestError(f"{export_dir} has no {MANIFEST_NAME}; is it an edgeattn export directory?")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ManifestError(f"{path} must hold a JSON object")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise ManifestError(f"{path} has format_version {version!r}; this edgeattn reads version {FORMAT_VERSION}")
    for key in ("config", "graphs"):
        if key not in data:
            raise ManifestError(f"{path} lacks the {key!r} entry")
    if not isinstance(data["graphs"], dict) or not data["graphs"]:
        raise ManifestError(f"{path} lists no graphs")
    for name, graph in data["graphs"].items():
        for key in ("file", "sha256", "inputs", "outputs", "opset", "precision"):
            if key not in graph:
                raise ManifestError(f"{path}: graph {name!r} lacks {key!r}")
    return data


def write_manifest(export_dir: str | Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` (indented JSON) into an export directory."""
    (Path(export_dir) / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def manifest_config(manifest: dict[str, Any]) -> ModelConfig:
    """The model config recorded in a manifest."""
    return ModelConfig.from_dict(manifest["config"])


def check_file(export_dir: Path, entry: dict[str, Any]) -> Path:
    """The path of a manifest file entry after checking it exists and its sha256 matches."""
    path = export_dir / entry["file"]
    if not path.is_file():
        raise ManifestError(f"{path} is listed in the manifest but missing")
    digest = sha256_file(path)
    if digest != entry["sha256"]:
        raise ManifestError(
            f"{path} does not match its manifest sha256 (file changed or corrupted since export): "
            f"{digest[:16]}… != {entry['sha256'][:16]}…"
        )
    for extra in entry.get("external_data", []):
        check_file(export_dir, extra)
    return path


def graph_entry(manifest: dict[str, Any], name: str, precision: str = "fp32") -> dict[str, Any]:
    """The file entry of graph ``name`` at ``precision``: the graph's own entry, or one of its
    reduced-precision variants listed under ``precisions``."""
    graph = manifest["graphs"][name]
    if graph["precision"] == precision:
        return graph
    variants = graph.get("precisions") or {}
    if precision not in variants:
        have = sorted({graph["precision"], *variants})
        raise ManifestError(f"graph {name!r} was not exported at precision {precision!r} (it has {', '.join(have)})")
    return variants[precision]
