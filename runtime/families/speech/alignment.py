"""Word timestamps from the alignment heads' cross-attention (torch-free), as transformers'
``_extract_token_timestamps`` computes token times and its tokenizer groups tokens into words.

A window's decoded tokens are fed back to the decoder; the listed heads' cross-attention weights
(the decoder graph's ``alignment`` output) say where in the audio each token looks. Over the
rows of the generated tokens (the last one has none: it was never fed), cropped to the audio's
frames, the weights are standardised over the tokens, median-filtered over time and averaged
over the heads; dynamic time warping then finds the monotonic path through (token, audio
position) that follows them most, and each token starts where the path first reaches the row
that predicted it.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

import numpy as np

#: seconds an audio position spans (two feature frames of 10 ms)
POSITION_SECONDS = 0.02
#: punctuation joined to the word after it, and to the word before it (OpenAI's and transformers')
PREPENDED = "\"'“¡¿([{-"
APPENDED = "\"'.。,，!！?？:：”)]}、"
#: languages written without spaces between words: a word is each run of whole characters
UNSPACED = {"zh", "ja", "th", "lo", "my", "yue"}


@dataclass(frozen=True)
class Word:
    """A word of the transcript (with its leading space, as the tokenizer writes it) from
    ``start`` to ``end`` seconds, and how sure the model was of it: the mean probability of its
    tokens among the text tokens, each where it was generated (OpenAI's and faster-whisper's)."""

    word: str
    start: float
    end: float
    probability: float | None = None


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """The median of each ``width`` values along the last axis, its edges reflected (left as it
    is when that axis is no longer than half the width)."""
    half = width // 2
    if x.shape[-1] <= half:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(half, half)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.sort(windows, axis=-1)[..., half]


def dynamic_time_warping(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through ``matrix`` (tokens, positions) as its token and position
    indices, step by step: transformers' algorithm (float32 costs, its tie order), the cells of
    each anti-diagonal computed together."""
    rows, cols = matrix.shape
    cost = np.full((rows + 1, cols + 1), np.inf, dtype=np.float32)
    trace = np.full((rows + 1, cols + 1), -1, dtype=np.int8)
    cost[0, 0] = 0
    matrix = matrix.astype(np.float64)
    for diagonal in range(2, rows + cols + 1):
        i = np.arange(max(1, diagonal - cols), min(rows, diagonal - 1) + 1)
        j = diagonal - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        step = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2)).astype(np.int8)
        best = np.choose(step, (c0, c1, c2))
        cost[i, j] = (matrix[i - 1, j - 1] + best.astype(np.float64)).astype(np.float32)
        trace[i, j] = step
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = rows, cols
    tokens, positions = [], []
    while i > 0 or j > 0:
        tokens.append(i - 1)
        positions.append(j - 1)
        move = trace[i, j]
        if move == 0:
            i, j = i - 1, j - 1
        elif move == 1:
            i -= 1
        else:
            j -= 1
    return np.array(tokens[::-1]), np.array(positions[::-1])


def token_times(weights: np.ndarray, positions: int, filter_width: int) -> np.ndarray:
    """When each generated token starts, in seconds from the window's start, from the alignment
    heads' weights (heads, rows, audio positions) over the rows that fed the generated tokens but
    the last (the row fed token i predicts token i + 1, so it says where token i + 1 is heard);
    ``positions``: the audio positions holding audio. The first token starts the window.

    The path is transformers' (its ``token_timestamps`` are these times one token earlier: the
    time it gives a token is when the next one starts, which its pipeline's words then read)."""
    rows = weights.shape[1]
    if rows == 0:
        return np.zeros(1)
    w = weights[:, :, : max(1, positions)].astype(np.float32)
    w = (w - w.mean(axis=1, keepdims=True)) / w.std(axis=1, keepdims=True)
    matrix = median_filter(w, filter_width).mean(axis=0)
    tokens, steps = dynamic_time_warping(-matrix.astype(np.float64))
    jumps = np.diff(tokens, prepend=-1).astype(bool)
    return np.concatenate([[0.0], steps[jumps] * POSITION_SECONDS])


def group_words(tokens: list[int], times: np.ndarray, tokenizer: Any, eos: int, language: str | None = None,
                offset: float = 0.0, probs: np.ndarray | None = None) -> list[Word]:  # fmt: skip
    """The words of a run of tokens with their times (``times`` one longer than ``tokens``: the
    next token's time ends the last word), timestamp and special tokens left out. A word starts
    at its first token's time and ends at the time of the token after its last; punctuation joins
    its neighbour as transformers' tokenizer joins it; with ``probs`` (each token's probability)
    its probability is its tokens' mean."""
    pieces: list[tuple[str, list[int]]] = []  # (text, indices into tokens)
    for text, indices in _characters(tokens, tokenizer, eos):
        if language in UNSPACED or not pieces or text.startswith(" ") or text.strip() in string.punctuation:
            pieces.append((text, indices))
        else:
            word, before = pieces[-1]
            pieces[-1] = (word + text, before + indices)
    pieces = _merge_punctuation(pieces)
    return [Word(text, round(offset + float(times[idx[0]]), 3), round(offset + float(times[idx[-1] + 1]), 3),
                 None if probs is None else round(float(np.mean(probs[idx])), 6)) for text, idx in pieces]  # fmt: skip


def text_token_probabilities(logits: np.ndarray, tokens: list[int], eos: int) -> np.ndarray:
    """Each token's probability among the text tokens (below ``eos``) under the logits (tokens,
    vocab) it was generated from; NaN for a timestamp or special token."""
    text = logits[:, :eos].astype(np.float64)
    text = np.exp(text - text.max(-1, keepdims=True))
    probs = np.full(len(tokens), np.nan)
    for k, token in enumerate(tokens):
        if token < eos:
            probs[k] = text[k, token] / text[k].sum()
    return probs


def _characters(tokens: list[int], tokenizer: Any, eos: int) -> list[tuple[str, list[int]]]:
    """The text tokens (below ``eos``) as runs that decode to whole characters (a character of
    several bytes may span tokens), each with its tokens' indices."""
    runs: list[tuple[str, list[int]]] = []
    pending: list[int] = []
    for index, token in enumerate(tokens):
        if token >= eos:
            continue
        pending.append(index)
        text = str(tokenizer.decode([tokens[k] for k in pending]))
        if "\ufffd" not in text:
            runs.append((text, pending))
            pending = []
    return runs


def _merge_punctuation(pieces: list[tuple[str, list[int]]]) -> list[tuple[str, list[int]]]:
    """Opening punctuation (after a space) joined to the word after it, closing punctuation to the
    word before it."""
    words = [list(p) for p in pieces]
    after = len(words) - 1
    for i in range(len(words) - 2, -1, -1):
        if words[i][0].startswith(" ") and words[i][0].strip() in PREPENDED:
            words[after] = [words[i][0] + words[after][0], words[i][1] + words[after][1]]
            words[i] = ["", []]
        else:
            after = i
    before = 0
    for j in range(1, len(words)):
        if not words[before][0].endswith(" ") and words[j][0] in APPENDED:
            words[before] = [words[before][0] + words[j][0], words[before][1] + words[j][1]]
            words[j] = ["", []]
        else:
            before = j
    return [(w, idx) for w, idx in words if w]
