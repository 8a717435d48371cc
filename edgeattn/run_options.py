"""What ``edgeattn run`` asks of a family: the options its answers take and how it prints them.

A family's record names its :class:`RunHook` (``Family.run_hook``); ``edgeattn run`` offers every
family's options and refuses one that the loaded export's family does not take. Options several
families share (text generation's search) are defined here once. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click


@dataclass(frozen=True)
class RunHook:
    """A family's part of ``edgeattn run``."""

    #: the options its answers take, besides the inputs, precision, threads and providers every run takes
    options: tuple[click.Option, ...]
    #: ``answer(model, inputs, values)``: print the answers to ``inputs`` (texts, or audio files),
    #: ``values`` holding every option's value by name
    answer: Callable[[Any, list[str], dict[str, Any]], None]


STRATEGY = click.Option(["--strategy"], type=click.Choice(["greedy", "beam", "sample"]), default="greedy",
                        show_default=True)  # fmt: skip
BEAMS = click.Option(["--beams"], default=4, show_default=True, help="Beam width for --strategy beam.")
MAX_NEW_TOKENS = click.Option(["--max-new-tokens"], type=int, default=None,
                              help="Default: twice the input length plus 8.")  # fmt: skip
TEMPERATURE = click.Option(["--temperature"], default=1.0, show_default=True)
TOP_K = click.Option(["--top-k"], default=0, show_default=True)
TOP_P = click.Option(["--top-p"], default=1.0, show_default=True)
SEED = click.Option(["--seed"], type=int, default=None, help="Seed for --strategy sample.")
STREAM = click.Option(["--stream"], is_flag=True,
                      help="Print the answer as it is produced (one input; beam search: once every beam agrees).")
TRUNCATE = click.Option(["--truncate"], is_flag=True, help="Cut texts longer than the model takes (else an error).")
REPETITION_PENALTY = click.Option(["--repetition-penalty"], default=1.0, show_default=True,
                                  help="> 1 makes repeated tokens less likely.")  # fmt: skip
AS_JSON = click.Option(["--json", "as_json"], is_flag=True,
                       help="Encoders and vision models: one JSON object per input.")  # fmt: skip
STOP = click.Option(["--stop", "stops"], multiple=True, help="End the answer before this text; repeatable.")

#: what every text-generating family's run takes
TEXT_GENERATION = (STRATEGY, BEAMS, MAX_NEW_TOKENS, TEMPERATURE, TOP_K, TOP_P, SEED, STREAM, TRUNCATE,
                   REPETITION_PENALTY, STOP)  # fmt: skip


def text_search(values: dict[str, Any]) -> dict[str, Any]:
    """The search a text generation runs, from ``run``'s values: greedy, beams, or sampling; the
    repetition penalty and stop strings where given."""
    options: dict[str, Any] = {"strategy": values["strategy"]}
    if values["strategy"] == "beam":
        options["num_beams"] = values["beams"]
    if values["strategy"] == "sample":
        options.update(temperature=values["temperature"], top_k=values["top_k"], top_p=values["top_p"],
                       seed=values["seed"])  # fmt: skip
    if values["repetition_penalty"] != 1.0:
        options["repetition_penalty"] = values["repetition_penalty"]
    if values["stops"]:
        options["stop"] = list(values["stops"])
    return options


def answer_text(model: Any, texts: list[str], values: dict[str, Any]) -> None:
    """Each text's generated answer, or (``--stream``, one text) its pieces as they come."""
    options = text_search(values)
    max_new_tokens, truncate = values["max_new_tokens"], values["truncate"]
    if values["stream"]:
        if len(texts) != 1:
            raise click.UsageError("--stream takes one input")
        for piece in model.stream_text(texts[0], max_new_tokens=max_new_tokens, truncate=truncate, **options):
            click.echo(piece, nl=False)
        click.echo()
        return
    for answer in model.generate_text(texts, max_new_tokens=max_new_tokens, truncate=truncate, **options):
        click.echo(answer)


def family_options(hooks: list[RunHook]) -> list[click.Option]:
    """Every option the hooks take, each once (an option two families share is one object)."""
    by_name: dict[str, click.Option] = {}
    for hook in hooks:
        for option in hook.options:
            known = by_name.setdefault(option.name or "", option)
            if known is not option:
                raise AssertionError(f"two families define run's --{option.name} differently; share one option")
    return list(by_name.values())
