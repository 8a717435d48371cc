"""``edgeattn run`` on a language model's export: each text answered as a user's message through its
chat template, or continued as it is (``--raw``, or where the export has no template)."""

from __future__ import annotations

from typing import Any

import click

from edgeattn.run_options import TEXT_GENERATION, RunHook, answer_text, text_search

RAW = click.Option(["--raw"], is_flag=True, help="Language models: continue TEXT as it is (default: as a user's "
                   "message through the chat template, where the export has one).")  # fmt: skip


def answer(model: Any, texts: list[str], values: dict[str, Any]) -> None:
    """Chat answers where the export has a chat template (and not ``--raw``), else continuations."""
    if model.chat_template is None or values["raw"]:
        answer_text(model, texts, values)
        return
    options, max_new_tokens = text_search(values), values["max_new_tokens"]
    for text in texts:
        messages = [{"role": "user", "content": text}]
        if values["stream"]:
            for piece in model.stream_chat(messages, max_new_tokens=max_new_tokens, **options):
                click.echo(piece, nl=False)
            click.echo()
        else:
            click.echo(model.chat(messages, max_new_tokens=max_new_tokens, **options))


RUN = RunHook((*TEXT_GENERATION, RAW), answer)
