"""Memory and time of ``edgeattn export`` on a Hugging Face folder, measured from outside: the
command runs in a child process whose resident memory (and that of the processes it starts, such
as the transformers check) is sampled from /proc every half second. Anonymous memory is what the
export holds of its own; the resident set adds the file pages it maps (the folder's and the
export's weights), which the system can drop and read again under pressure."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeattn.errors import EdgeattnError

#: seconds between samples
INTERVAL = 0.5


@dataclass
class ExportRun:
    """One export's figures: wall seconds and peaks in GB (the export's own process, and with its
    children), the folder's parameter count, and the command's exit status and last output."""

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
    with open(log, "w", encoding="utf-8") as sink:
        child = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        anon = rss = tree = 0.0
        while child.poll() is None:
            own = _status(child.pid)
            anon, rss = max(anon, own.get("RssAnon", 0.0)), max(rss, own.get("VmRSS", 0.0))
            tree = max(tree, own.get("VmRSS", 0.0) + sum(_status(p).get("VmRSS", 0.0) for p in _children(child.pid)))
            time.sleep(INTERVAL)
    seconds = time.perf_counter() - start
    tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").replace("\r", "\n").splitlines()[-6:])
    return ExportRun(name, folder_parameters(folder), precisions, seconds, anon, rss, tree, child.returncode, tail,
                     command)  # fmt: skip


@dataclass
class ExportMemoryResult:
    """Every run, and the machine they ran on."""

    runs: list[ExportRun]
    machine: dict[str, Any]

    def table(self) -> str:
        lines = [f"{'model':<24} {'parameters':>11} {'precisions':<14} {'wall':>8} {'anon GB':>8} {'RSS GB':>7} "
                 f"{'+children':>9}  result"]  # fmt: skip
        for r in self.runs:
            wall = f"{int(r.seconds // 60)}:{int(r.seconds % 60):02d}"
            result = "ok" if r.exit_code == 0 else f"exit {r.exit_code}"
            peaks = f"{r.peak_anon_gb:>8.2f} {r.peak_rss_gb:>7.2f} {r.peak_tree_rss_gb:>9.2f}"
            lines.append(f"{r.name:<24} {r.parameters / 1e9:>10.2f}B {r.precisions:<14} {wall:>8} {peaks}  {result}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        rows = [{k: v for k, v in asdict(r).items() if k != "tail"} for r in self.runs]  # the log holds the tail
        return {"benchmark": "export-memory", "machine": self.machine, "rows": rows}
