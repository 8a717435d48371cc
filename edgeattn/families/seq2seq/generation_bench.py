"""Generation speed: the cached decoder step against recomputing the whole prefix each step.

Per-step latency at given positions (a cache of that many tokens, one new token) beside the
cost of feeding the whole prefix again with an empty cache, which is what decoding without a
cache pays each step, and, where the export has ``decoder_fixed``, the same step over a cache of
fixed capacity written in place (the runtime's IO-bound stepper, capacity = the decode's
length); and tokens per second of a full greedy decode each way. Runs on the exported graphs
through the runtime's CPU sessions, interleaved run by run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.benchmark.machine import machine_info
from edgeattn.benchmark.timing import Timing, interleaved
from edgeattn.runtime import load
from edgeattn.runtime.cross_decoding import CROSS_KV, DECODER, SlotStepper
from edgeattn.runtime.families.seq2seq.runtime import Seq2SeqRuntime
from edgeattn.runtime.session import CPU
from edgeattn.runtime.specs import SLOT_CACHE


@dataclass
class StepRow:
    position: int
    cached: Timing
    recompute: Timing
    #: the step over ``decoder_fixed`` (a cache of fixed capacity written in place), where exported
    slots: Timing | None = None

    @property
    def speedup(self) -> float:
        return self.recompute.median / self.cached.median


@dataclass
class GenerationBench:
    export_dir: str
    batch: int
    src_len: int
    threads: int
    steps: list[StepRow] = field(default_factory=list)
    tokens: int = 0
    cached_tokens_per_s: float = 0.0
    recompute_tokens_per_s: float = 0.0
    #: the capacity of the fixed cache (0: the export has no decoder_fixed)
    capacity: int = 0
    slots_tokens_per_s: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def flatness(self) -> float:
        """Cached step latency at the last position over the first (1.0 is perfectly flat)."""
        return self.steps[-1].cached.median / self.steps[0].cached.median

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["flatness"] = self.flatness
        for row, step in zip(data["steps"], self.steps, strict=True):
            row["speedup"] = step.speedup
        return data

    def table(self) -> str:
        slots = f"  slots ({self.capacity}) ms (p90)" if self.capacity else ""
        lines = [
            f"generation on the CPU provider, {self.threads} threads, batch {self.batch}, source {self.src_len}",
            f"position  cached step ms (p90)  recompute ms (p90)  recompute / cached{slots}",
        ]
        for s in self.steps:
            lines.append(
                f"{s.position:>8}  {s.cached.median:>9.2f} ({s.cached.p90:6.2f})  "
                f"{s.recompute.median:>9.2f} ({s.recompute.p90:7.2f})  {s.speedup:>10.1f}x"
                + (f"  {s.slots.median:>13.2f} ({s.slots.p90:6.2f})" if s.slots is not None else "")
            )
        lines.append(
            f"cached step at {self.steps[-1].position} / at {self.steps[0].position}: {self.flatness:.2f}x "
            f"(1.00 = flat)"
        )
        if self.tokens:
            slots = ""
            if self.slots_tokens_per_s:
                ratio = self.slots_tokens_per_s / self.cached_tokens_per_s
                slots = f", slots {self.slots_tokens_per_s:.1f} tok/s ({ratio:.2f}x cached)"
            lines.append(
                f"greedy decode of {self.tokens} tokens: cached {self.cached_tokens_per_s:.1f} tok/s, "
                f"recompute {self.recompute_tokens_per_s:.1f} tok/s "
                f"({self.cached_tokens_per_s / self.recompute_tokens_per_s:.1f}x){slots}"
            )
        return "\n".join(lines)


def _decoder_feeds(tokens: np.ndarray, past: dict[str, np.ndarray], fixed: dict[str, Any]) -> dict[str, Any]:
    return {"input_ids": tokens, **fixed, **past}


def _recompute_decode(rt: Seq2SeqRuntime, fixed: dict[str, Any], batch: int, n: int) -> None:
    """Greedy decoding that feeds the whole prefix with an empty cache at every step."""
    c = rt.config
    prefix = np.full((batch, 1), c.bos_id, dtype=np.int64)
    empty = rt.empty_cache(batch)
    for _ in range(n):
        out = rt.run(DECODER, _decoder_feeds(prefix, empty, fixed))["logits"]
        nxt = out[:, -1].argmax(-1)[:, None].astype(np.int64)
        prefix = np.concatenate([prefix, nxt], axis=1)


def _slot_step(rt: Seq2SeqRuntime, ids: np.ndarray, mask: np.ndarray, capacity: int, past: dict[str, np.ndarray],
               tokens: np.ndarray) -> Callable[[], Any]:  # fmt: skip
    """One decoder_fixed step at the position after ``past`` (whose keys and values fill the first
    slots), through the runtime's stepper: the same slot is written on every call."""
    stepper = rt.stepper(ids, mask, 1, capacity)
    assert isinstance(stepper, SlotStepper)
    filled = next(iter(past.values())).shape[2]
    for name, array in stepper.host.items():
        array[:, :, :filled] = past["past" + name[len(SLOT_CACHE) :]]

    def run() -> None:
        stepper.rewind(filled)
        stepper.step(tokens)

    return run


def bench_generation(
    export_dir: str | Path,
    positions: tuple[int, ...] = (16, 64, 256),
    batch: int = 1,
    src_len: int = 128,
    threads: int = 2,
    repeats: int = 20,
    decode_tokens: int | None = None,
    seed: int = 0,
) -> GenerationBench:
    """Measure an export's decoder; see the module docstring."""
    rt = load(export_dir, providers=[CPU], threads=threads, spinning="run")
    c = rt.config
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, c.vocab_size, size=(batch, src_len), dtype=np.int64)
    mask = np.ones_like(ids)
    hidden = rt.encode(ids, mask)
    fixed = {"encoder_attention_mask": mask, **rt.run(CROSS_KV, {"encoder_hidden_states": hidden})}
    n = decode_tokens if decode_tokens is not None else max(positions)
    result = GenerationBench(str(export_dir), batch, src_len, threads, machine=machine_info())
    if rt.cache_slots:
        result.capacity = max(n, max(positions) + 1)
    for p in positions:
        prefix = rng.integers(3, c.vocab_size, size=(batch, p), dtype=np.int64)
        outs = rt.run(DECODER, _decoder_feeds(prefix, rt.empty_cache(batch), fixed))
        past = {k: outs["present" + k[4:]] for k in rt.empty_cache(batch)}
        new = prefix[:, -1:]
        full = np.concatenate([prefix, new], axis=1)
        empty = rt.empty_cache(batch)
        runs = {
            "cached": lambda new=new, past=past: rt.run(DECODER, _decoder_feeds(new, past, fixed)),
            "recompute": lambda full=full, empty=empty: rt.run(DECODER, _decoder_feeds(full, empty, fixed)),
        }
        if result.capacity:
            runs["slots"] = _slot_step(rt, ids, mask, result.capacity, past, new[:, 0])
        timings = interleaved(runs, repeats=repeats)
        result.steps.append(StepRow(p, timings["cached"], timings["recompute"], timings.get("slots")))
    if n:
        rt.cache_slots = False
        start = time.perf_counter()
        rt.generate(ids, mask, n, eos_id=-1)
        result.cached_tokens_per_s = n * batch / (time.perf_counter() - start)
        if result.capacity:
            rt.cache_slots = True
            start = time.perf_counter()
            rt.generate(ids, mask, n, eos_id=-1)
            result.slots_tokens_per_s = n * batch / (time.perf_counter() - start)
        start = time.perf_counter()
        _recompute_decode(rt, fixed, batch, n)
        result.recompute_tokens_per_s = n * batch / (time.perf_counter() - start)
        result.tokens = n
    return result
