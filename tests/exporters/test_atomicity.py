"""Writers killed at any point and writers at the same time: the target holds the previous complete
export or the new complete one, never a partial one that ``load`` accepts, and no work is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgeattn.errors import ExportError
from edgeattn.exporters.export import export_model, quantize_export, recover_interrupted
from edgeattn.exporters.lock import writer_lock
from edgeattn.model import build_model
from edgeattn.runtime import ManifestError, load, read_manifest
from edgeattn.runtime.layout import previous_name
from edgeattn.runtime.manifest import sha256_file

FRACTIONS = (0.15, 0.35, 0.55, 0.75, 0.9, 0.97)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgeattn.cli", *args]


def state(target: Path, previous: str) -> str:
    """Which complete export ``target`` holds, after checking it loads: the ``previous`` one (its
    manifest's sha256), a new one with the int8 graphs the writer adds, or another."""
    load(target)
    if sha256_file(target / "manifest.json") == previous:
        return "previous"
    graphs = read_manifest(target).graphs.values()
    return "new" if all("int8" in g.precisions for g in graphs) and load(target, precision="int8") else "another"


def kill_at(command: list[str], seconds: float, cwd: Path) -> int:
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        process.wait()
    return process.returncode


@pytest.mark.slow
@pytest.mark.parametrize("command", ["export", "quantize"])
def test_a_killed_writer_leaves_the_previous_or_the_new_export(tmp_path, command):
    """Kill the writer at several points of a run whose full length was measured first."""
    out = tmp_path / "out"
    assert subprocess.run(cli("export", "--preset", "tiny", "-o", "out", "--no-verify"), cwd=tmp_path).returncode == 0
    previous = sha256_file(out / "manifest.json")
    args = (cli("export", "--preset", "tiny", "-o", "out", "--seed", "1", "--precision", "int8", "--force")
            if command == "export" else cli("quantize", "out", "--precision", "int8"))  # fmt: skip
    backup = tmp_path / "backup"
    os.rename(out, backup)
    subprocess.run(["cp", "-a", str(backup), str(out)], check=True)
    start = time.perf_counter()
    assert subprocess.run(args, cwd=tmp_path, capture_output=True).returncode == 0
    full = time.perf_counter() - start
    assert state(out, previous) == "new"
    seen = []
    for fraction in FRACTIONS:
        subprocess.run(["rm", "-rf", str(out)], check=True)
        subprocess.run(["cp", "-a", str(backup), str(out)], check=True)
        code = kill_at(args, full * fraction, tmp_path)
        leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out."))
        if not out.exists():  # killed between the two renames: the previous export waits beside it
            with pytest.raises(ManifestError, match="killed while swapping"):
                load(out)
            with writer_lock(out):  # as the next export or quantize does
                recover_interrupted(out)
        got = state(out, previous) if code == -signal.SIGKILL else "finished"
        seen.append((fraction, got, leftovers))
        assert got in ("previous", "new", "finished"), seen
        with writer_lock(out):  # the next writer takes over the killed one's lock file and clears its leftovers
            recover_interrupted(out)
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")], seen  # nothing left behind
    print(f"{command} ({full:.1f} s): " + "; ".join(f"{f:.2f} {g} {left}" for f, g, left in seen))  # pytest -s
    assert any(g == "previous" for _, g, _ in seen), seen  # some kills landed mid-build


@pytest.mark.quick
@pytest.mark.slow  # a writer in another process: out of the quick tier
def test_a_second_writer_is_refused_while_the_first_holds_the_directory(tmp_path):
    out = tmp_path / "out"
    export_model(build_model_tiny(), out, graphs=["encoder"], verify=False)
    before = sha256_file(out / "manifest.json")
    with writer_lock(out) as lock:
        assert lock.read_text() == str(os.getpid())
        with pytest.raises(
            ExportError, match=rf"being written by another edgeattn export or quantize \(pid {os.getpid()}\)"
        ):
            quantize_export(out, ["int8"])
        with pytest.raises(ExportError, match="being written"):
            export_model(build_model_tiny(), out, graphs=["encoder"], verify=False, force=True)
    assert sha256_file(out / "manifest.json") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the lock file is gone with the lock
    (tmp_path / ".out.lock").write_text("12345")  # left by a killed writer: not locked, taken over
    quantize_export(out, ["int8"])
    assert "int8" in read_manifest(out).graphs["encoder"].precisions


@pytest.mark.slow
def test_two_quantize_runs_at_once_lose_nothing(tmp_path):
    """Each run either adds its precision or is refused in one line; none is silently lost."""
    assert subprocess.run(cli("export", "--preset", "tiny", "-o", "out", "--no-verify", "--graphs", "encoder"),
                          cwd=tmp_path).returncode == 0  # fmt: skip
    runs = {p: subprocess.Popen(cli("quantize", "out", "--precision", p), cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for p in ("int8", "int4")}  # fmt: skip
    results = {p: (r.wait(timeout=300), r.stderr.read()) for p, r in runs.items()}
    have = read_manifest(tmp_path / "out").graphs["encoder"].precisions
    for precision, (code, err) in results.items():
        if code == 0:
            assert precision in have, results
        else:
            assert code == 1 and "being written by another" in err and len(err.strip().splitlines()) == 1, results
    assert any(code == 0 for code, _ in results.values())
    load(tmp_path / "out")


def test_an_export_killed_mid_swap_is_restored_by_the_next_writer(tmp_path):
    out = tmp_path / "out"
    export_model(build_model_tiny(), out, graphs=["encoder"], verify=False)
    before = sha256_file(out / "manifest.json")
    os.rename(out, tmp_path / previous_name("out", 4242))  # what a kill between the two renames leaves
    (tmp_path / ".out.partial-x1").mkdir()
    with pytest.raises(
        ManifestError, match=r"killed while swapping it; its previous version waits in .*\.out\.old-4242"
    ):
        load(out)
    done = recover_interrupted(out)
    assert len(done) == 2 and sha256_file(out / "manifest.json") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def build_model_tiny():
    from edgeattn.config import ModelConfig

    return build_model(ModelConfig(architecture="encoder", vocab_size=40, d_model=16, n_heads=2, d_ff=24,
                                   n_encoder_layers=1, n_decoder_layers=0, max_len=32), seed=0)  # fmt: skip
