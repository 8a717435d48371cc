"""The sensitive-node search: when a quantised graph misses its accuracy limits, keep in float32
the fewest of its most sensitive nodes that make it pass.

Each quantisable node is first quantised alone (every other node kept in float32) and scored by
how much the graph's metrics drop; then the k most damaging nodes are kept in float32 for
k = 1, 2, ... until the graph passes. The search knows nothing of graphs or files: it calls
``trial`` with the nodes to keep in float32 and reads back the metrics and whether they pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

C = TypeVar("C")


@dataclass
class Trial(Generic[C]):
    """One candidate graph with some nodes kept in float32, and how it measured."""

    candidate: C
    metrics: dict[str, float]
    passed: bool


@dataclass
class SearchResult(Generic[C]):
    """The chosen candidate and the nodes it keeps in float32 (most sensitive first)."""

    trial: Trial[C]
    excluded: list[str]
    scores: dict[str, float]
    trials: int


def search_sensitive(nodes: list[str], trial: Callable[[list[str]], Trial[C]]) -> SearchResult[C]:
    """Rank ``nodes`` by the damage each does quantised alone, then exclude the most damaging ones
    until ``trial`` passes (all of them if it never does)."""
    if not nodes:
        raise ValueError("the sensitive-node search needs at least one quantisable node")
    scores: dict[str, float] = {}
    for node in nodes:
        alone = trial([n for n in nodes if n != node])
        scores[node] = sum(1.0 - v for v in alone.metrics.values())
    ranked = sorted(nodes, key=lambda n: -scores[n])
    count = len(nodes)
    for k in range(1, len(ranked) + 1):
        found = trial(ranked[:k])
        count += 1
        if found.passed:
            return SearchResult(found, ranked[:k], scores, count)
    return SearchResult(found, ranked, scores, count)
