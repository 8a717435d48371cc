"""From an encoder's outputs to answers about text: labels with probabilities, entity spans with
character offsets, and pooled sentence embeddings (numpy only).

Entities are grouped as ``transformers``' token-classification pipeline groups them. With the
``simple`` aggregation each token takes its most probable label; with ``first`` each word (the
tokenizer's word ids) takes the most probable label of its first piece, and that probability.
Then consecutive tokens (words) of one entity type join a group unless one's tag starts a new
one (``B-``); a group's score is the mean of its members'; special tokens and groups labelled
``O`` are left out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from edgeattn.runtime.manifest import EmbeddingPooling


@dataclass
class Classification:
    """A text's most probable label, its probability, and every label's."""

    label: str
    score: float
    scores: dict[str, float]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class Entity:
    """One entity in a text: its type, mean token probability, and character span."""

    entity_group: str
    score: float
    word: str
    start: int
    end: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities over the last axis."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def label_names(labels: list[str] | None, count: int) -> list[str]:
    """The model's label names, or ``LABEL_i`` where the export has none."""
    return list(labels) if labels and len(labels) == count else [f"LABEL_{i}" for i in range(count)]


def classifications(logits: np.ndarray, labels: list[str]) -> list[Classification]:
    """(B, labels) logits as one :class:`Classification` per row."""
    out = []
    for row in softmax(logits.astype(np.float64)):
        best = int(row.argmax())
        scores = {n: float(p) for n, p in zip(labels, row, strict=True)}
        out.append(Classification(labels[best], float(row[best]), scores))
    return out


def _tag(label: str) -> tuple[str, str]:
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


AGGREGATIONS = ("simple", "first")


def entities(
    logits: np.ndarray, text: str, offsets: list[tuple[int, int]], special: list[bool], labels: list[str],
    words: list[int | None] | None = None, aggregation: str = "simple", ignore: tuple[str, ...] = ("O",),
) -> list[Entity]:  # fmt: skip
    """The entities of one text from its (S, labels) token logits (real tokens first); ``words``
    (each token's word index) is needed by the ``first`` aggregation."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation {aggregation!r} is not one of {', '.join(AGGREGATIONS)}")
    probs = softmax(logits[: len(offsets)].astype(np.float64))
    tokens: list[tuple[str, float, tuple[int, int]]] = []
    previous: int | None = None
    for k, (span, is_special) in enumerate(zip(offsets, special, strict=True)):
        if is_special:
            previous = None
            continue
        word = None if words is None else words[k]
        if aggregation == "first" and tokens and word is not None and word == previous:
            label, score, first = tokens[-1]
            tokens[-1] = (label, score, (first[0], span[1]))  # a later piece widens its word's span
            continue
        previous = word
        best = int(probs[k].argmax())
        tokens.append((labels[best], float(probs[k, best]), span))
    groups: list[list[tuple[str, float, tuple[int, int]]]] = []
    for token in tokens:
        bi, tag = _tag(token[0])
        if groups and tag == _tag(groups[-1][-1][0])[1] and bi != "B":
            groups[-1].append(token)
        else:
            groups.append([token])
    found = []
    for group in groups:
        tag = group[0][0].split("-", 1)[-1]
        if tag in ignore:
            continue
        start, end = group[0][2][0], group[-1][2][1]
        found.append(Entity(tag, float(np.mean([t[1] for t in group])), text[start:end], start, end))
    return found


def pool(hidden: np.ndarray, mask: np.ndarray, pooling: EmbeddingPooling) -> np.ndarray:
    """(B, S, d) token vectors -> (B, d) sentence vectors as ``pooling`` says."""
    m = mask.astype(hidden.dtype)[:, :, None]  # (B, S, 1)
    if pooling.mode == "cls":
        out = hidden[:, 0]
    elif pooling.mode == "max":
        out = np.where(m > 0, hidden, -np.inf).max(axis=1)
    else:
        out = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1.0)
    if pooling.normalize:
        out = out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    return out.astype(np.float32)
