"""Two variants against each other, paired: they alternate call by call in one process and the
ratio of each pair's times is taken, once with A loaded first and once with B loaded first.

Two T5 runtimes in one process do not run alike: the one loaded second ran its decoding step
1-4% faster than the first even when both were the same export. A single ordering therefore
credits whichever variant is loaded second. The geometric mean of the two orders' median ratios
cancels that, and their product tells how large the ordering effect was.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Builds a variant (loads it) and returns the call to time.
Loader = Callable[[], Callable[[], Any]]


@dataclass(frozen=True)
class Paired:
    """B's time over A's with the load order cancelled; the second-loaded runtime's advantage."""

    ratio: float
    order_effect: float  # the median ratio of second-loaded over first-loaded, were both alike
    a_ms: float
    b_ms: float
    pairs: int

    def line(self, a: str, b: str) -> str:
        return (f"{b} / {a}: {self.ratio:.4f} ({b} {self.b_ms:.3f} ms, {a} {self.a_ms:.3f} ms, median of "
                f"{self.pairs} pairs per load order; the second-loaded ran at {self.order_effect:.4f}x)")  # fmt: skip


def _one_order(
    first: Loader, second: Loader, pairs: int, warmup: int, clock: Callable[[], float]
) -> tuple[float, list[float], list[float]]:
    calls = [first(), second()]
    for _ in range(warmup):
        for call in calls:
            call()
    ratios, times = [], ([], [])
    for k in range(pairs):
        took = [0.0, 0.0]
        for i in (0, 1) if k % 2 == 0 else (1, 0):  # neither always runs right after the other
            start = clock()
            calls[i]()
            took[i] = clock() - start
        ratios.append(took[1] / took[0])
        times[0].append(took[0])
        times[1].append(took[1])
    return float(np.median(ratios)), times[0], times[1]


def paired(
    load_a: Loader, load_b: Loader, pairs: int = 500, warmup: int = 20, clock: Callable[[], float] = time.perf_counter
) -> Paired:
    """Time B against A in both load orders; each loader is called once per order."""
    ab, a1, b1 = _one_order(load_a, load_b, pairs, warmup, clock)  # B loaded second: B / A
    ba, b2, a2 = _one_order(load_b, load_a, pairs, warmup, clock)  # A loaded second: A / B
    return Paired(
        ratio=math.sqrt(ab / ba), order_effect=math.sqrt(ab * ba),
        a_ms=1000 * float(np.median(a1 + a2)), b_ms=1000 * float(np.median(b1 + b2)), pairs=pairs,
    )  # fmt: skip


def step_loader(
    export_dir: str, precision: str, batch: int, src_len: int = 128, position: int = 32, threads: int = 2
) -> Loader:
    """A loader of an export's decoding step at ``batch``: the source encoded once, then every
    call runs the step that writes slot ``position`` of a ``2 * position``-slot cache."""

    def load() -> Callable[[], Any]:
        from edgeattn.runtime import load as load_export
        from edgeattn.runtime.cross_decoding import SlotStepper
        from edgeattn.runtime.session import CPU

        model = load_export(export_dir, providers=[CPU], threads=threads, precision=precision, spinning="run")
        rng = np.random.default_rng(0)
        ids = rng.integers(3, model.config.vocab_size, (batch, src_len)).astype(np.int64)
        stepper = model.stepper(ids, np.ones_like(ids), capacity=2 * position)
        if not isinstance(stepper, SlotStepper):
            raise ValueError(f"{export_dir} has no decoder_fixed graph: its step cannot be repeated in place")
        tokens = np.zeros(batch, dtype=np.int64)
        for _ in range(position):
            stepper.step(tokens)

        def step() -> None:
            stepper.rewind(position)
            stepper.step(tokens)

        return step

    return load


@dataclass
class PairedSteps:
    """A paired step benchmark as printed and written: which exports, at what, and the outcome."""

    a: str
    b: str
    precision: str
    batch: int
    result: Paired
    machine: dict[str, Any]

    def table(self) -> str:
        return f"decoding step, {self.precision}, batch {self.batch}: " + self.result.line(self.a, self.b)

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "precision": self.precision, "batch": self.batch,
                "ratio": self.result.ratio, "order_effect": self.result.order_effect, "a_ms": self.result.a_ms,
                "b_ms": self.result.b_ms, "pairs": self.result.pairs, "machine": self.machine}  # fmt: skip
