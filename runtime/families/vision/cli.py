"""``edgeattn run`` on a vision export: the labels of each image file (a classifier's, or zero-shot
labels for a model with a text tower), or a summary of its embedding."""

from __future__ import annotations

import json
from typing import Any

import click
import numpy as np

from edgeattn.run_options import AS_JSON, RunHook

LABELS = click.Option(["--labels"], default=None,
                      help='Models with a text tower (CLIP): zero-shot labels, comma-separated ("a cat,a dog").')
TOP = click.Option(["--top"], type=int, default=5, show_default=True, help="Vision classifiers: labels shown an image.")


def answer(model: Any, paths: list[str], values: dict[str, Any]) -> None:
    """Labels (a classifier) or the pooled embedding (otherwise) of each image file."""
    as_json, top = values["as_json"], max(1, values["top"])
    labels = [label.strip() for label in (values.get("labels") or "").split(",") if label.strip()]
    if values.get("labels") is not None and not labels:
        raise click.UsageError("--labels names at least one label")
    if labels and model.config.section.text is None:
        raise click.UsageError("--labels is for models with a text tower (CLIP); this one has none")
    if labels or model.config.section.classifier != "none":
        for path in paths:
            found = model.zero_shot([path], labels)[0] if labels else model.classify([path])[0]
            best = sorted(found.scores.items(), key=lambda kv: -kv[1])[:top]
            if as_json:
                click.echo(json.dumps({"image": path, "labels": [{"label": k, "score": round(v, 6)} for k, v in best]}))
                continue
            click.echo(path)
            for label, score in best:
                click.echo(f"  {score:.4f}  {label}")
        return
    for path in paths:
        vector = model.embed([path])[0]
        if as_json:
            click.echo(json.dumps({"image": path, "embedding": [round(float(v), 7) for v in vector]}))
        else:
            shown = ", ".join(f"{v:.4f}" for v in vector[:4])
            click.echo(f"[{shown}, ...] (dim {vector.shape[0]}, norm {float(np.linalg.norm(vector)):.4f})\t{path}")




RUN = RunHook((AS_JSON, TOP, LABELS), answer)
