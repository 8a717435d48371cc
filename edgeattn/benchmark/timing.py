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
    """Time each variant ``repeats`` times, one run of each per round, after ``warmup`` rounds.

    Each round starts one variant further on, so no variant always runs right after the same one:
    a variant's run can slow the next one down (eager PyTorch's OpenMP threads keep spinning after
    it returns: on 2 cores the ONNX Runtime variant timed right after it took 8-14 ms longer at
    1 x 128 than the same graph timed second), and rotating puts that cost in few of each
    variant's runs, out of the median, instead of in every run of one variant."""
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants.items())
    for round_ in range(repeats):
        shift = round_ % len(order)
        for name, fn in order[shift:] + order[:shift]:
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
        if on_round is not None:
            on_round()
    return {name: Timing.of(s) for name, s in samples.items()}
