"""The shipped demo model: it sorts digit strings, through the exported graphs and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from edgeattn.demo import answer, demo_tokenizer, heldout_set, shipped_checkpoint
from edgeattn.exporters.export import export_model
from edgeattn.runtime import load
from edgeattn.sources import resolve_model


@pytest.fixture(scope="module")
def demo_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    source = resolve_model()  # no arguments: the demo preset
    assert source.tokenizer is not None and "trained" in source.description
    result = export_model(source.model, out, tokenizer=source.tokenizer)
    assert result.report.passed
    return out


def test_shipped_checkpoint_is_small_safetensors():
    path = shipped_checkpoint()
    assert path.is_file() and path.stat().st_size < 5_000_000


def test_exported_demo_sorts_held_out_sequences(demo_export):
    rt = load(demo_export)
    seqs = heldout_set()[:400]
    texts = [" ".join(map(str, s)) for s in seqs]
    answers = rt.generate_text(texts)
    right = sum(a == " ".join(map(str, answer(s))) for a, s in zip(answers, seqs, strict=True))
    assert right / len(seqs) >= 0.99


def test_tokenizer_round_trip_and_errors():
    tok = demo_tokenizer()
    ids = tok.encode("5 2 9 1")
    assert tok.decode([*ids, tok.eos_id, 7]) == "5 2 9 1"
    with pytest.raises(ValueError, match="unknown token"):
        tok.encode("5 <eos>")
    with pytest.raises(ValueError, match="empty"):
        tok.encode("  ")


def edgeattn(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "edgeattn.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)  # fmt: skip


def test_run_command(demo_export, tmp_path):
    result = edgeattn("run", str(demo_export), "5 2 9 1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1 2 5 9"
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("3 1 2\n\n9 9 0 4\n")
    result = edgeattn("run", str(demo_export), "--file", str(inputs), "--strategy", "beam")
    assert result.stdout.splitlines() == ["1 2 3", "0 4 9 9"]
    streamed = edgeattn("run", str(demo_export), "8 1 5", "--stream")
    assert streamed.stdout.split() == ["1", "5", "8"]
    bad = edgeattn("run", str(demo_export), "5 two")
    assert bad.returncode == 1 and "unknown token(s) 'two'" in bad.stderr and "Traceback" not in bad.stderr
    speech = edgeattn("run", str(demo_export), "5 2", "--prompt", "earlier words", "--word-timestamps")
    assert speech.returncode == 2 and "--prompt, --word-timestamps: not for a seq2seq export" in speech.stderr


def test_run_stays_torch_free(demo_export):
    code = (
        "import sys\nsys.modules['torch'] = None\nfrom click.testing import CliRunner\nfrom edgeattn.cli import cli\n"
        f"r = CliRunner().invoke(cli, ['run', {str(demo_export)!r}, '2 1'])\n"
        "assert r.exit_code == 0, r.output\nprint(r.output)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1 2"


def test_train_demo_command_writes_a_loadable_checkpoint(tmp_path):
    result = edgeattn("train-demo", "-o", "ckpt/demo.safetensors", "--steps", "30", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "held-out exact match" in result.stdout
    from edgeattn.weights import load_model

    model = load_model(tmp_path / "ckpt" / "demo.safetensors")
    assert model.config.vocab_size == len(demo_tokenizer().vocab)
    assert np.isfinite(next(model.parameters()).detach().numpy()).all()


def test_the_main_job_with_no_arguments(tmp_path):
    """`edgeattn export` exactly as the README's first line runs it."""
    result = edgeattn("export", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "greedy decode" in result.stdout and "FAIL" not in result.stdout
    out = tmp_path / "edgeattn-export"
    assert {"encoder.onnx", "cross_kv.onnx", "decoder.onnx", "attention.onnx", "manifest.json", "tokenizer.json"} <= {
        p.name for p in out.iterdir()
    }
    assert edgeattn("run", str(out), "7 3 5").stdout.strip() == "3 5 7"
    assert json.loads((out / "manifest.json").read_text())["task"] == "demo-sort"  # quantize gates on its held-out set


def test_run_takes_providers_and_their_options(demo_export):
    """Providers by name on the command line, built in or plugins; one that cannot run here is a
    warning and the CPU; misused options are usage errors in one line."""

    def run(*args: str) -> subprocess.CompletedProcess:
        return edgeattn("run", str(demo_export), "5 6 7", *args)

    ok = run("--providers", "NoSuchExecutionProvider,CPUExecutionProvider")
    assert ok.returncode == 0 and ok.stdout.strip() == "5 6 7"
    assert ok.stderr.count("NoSuchExecutionProvider is not available") == 1  # once, not once per graph
    both = run("--cpu", "--providers", "CPUExecutionProvider")
    assert both.returncode == 2 and "--cpu or --providers" in both.stderr
    orphan = run("--provider-option", "a=1")
    assert orphan.returncode == 2 and "--provider-option needs --providers" in orphan.stderr
    stray = run("--providers", "CPUExecutionProvider", "--provider-option", "Other:a=1")
    assert stray.returncode == 1 and "not among the providers" in stray.stderr and "Traceback" not in stray.stderr
