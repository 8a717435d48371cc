"""Static int8 calibration data and the gate's held-out data: a user's sequence file
(representative inputs, one per line), and the feeds each graph is calibrated on."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgeattn.config import ModelConfig
from edgeattn.errors import ConfigError, ExportError
from edgeattn.model import TransformerModel
from edgeattn.runtime.families import family_of, resolve
from edgeattn.runtime.tokenizer import TextTokenizer, TokenizerError, WordTokenizer


def listed_files(path: Path, suffixes: tuple[str, ...], what: str) -> list[Path]:
    """The files of a held-out set that is not text: those of a folder with one of ``suffixes``, one
    such file, or a text file naming them a line each (relative to it); ``what`` names them in errors
    ("audio", "images")."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in suffixes)
    elif path.suffix.lower() in suffixes:
        files = [path]
    else:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--heldout {path}: held-out {what} is a folder of files ({', '.join(suffixes)}), "
                              f"one such file, or a text file naming them ({exc})") from exc  # fmt: skip
        files = [path.parent / line.strip() for line in lines if line.strip()]
    if not files:
        raise ConfigError(f"--heldout {path} holds no {what} ({', '.join(suffixes)})")
    return files


def read_sequences_file(
    path: str | Path,
    config: ModelConfig,
    tokenizer: WordTokenizer | TextTokenizer | None = None,
    what: str = "calibration",
) -> list[list[int]]:
    """Token id sequences from ``path`` (a ``what`` file: calibration or held-out): one sequence
    per line, blank lines and ``#`` comments skipped. With a ``tokenizer`` (the export has one) a
    line is text, encoded by it; without, a line is whitespace-separated token ids. Every
    sequence is checked against the model's vocabulary and ``max_len``; errors name the line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportError(f"cannot read {what} file {path}: {exc}") from exc
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
        raise ExportError(f"{what} file {path} holds no sequences")
    return sequences


#: Static int8 calibration: batches, and rows per batch when sequences are drawn from the vocabulary.
CALIBRATION_BATCHES = 8
CALIBRATION_ROWS = 8


def calibration_feeds(
    model: TransformerModel,
    graph: str,
    sequences: list[list[int]] | None = None,
    new_tokens: int = 16,
    batches: int = CALIBRATION_BATCHES,
) -> list[dict[str, np.ndarray]]:
    """Representative feeds for ``graph`` in up to ``batches`` batches, made as its family role
    says: from the user's calibration ``sequences`` when given, else drawn from the model's own
    vocabulary and length range (other sequences than the gate's). A graph that takes hidden
    states (attention) gets random ones of the same sizes either way."""
    from edgeattn.exporters.gate import heldout_sources

    c = model.config
    role = family_of(c).role(graph)
    make = resolve(role.calibration)
    spec = role.spec(c)
    if sequences:
        calib = heldout_sources(c, texts=sequences)
        batches = min(batches, len(sequences))
    else:
        calib = heldout_sources(c, n=CALIBRATION_ROWS * batches, seed=1234)
    feeds: list[dict[str, np.ndarray]] = []
    rng = np.random.default_rng(7)
    for rows in np.array_split(np.arange(calib.ids.shape[0]), batches):
        ids, mask = calib.ids[rows], calib.mask[rows]
        width = int(mask.sum(axis=1).max())
        feeds.append(make(model, spec, ids[:, :width], mask[:, :width], rng, new_tokens))
    return feeds


def describe_calibration(sequences: list[list[int]] | None, source: str = "") -> str:
    """Where static int8 calibration data came from, as the manifest records it."""
    if not sequences:
        drawn = CALIBRATION_ROWS * CALIBRATION_BATCHES
        return f"drawn from the model's vocabulary and length range ({drawn} sequences)"
    return f"{source or 'user sequences'} ({len(sequences)} sequences)"
