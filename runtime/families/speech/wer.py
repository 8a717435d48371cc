"""Word error rate: the word-level edit distance of a transcript from its reference, over the
reference's words, both lower-cased with punctuation dropped (hyphens and apostrophes inside words
kept)."""

from __future__ import annotations

import re
from collections.abc import Sequence

_WORD = re.compile(r"[a-z0-9]+(?:['’-][a-z0-9]+)*")


def words(text: str) -> list[str]:
    """``text``'s words, lower-cased, punctuation dropped."""
    return _WORD.findall(text.lower())


def edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Substitutions, insertions and deletions that turn ``a`` into ``b``."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def word_error_rate(references: Sequence[str], transcripts: Sequence[str]) -> float:
    """Errors over reference words, summed across the pairs."""
    if len(references) != len(transcripts):
        raise ValueError(f"{len(references)} references for {len(transcripts)} transcripts")
    total = sum(len(words(r)) for r in references)
    if total == 0:
        raise ValueError("the references hold no words")
    return sum(edit_distance(words(r), words(t)) for r, t in zip(references, transcripts, strict=True)) / total
