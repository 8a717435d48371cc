"""A user's calibration file for static int8: representative source sequences, one per line."""

from __future__ import annotations

from pathlib import Path

from edgeattn.config import ModelConfig
from edgeattn.errors import ExportError
from edgeattn.runtime.tokenizer import TokenizerError, WordTokenizer


def read_calibration_file(
    path: str | Path, config: ModelConfig, tokenizer: WordTokenizer | None = None
) -> list[list[int]]:
    """Token id sequences from ``path``: one sequence per line, blank lines and ``#`` comments
    skipped. With a ``tokenizer`` (the export has one) a line is text, encoded by it; without,
    a line is whitespace-separated token ids. Every sequence is checked against the model's
    vocabulary and ``max_len``; errors name the line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportError(f"cannot read calibration file {path}: {exc}") from exc
    sequences: list[list[int]] = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{path.name} line {number}"
        if tokenizer is not None:
            try:
                ids = tokenizer.encode(text)
            except TokenizerError as exc:
                raise ExportError(f"{where}: {exc}") from exc
        else:
            try:
                ids = [int(word) for word in text.split()]
            except ValueError as exc:
                raise ExportError(
                    f"{where}: expected whitespace-separated token ids (the model has no tokenizer), got {text[:60]!r}"
                ) from exc
        bad = [i for i in ids if not 0 <= i < config.vocab_size]
        if bad:
            raise ExportError(f"{where}: token id {bad[0]} is outside the vocabulary 0..{config.vocab_size - 1}")
        if len(ids) > config.max_len:
            raise ExportError(f"{where}: {len(ids)} tokens, more than the model's max_len {config.max_len}")
        sequences.append(ids)
    if not sequences:
        raise ExportError(f"calibration file {path} holds no sequences")
    return sequences
