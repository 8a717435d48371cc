"""The sensitive-node search: when a quantised graph misses its accuracy limits, keep in float32
the fewest of its most sensitive node groups that make it pass, within a time budget.

Nodes are grouped (by the layer their weights belong to, contiguous layers merged into at most
:data:`MAX_GROUPS` groups, see :func:`group_nodes`), so that a 30-layer model costs a dozen trials,
not one whole re-quantisation a node. Each group is first quantised alone (every other node kept
in float32) and scored by how much the graph's metrics drop; then the k most damaging groups are
kept in float32 for k = 1, 2, ... until the graph passes. Scoring stops at half of ``seconds``
(the groups not scored yet rank after the scored ones, in layer order) and the search at all of
it, keeping its best candidate so far. The search knows nothing of graphs or files: it calls
``trial`` with the nodes to keep in float32 and reads back the metrics and whether they pass.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

C = TypeVar("C")

#: the most groups a search ranks
MAX_GROUPS = 12
#: the default time budget of one graph's search, in seconds
SEARCH_SECONDS = 180.0


@dataclass
class Trial(Generic[C]):
    """One candidate graph with some nodes kept in float32, and how it measured."""

    candidate: C
    metrics: dict[str, float]
    passed: bool


@dataclass
class SearchResult(Generic[C]):
    """The chosen candidate, the nodes it keeps in float32 (most sensitive group first), and the
    groups' scores."""

    trial: Trial[C]
    excluded: list[str]
    scores: dict[str, float]
    trials: int
    #: whether the time budget ended the search before it was done
    cut_short: bool = False


def _layer(weight: str) -> int | None:
    match = re.search(r"(?:^|[./_])(?:layers?|h|block|blocks)[./_](\d+)(?:[./_]|$)", weight)
    return None if match is None else int(match.group(1))


def group_nodes(weights: dict[str, str], max_groups: int = MAX_GROUPS) -> dict[str, list[str]]:
    """Nodes grouped by the layer their weight (``{node: weight name}``) names, contiguous layers
    merged into at most ``max_groups`` groups counting the rest (embeddings, heads), which go one
    group each by their weight's name."""
    layers: dict[int, list[str]] = {}
    others: dict[str, list[str]] = {}
    for node, weight in weights.items():
        layer = _layer(weight)
        if layer is None:
            others.setdefault(weight.split(".")[0] or node, []).append(node)
        else:
            layers.setdefault(layer, []).append(node)
    groups: dict[str, list[str]] = {}
    ordered = sorted(layers)
    slots = max(1, max_groups - len(others))
    per = max(1, -(-len(ordered) // slots))
    for start in range(0, len(ordered), per):
        span = ordered[start : start + per]
        name = f"layer {span[0]}" if len(span) == 1 else f"layers {span[0]}-{span[-1]}"
        groups[name] = [n for layer in span for n in layers[layer]]
    groups.update(others)
    return groups


def search_sensitive(
    groups: dict[str, list[str]], trial: Callable[[list[str]], Trial[C]], seconds: float = SEARCH_SECONDS
) -> SearchResult[C]:
    """Rank ``groups`` by the damage each does quantised alone, then exclude the most damaging ones
    until ``trial`` passes (all of them if it never does), within ``seconds``."""
    if not groups:
        raise ValueError("the sensitive-node search needs at least one quantisable node")
    start = time.monotonic()
    every = [n for nodes in groups.values() for n in nodes]
    scores: dict[str, float] = {}
    cut = False
    for name, nodes in groups.items():
        if scores and time.monotonic() - start > seconds / 2:
            cut = True
            log.warning("sensitive-node search: %d of %d groups scored in its %.0f s", len(scores), len(groups),
                        seconds)  # fmt: skip
            break
        inside = set(nodes)
        alone = trial([n for n in every if n not in inside])
        scores[name] = sum(1.0 - v for v in alone.metrics.values())
    ranked = sorted(groups, key=lambda g: -scores.get(g, float("-inf")))
    count = len(scores)
    found: Trial[C] | None = None
    excluded: list[str] = []
    for k in range(1, len(ranked) + 1):
        if found is not None and time.monotonic() - start > seconds:
            cut = True
            log.warning("sensitive-node search stopped at its %.0f s with %d group(s) in float32", seconds, k - 1)
            break
        excluded = [n for g in ranked[:k] for n in groups[g]]
        found = trial(excluded)
        count += 1
        if found.passed:
            break
    assert found is not None
    return SearchResult(found, excluded, scores, count, cut)
