"""transformers' token timestamps as edgeattn gives them: when each token starts.

transformers' ``generate(return_token_timestamps=True)`` gives a token the time the row fed that
token first reaches on the alignment path, which is where the *next* token is heard (its pipeline
reads them one token later for words). edgeattn gives each token its own start: transformers'
time of the token before it, the window's start for a window's first token."""

from __future__ import annotations

from typing import Any


def their_token_starts(out: dict[str, Any], segments: list[Any]) -> list[tuple[list[int], list[float]]]:
    """Each segment of a ``generate(..., return_segments=True, return_token_timestamps=True)``
    result (one audio) as its tokens and their start times, each window starting where edgeattn's
    ``segments`` of it say (their ``seek``, in 10 ms frames)."""
    windows: dict[int, list[dict[str, Any]]] = {}
    for segment in out["segments"][0]:
        windows.setdefault(id(segment["result"]), []).append(segment)
    offsets = sorted({s.seek * 0.01 for s in segments})
    assert len(offsets) == len(windows), "edgeattn and transformers decoded as many windows"
    starts = []
    for offset, theirs in zip(offsets, windows.values(), strict=True):
        times = [float(x) for s in theirs for x in s["token_timestamps"]]
        shifted, at = [offset, *times[:-1]], 0
        for s in theirs:
            n = len(s["tokens"])
            starts.append((s["tokens"].tolist(), [round(t, 3) for t in shifted[at : at + n]]))
            at += n
    return starts
