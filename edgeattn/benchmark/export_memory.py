"""Memory and time of ``edgeattn export`` on a Hugging Face folder, measured from outside: the
command runs in a child process whose resident memory (and that of the processes it starts, such
as the transformers check) is sampled from /proc every half second. Anonymous memory is what the
export holds of its own; the resident set adds the file pages it maps (the folder's and the
export's weights), which the system can drop and read again under pressure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeattn.errors import EdgeattnError
from edgeattn.phases import ANNOUNCE_ENV, STARTED

#: seconds between samples (short: a session made from a graph peaks for well under a second)
INTERVAL = 0.1


#: what the export's log says as each phase starts (:mod:`edgeattn.phases`)
PHASE_MARK = f"edgeattn.phases: {STARTED}"


@dataclass
class Phase:
    """One phase of an export as its log named it: its seconds and the peaks sampled in it (GB;
    anonymous memory of the export with its children's)."""

    name: str
    seconds: float = 0.0
    peak_anon_gb: float = 0.0
    peak_rss_gb: float = 0.0


@dataclass
class ExportRun:
    """One export's figures: wall seconds and peaks in GB (the export's own process, and with its
    children), the folder's parameter count, the command's exit status and last output, and each
    phase's share."""

    name: str
    parameters: int
    precisions: str
    seconds: float
    peak_anon_gb: float
    peak_rss_gb: float
    peak_tree_rss_gb: float
    exit_code: int
    tail: str = ""
    command: list[str] = field(default_factory=list)
    peak_tree_anon_gb: float = 0.0
    phases: list[Phase] = field(default_factory=list)
    #: one float32 pass over the held-out text, when measured (:func:`float32_pass`)
    float_pass: FloatPass | None = None

    @property
    def times_float_pass(self) -> float | None:
        """The export's wall time over one float32 pass's (the goal: at most 3)."""
        return None if self.float_pass is None else self.seconds / self.float_pass.whole_seconds


def folder_parameters(folder: Path) -> int:
    """The number of values the folder's safetensors files hold (read from their headers)."""
    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for size in entry["shape"]:
                    count *= size
                total += count
    return total


def _status(pid: int) -> dict[str, float]:
    """RssAnon and VmRSS of ``pid`` in GB (empty once it is gone)."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in ("RssAnon", "VmRSS"):
                    out[key] = int(line.split()[1]) / 1e6
    except OSError:
        pass
    return out


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (Linux's per-thread children lists)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def measure_export(name: str, folder: Path, out: Path, precisions: str, extra: list[str] | None = None,
                   python: str = sys.executable) -> ExportRun:  # fmt: skip
    """``edgeattn export --from-hf folder -o out --precision precisions [extra]`` in a child
    process, its memory sampled until it ends."""
    if not Path("/proc/self/status").is_file():
        raise EdgeattnError("measuring an export's memory reads /proc: Linux only")
    command = [python, "-m", "edgeattn.cli", "export", "--from-hf", str(folder), "-o", str(out), "--precision",
               precisions, *(extra or [])]  # fmt: skip
    start = time.perf_counter()
    log = out.parent / f"{out.name}.log"
    out.parent.mkdir(parents=True, exist_ok=True)
    phases: dict[str, Phase] = {}
    current = Phase("starting")
    phases[current.name] = current
    with open(log, "w", encoding="utf-8") as sink, open(log, encoding="utf-8", errors="replace") as reading:
        env = {**os.environ, ANNOUNCE_ENV: "0"}  # every phase announced as it starts
        child = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
        anon = rss = tree = tree_anon = 0.0
        last = time.perf_counter()
        while child.poll() is None:
            for line in reading.read().replace("\r", "\n").splitlines():  # what the export logged since
                if PHASE_MARK in line:
                    label = line.split(PHASE_MARK, 1)[1].strip()
                    current = phases.setdefault(label, Phase(label))
            own = _status(child.pid)
            kids = [_status(p) for p in _children(child.pid)]
            anon, rss = max(anon, own.get("RssAnon", 0.0)), max(rss, own.get("VmRSS", 0.0))
            now_tree = own.get("VmRSS", 0.0) + sum(k.get("VmRSS", 0.0) for k in kids)
            now_anon = own.get("RssAnon", 0.0) + sum(k.get("RssAnon", 0.0) for k in kids)
            tree, tree_anon = max(tree, now_tree), max(tree_anon, now_anon)
            current.peak_anon_gb = max(current.peak_anon_gb, now_anon)
            current.peak_rss_gb = max(current.peak_rss_gb, now_tree)
            now = time.perf_counter()
            current.seconds += now - last
            last = now
            time.sleep(INTERVAL)
    seconds = time.perf_counter() - start
    tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").replace("\r", "\n").splitlines()[-6:])
    named = [p for p in phases.values() if p.seconds > 0 or p.name != "starting"]  # (a phase between samples: 0 s)
    return ExportRun(name, folder_parameters(folder), precisions, seconds, anon, rss, tree, child.returncode, tail,
                     command, tree_anon, named)  # fmt: skip


@dataclass
class FloatPass:
    """One float32 pass of ONNX Runtime over the held-out text (every position's logits, as the
    gate reads them), the floor of a calibrated, gated export's time: ``seconds`` for ``tokens``
    measured, and that rate over the whole text's ``total_tokens``."""

    tokens: int
    total_tokens: int
    seconds: float

    @property
    def whole_seconds(self) -> float:
        return self.seconds * self.total_tokens / max(self.tokens, 1)


def float32_pass(export_dir: Path, heldout: Path, max_tokens: int = 0) -> FloatPass:
    """Time the export's fp32 graph over ``heldout`` (a held-out file as ``--heldout`` reads it),
    rows spread evenly over it up to ``max_tokens`` (0: all), batched as the gate batches them."""
    from edgeattn.exporters.calibration import read_sequences_file
    from edgeattn.exporters.gate import heldout_sources, next_tokens
    from edgeattn.runtime import load

    model = load(export_dir)
    texts = read_sequences_file(heldout, model.config, model.tokenizer, what="held-out")
    rows = heldout_sources(model.config, texts=texts, max_tokens=max_tokens)
    next_tokens(model.next_token_logits, rows.ids[:1], rows.mask[:1], model.config.vocab_size)  # warm
    start = time.perf_counter()
    next_tokens(model.next_token_logits, rows.ids, rows.mask, model.config.vocab_size)
    return FloatPass(int(rows.mask.sum()), sum(len(t) for t in texts), time.perf_counter() - start)


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


@dataclass
class ExportMemoryResult:
    """Every run, and the machine they ran on."""

    runs: list[ExportRun]
    machine: dict[str, Any]

    def table(self) -> str:
        lines = [f"{'model':<24} {'parameters':>11} {'precisions':<14} {'wall':>8} {'anon GB':>8} {'RSS GB':>7} "
                 f"{'+children anon':>14} {'RSS':>6}  result"]  # fmt: skip
        for r in self.runs:
            result = "ok" if r.exit_code == 0 else f"exit {r.exit_code}"
            peaks = (f"{r.peak_anon_gb:>8.2f} {r.peak_rss_gb:>7.2f} {r.peak_tree_anon_gb:>14.2f} "
                     f"{r.peak_tree_rss_gb:>6.2f}")  # fmt: skip
            lines.append(f"{r.name:<24} {r.parameters / 1e9:>10.2f}B {r.precisions:<14} {_clock(r.seconds):>8} "
                         f"{peaks}  {result}")  # fmt: skip
        for r in self.runs:
            if r.float_pass is not None:
                f = r.float_pass
                lines += ["", f"{r.name}: one float32 ONNX Runtime pass over the held-out text: {f.seconds:.1f} s for "
                          f"{f.tokens:,} tokens, {f.whole_seconds:.0f} s for all {f.total_tokens:,}; the export took "
                          f"{r.times_float_pass:.2f}x that"]  # fmt: skip
            lines += ["", f"{r.name}, by phase (with children):",
                      f"  {'phase':<48} {'time':>8} {'anon GB':>8} {'RSS GB':>7}"]  # fmt: skip
            lines += [f"  {p.name[:48]:<48} {_clock(p.seconds):>8} {p.peak_anon_gb:>8.2f} {p.peak_rss_gb:>7.2f}"
                      for p in r.phases]  # fmt: skip
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        rows = [{k: v for k, v in asdict(r).items() if k != "tail"} for r in self.runs]  # the log holds the tail
        for row, run in zip(rows, self.runs, strict=True):
            if run.float_pass is not None:
                row["float_pass_seconds"] = run.float_pass.whole_seconds
                row["times_float_pass"] = run.times_float_pass
        return {"benchmark": "export-memory", "machine": self.machine, "rows": rows}
