"""``edgeattn run`` on a vision export: the labels of each image file, or a summary of its embedding."""

from __future__ import annotations

import json
from typing import Any

import click
import numpy as np

from edgeattn.run_options import AS_JSON, RunHook

TOP = click.Option(["--top"], type=int, default=5, show_default=True, help="Vision classifiers: labels shown an image.")


def answer(model: Any, paths: list[str], values: dict[str, Any]) -> None:
    """Labels (a classifier) or the pooled embedding (otherwise) of each image file."""
    as_json, top = values["as_json"], max(1, values["top"])
    if model.config.section.classifier != "none":
        for path in paths:
            found = model.classify([path])[0]
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




RUN = RunHook((AS_JSON, TOP), answer)
