"""The encoder family's web and Node.js bundle: what bundle.json says of it for the ES module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeattn.exporters.web import closing_specials
from edgeattn.runtime.manifest import Manifest
from edgeattn.runtime.text import label_names


def describe_encoder(manifest: Manifest, folder: Path) -> dict[str, Any]:
    """An encoder's bundle: its task, sizes, labels and pooling."""
    config = manifest.config
    pooling = manifest.pooling
    mode, normalize = (pooling.mode, pooling.normalize) if pooling else ("mean", True)
    return {"task": manifest.task or {"sequence": "classify", "token": "tag"}.get(config.head or "", "embed"),
            "model": {"max_len": config.max_len, "pad_id": config.pad_id, "head": config.head,
                      "num_labels": config.num_labels, "token_types": config.token_types, "d_model": config.d_model},
            "labels": label_names(manifest.labels, config.num_labels) if config.head in ("sequence", "token") else None,
            "pooling": {"mode": mode, "normalize": normalize},
            "closing_special_tokens": closing_specials(folder / "tokenizer.json")}  # fmt: skip
