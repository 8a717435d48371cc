"""``edgeattn run`` on an encoder's export: entities, a label or an embedding a text, by its head."""

from __future__ import annotations

import json
from typing import Any

import click

from edgeattn.run_options import AS_JSON, TRUNCATE, RunHook

AGGREGATION = click.Option(["--aggregation"], type=click.Choice(["simple", "first"]), default="simple",
                           show_default=True, help="Token classifiers: group tokens (simple) or label each word by its "
                           "first piece (first).")  # fmt: skip


def answer(model: Any, texts: list[str], values: dict[str, Any]) -> None:
    """Entities, labels or embeddings of ``texts``, by the encoder's head."""
    as_json, truncate = values["as_json"], values["truncate"]
    head = model.config.head
    if head == "token":
        found_all = model.tag(texts, truncate=truncate, aggregation=values["aggregation"])
        for text, found in zip(texts, found_all, strict=True):
            if as_json:
                click.echo(json.dumps({"text": text, "entities": [e.to_dict() for e in found]}))
                continue
            click.echo(text)
            for e in found:
                click.echo(f"  {e.entity_group:<8} {e.word!r} [{e.start}:{e.end}] {e.score:.3f}")
            if not found:
                click.echo("  (no entities)")
    elif head == "sequence":
        for text, label in zip(texts, model.classify(texts, truncate=truncate), strict=True):
            if as_json:
                click.echo(json.dumps({"text": text, **label.to_dict()}))
            else:
                click.echo(f"{label.label}\t{label.score:.4f}\t{text}")
    else:
        for text, vector in zip(texts, model.embed(texts, truncate=truncate), strict=True):
            if as_json:
                click.echo(json.dumps({"text": text, "embedding": [round(float(v), 7) for v in vector]}))
            else:
                shown = ", ".join(f"{v:.4f}" for v in vector[:4])
                click.echo(f"[{shown}, ...] (dim {vector.shape[0]})\t{text}")


RUN = RunHook((AS_JSON, TRUNCATE, AGGREGATION), answer)
