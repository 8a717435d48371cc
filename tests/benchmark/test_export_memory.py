"""The export memory benchmark measures a real export from outside (its peaks, its time, the
folder's parameters) and reports a failed one with its error."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import causal_folders

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]


def test_an_export_is_measured_and_a_failed_one_reports_why(tmp_path):
    from edgeattn.benchmark.export_memory import ExportMemoryResult, float32_pass, folder_parameters, measure_export
    from edgeattn.benchmark.machine import machine_info

    folder, model = causal_folders.save_folder("llama-gqa-tied", tmp_path / "hf")
    assert folder_parameters(folder) == sum(p.numel() for p in model.parameters())  # a tied head counted once
    run = measure_export("llama", folder, tmp_path / "out", "fp32-opt", ["--no-check"])
    assert run.exit_code == 0, run.tail
    assert (tmp_path / "out" / "manifest.json").is_file()
    assert 0.05 < run.peak_anon_gb <= run.peak_rss_gb <= run.peak_tree_rss_gb < 8 and run.seconds > 0
    assert run.peak_anon_gb <= run.peak_tree_anon_gb <= run.peak_tree_rss_gb
    named = [p.name for p in run.phases]  # each phase the export announced, in order, its peaks within the run's
    assert any(n.startswith("importing") for n in named) and "verifying against eager PyTorch" in named, named
    assert "fp32-opt: making the causal_decoder graph" in named, named
    assert all(p.peak_anon_gb <= run.peak_tree_anon_gb for p in run.phases)
    assert sum(p.seconds for p in run.phases) == pytest.approx(run.seconds, rel=0.2)
    broken = measure_export("broken", tmp_path / "missing", tmp_path / "none", "fp32-opt", ["--no-check"])
    assert broken.exit_code != 0 and "missing" in broken.tail
    heldout = tmp_path / "heldout.txt"  # this folder has no tokenizer: token ids a line
    heldout.write_text("\n".join(" ".join(str(5 + (i * 7 + j) % 50) for j in range(8 + i)) for i in range(12)))
    whole = float32_pass(tmp_path / "out", heldout)
    assert whole.tokens == whole.total_tokens == sum(8 + i for i in range(12)) and whole.seconds > 0
    part = float32_pass(tmp_path / "out", heldout, max_tokens=40)
    assert part.tokens <= 40 < part.total_tokens and part.whole_seconds > part.seconds
    run.float_pass = whole
    result = ExportMemoryResult([run, broken], machine_info())
    table = result.table()
    assert "llama" in table and "exit" in table and "verifying against eager PyTorch" in table
    assert "one float32 ONNX Runtime pass" in table
    assert result.to_dict()["rows"][0]["times_float_pass"] == pytest.approx(run.seconds / whole.seconds)
