"""Timing helpers: warm-up, then interleaved runs so machine drift hits every variant alike."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
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
    variants: dict[str, Callable[[], object]],
    repeats: int,
    warmup: int = 2,
    on_round: Callable[[], None] | None = None,
    settle: Mapping[str, float] | None = None,
    seed: int = 0,
) -> dict[str, Timing]:
    """Time each variant ``repeats`` times, one run of each per round, after ``warmup`` rounds.

    A variant's run can slow the next one down: eager PyTorch's OpenMP threads keep spinning for
    about 10 ms after it returns, and an ONNX Runtime run started in that time on 2 cores took
    11 ms longer (37.6 against 26.0 ms, the reference encoder at 1 x 128). ``settle`` names such
    variants with the seconds to wait, untimed, after each of their runs. What is left of such
    effects is spread over every variant: each round runs them in a new order (seeded), so no
    variant always follows the same one. (Rotating one order, as before, kept each variant behind
    the same neighbour in all rounds but one.)"""
    settle = settle or {}
    rng = np.random.default_rng(seed)
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(warmup + repeats):
        for i in rng.permutation(len(names)) if round_ >= warmup else range(len(names)):
            name = names[i]
            start = time.perf_counter()
            variants[name]()
            if round_ >= warmup:
                samples[name].append(time.perf_counter() - start)
            if settle.get(name):
                time.sleep(settle[name])
        if on_round is not None and round_ >= warmup:
            on_round()
    return {name: Timing.of(s) for name, s in samples.items()}
