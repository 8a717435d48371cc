"""A transcript as text, SubRip (srt), WebVTT (vtt) or JSON, whole or a segment at a time."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from edgeattn.errors import EdgeattnError

FORMATS = ("txt", "srt", "vtt", "json")


def clock(seconds: float, decimal: str = ",") -> str:
    """``HH:MM:SS,mmm`` (srt) or ``HH:MM:SS.mmm`` (vtt, ``decimal="."``)."""
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{millis:03d}"


def render_segments(segments: Iterable[Any], form: str, timestamps: bool = True) -> Iterator[str]:
    """Each piece of the output as its segment is ready (``segments``: objects with start, end and
    text, and words where they were asked for): a txt line per segment (``[start --> end]`` before
    it with ``timestamps``; a line per word, with its times, where the segment has its words), srt
    and vtt cues (vtt's header first), a JSON object a line (its words with their times)."""
    if form not in FORMATS:
        raise EdgeattnError(f"the format is one of {', '.join(FORMATS)}, not {form!r}")
    if form == "vtt":
        yield "WEBVTT\n\n"
    for number, s in enumerate(segments, 1):
        text = s.text.strip()
        words = getattr(s, "words", None)
        if form == "txt" and words is not None:
            yield "".join(f"[{clock(w.start, '.')} --> {clock(w.end, '.')}]  {w.word.strip()}\n" for w in words)
        elif form == "txt":
            yield (f"[{clock(s.start, '.')} --> {clock(s.end, '.')}]  {text}\n" if timestamps else f"{text}\n")
        elif form == "srt":
            yield f"{number}\n{clock(s.start)} --> {clock(s.end)}\n{text}\n\n"
        elif form == "vtt":
            yield f"{clock(s.start, '.')} --> {clock(s.end, '.')}\n{text}\n\n"
        else:
            line = {"start": s.start, "end": s.end, "text": s.text, "tokens": list(s.tokens)}
            if words is not None:
                line["words"] = [{"word": w.word, "start": w.start, "end": w.end, "probability": w.probability}
                                 for w in words]  # fmt: skip
            yield json.dumps(line, ensure_ascii=False) + "\n"


def render(transcript: Any, form: str, timestamps: bool = False) -> str:
    """A whole transcript: txt its text (segment lines with their times with ``timestamps``, word
    lines where its segments have their words), srt and vtt its cues, json the transcript as one
    object."""
    if form == "json":
        return json.dumps(transcript.as_dict(), ensure_ascii=False) + "\n"
    worded = any(getattr(s, "words", None) is not None for s in transcript.segments)
    if form == "txt" and not timestamps and not worded:
        return transcript.text.strip() + "\n"
    return "".join(render_segments(transcript.segments, form, timestamps))
