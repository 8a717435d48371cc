"""A language model's export timed precision by precision: the prompt (prefill) and the decoding
steps after it, every precision the export holds in one process, interleaved round by round
(``edgeattn bench DIR`` on a decoder-only export). The peers (transformers, Optimum,
onnxruntime-genai, llama.cpp) are ``edgeattn/families/causal/peers.py``'s."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.benchmark.machine import machine_info
from edgeattn.runtime.families import family_of
from edgeattn.runtime.precisions import FP32


@dataclass
class CausalRow:
    precision: str
    prompt: int
    batch: int
    prefill_s: float
    decode_tok_s: float
    #: decode tokens/s against fp32's in the same cell
    ratio: float = 1.0


@dataclass
class CausalBench:
    export_dir: str
    new_tokens: int
    threads: int
    rounds: int
    rows: list[CausalRow] = field(default_factory=list)
    disk_mb: dict[str, float] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"benchmark": "causal export", **asdict(self)}

    def table(self) -> str:
        lines = [f"{self.export_dir}: greedy, {self.new_tokens} new tokens, {self.threads} threads, "
                 f"{self.rounds} interleaved rounds",
                 f"{'precision':<10} {'prompt':>6} {'batch':>5} {'prefill s':>9} {'decode tok/s':>12} {'vs fp32':>8} "
                 f"{'on disk MB':>10}"]  # fmt: skip
        for r in self.rows:
            lines.append(f"{r.precision:<10} {r.prompt:>6} {r.batch:>5} {r.prefill_s:>9.3f} {r.decode_tok_s:>12.1f} "
                         f"{r.ratio:>7.2f}x {self.disk_mb.get(r.precision, 0):>10.0f}")  # fmt: skip
        return "\n".join(lines)


def bench_causal(export_dir: str | Path, prompts: tuple[int, ...] = (128,), batches: tuple[int, ...] = (1,),
                 new_tokens: int = 64, threads: int = 2, rounds: int = 3, precisions: tuple[str, ...] = ()
                 ) -> CausalBench:  # fmt: skip
    """Time every precision of a decoder-only export (or ``precisions``); see the module docstring."""
    from edgeattn.runtime import load
    from edgeattn.runtime.manifest import read_manifest
    from edgeattn.runtime.safety import graph_bytes

    export_dir = Path(export_dir)
    manifest = read_manifest(export_dir)
    step = family_of(manifest.config).generation[-1]  # the graph each new token runs
    entry = manifest.graphs[step]
    held = [FP32, *entry.precisions]
    chosen = [p for p in held if not precisions or p in precisions]
    models = {p: load(export_dir, threads=threads, precision=p, providers=["CPUExecutionProvider"]) for p in chosen}
    result = CausalBench(str(export_dir), new_tokens, threads, rounds, machine=machine_info())
    result.disk_mb = {p: graph_bytes(export_dir / manifest.entry(step, p).file) / 1e6 for p in chosen}
    rng = np.random.default_rng(0)
    vocab = manifest.config.vocab_size
    samples: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for round_ in range(rounds):
        for prompt in prompts:
            for batch in batches:
                ids = rng.integers(3, vocab, size=(batch, prompt))
                for precision in chosen if round_ % 2 == 0 else reversed(chosen):
                    samples.setdefault((precision, prompt, batch), []).append(_time(models[precision], ids, new_tokens))
    for (precision, prompt, batch), runs in samples.items():
        result.rows.append(CausalRow(precision, prompt, batch, statistics.median(r[0] for r in runs),
                                     statistics.median(r[1] for r in runs)))  # fmt: skip
    base = {(r.prompt, r.batch): r.decode_tok_s for r in result.rows if r.precision == chosen[0]}
    for r in result.rows:
        r.ratio = r.decode_tok_s / base[(r.prompt, r.batch)]
    return result


def _time(model: Any, ids: np.ndarray, new_tokens: int) -> tuple[float, float]:
    """(prefill s, decode tokens/s a row) of one greedy generation, every step run."""
    start = time.perf_counter()
    state = model.state(ids, np.ones_like(ids), capacity=ids.shape[1] + new_tokens)
    token = state.step(ids[:, -1]).argmax(-1)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(new_tokens - 1):
        token = state.step(token).argmax(-1)
    return prefill, (new_tokens - 1) / (time.perf_counter() - start)


def bench_export(export_dir: str | Path, seqs: tuple[int, ...], batches: tuple[int, ...], threads: int,
                 precisions: tuple[str, ...]) -> CausalBench:  # fmt: skip
    """``edgeattn bench`` of a decoder-only export (the family record's ``bencher``): ``seqs`` are
    the prompts' lengths."""
    return bench_causal(export_dir, seqs, batches, threads=threads, precisions=precisions)


def write_json(result: CausalBench, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
