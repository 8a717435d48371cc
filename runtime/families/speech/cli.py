"""``edgeattn run`` on a speech export: each audio file's transcript (or English translation), its
segments with times, or its words with times, as txt, srt, vtt or json."""

from __future__ import annotations

from typing import Any

import click

from edgeattn.run_options import BEAMS, MAX_NEW_TOKENS, SEED, STRATEGY, STREAM, TEMPERATURE, TOP_K, RunHook

OPTIONS = (
    STRATEGY, BEAMS, MAX_NEW_TOKENS, TEMPERATURE, TOP_K, SEED, STREAM,
    click.Option(["--language"], default=None, help="Speech: the spoken language's code (default: detected)."),
    click.Option(["--task", "speech_task"], type=click.Choice(["transcribe", "translate"]), default="transcribe",
                 show_default=True, help="Speech: transcribe, or translate into English."),
    click.Option(["--timestamps"], is_flag=True, help="Speech: segments with their times."),
    click.Option(["--prompt", "speech_prompt"], default=None, help="Speech: text the windows are decoded after "
                 "(earlier words, names, spelling)."),
    click.Option(["--condition-on-previous-text"], is_flag=True, help="Speech: decode each window after the text "
                 "heard before it (the prompt only before the first)."),
    click.Option(["--word-timestamps"], is_flag=True, help="Speech: each word with its times, from the alignment "
                 "heads (txt prints a line a word; json gives each segment's words)."),
    click.Option(["--format", "speech_format"], type=click.Choice(["txt", "srt", "vtt", "json"]), default="txt",
                 show_default=True, help="Speech: how the transcript is printed."),
    click.Option(["--fallback"], default=None, help="Speech: temperatures tried in turn (e.g. 0,0.2,0.4,0.6,0.8,1) "
                 "while a window fails --compression-ratio-threshold or --logprob-threshold."),
    click.Option(["--compression-ratio-threshold"], type=float, default=None,
                 help="Speech: a window whose tokens compress more than this repeats itself (1.35 is usual)."),
    click.Option(["--logprob-threshold"], type=float, default=None,
                 help="Speech: a window whose mean token log-probability is under this failed (-1 is usual)."),
    click.Option(["--no-speech-threshold"], type=float, default=None,
                 help="Speech: a window whose no-speech probability is over this, and that fails "
                 "--logprob-threshold, is silence and skipped (0.6 is usual)."),
)  # fmt: skip


def search(values: dict[str, Any]) -> dict[str, Any]:
    """A speech model's search from ``run``'s values: greedy (or --fallback's temperatures), beams,
    or sampling at --temperature; the thresholds, the prompt and conditioning on the text heard."""
    found: dict[str, Any] = {"seed": values["seed"],
                             "compression_ratio_threshold": values["compression_ratio_threshold"],
                             "logprob_threshold": values["logprob_threshold"],
                             "no_speech_threshold": values["no_speech_threshold"],
                             "word_timestamps": values["word_timestamps"], "prompt": values["speech_prompt"],
                             "condition_on_prev_tokens": values["condition_on_previous_text"]}  # fmt: skip
    fallback = values["fallback"]
    if values["top_k"]:
        found["top_k"] = values["top_k"]
    if values["strategy"] == "beam":
        found["num_beams"] = values["beams"]
    if values["strategy"] == "sample":
        if fallback is not None:
            raise click.UsageError("--fallback starts greedy (or with beams) and samples above 0, "
                                   "not with --strategy sample")  # fmt: skip
        found["temperature"] = values["temperature"]
    elif fallback is not None:
        try:
            found["temperature"] = tuple(float(t) for t in fallback.split(","))
        except ValueError:
            raise click.BadParameter(f"{fallback!r} is not temperatures separated by commas",
                                     param_hint="--fallback") from None  # fmt: skip
    return found


def answer(model: Any, paths: list[str], values: dict[str, Any]) -> None:
    """Transcribe each audio file: the whole transcript, or (``--stream``) each segment as it is decoded."""
    from edgeattn.runtime.families.speech.formats import render, render_segments

    timestamps, form = values["timestamps"], values["speech_format"]
    options = {"language": values["language"], "task": values["speech_task"],
               "max_new_tokens": values["max_new_tokens"], **search(values)}  # fmt: skip
    for path in paths:
        if values["stream"]:
            segments = model.segments(path, timestamps=timestamps, **options)
            for piece in render_segments(segments, form, timestamps):
                click.echo(piece, nl=False)
        else:
            click.echo(render(model.transcribe(path, timestamps=timestamps, **options), form, timestamps), nl=False)


RUN = RunHook(OPTIONS, answer)
