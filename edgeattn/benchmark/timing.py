"""Timing helpers: warm-up, then interleaved runs so machine drift hits every variant alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class Timing:
    """Latency statistics in milliseconds."""

    median: float
    p90: float
    p99: float
    mean: float
    runs: int

    @classmethod
    def of(cls, seconds: list[float]) -> Timing:
        ms = np.asarray(seconds) * 1e3
        return cls(
            float(np.median(ms)), float(np.percentile(ms, 90)), float(np.percentile(ms, 99)), float(ms.mean()), len(ms)
        )


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn`` (after one untimed call), in seconds."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def interleaved(
    variants: dict[str, Callable[[], object]], repeats: int, warmup: int = 2, on_round: Callable[[], None] | None = None
) -> dict[str, Timing]:
    """Time each variant ``repeats`` times, one run of each per round, after ``warmup`` rounds."""
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
        if on_round is not None:
            on_round()
    return {name: Timing.of(s) for name, s in samples.items()}
