"""Folders saved by transformers 4.x and 5.x import to the same model, for every architecture.

transformers 5 writes rotary settings under ``config.json``'s ``rope_parameters`` (4.x: top-level
``rope_theta``, ``rope_scaling``), ``dtype`` for ``torch_dtype``, and more. Each model of
:mod:`generations` is built from the same weights by both generations (5.x in the environment
``.ci/transformers5.sh`` makes, 4.x here) and saved with ``save_pretrained``; edgeattn must read
both folders into equal configs and equal eager outputs, and those outputs must be what transformers
5 itself answered on its folder. Also: rope kinds and fields edgeattn does not implement are
errors naming them, and the export's check against transformers stops a misread folder.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from edgeattn.errors import ConfigError, ExportError
from edgeattn.hf import import_folder
from tests.helpers import generations
from tests.helpers.transformers5 import transformers5_python

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def folders5(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("transformers5")
    subprocess.run([str(transformers5_python()), str(ROOT / "tests/helpers/generations.py"), str(out)], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    return out


def _ours(model, name: str, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, np.ndarray]:
    with torch.no_grad():
        if generations.MODELS[name][0].startswith("T5"):
            targets = torch.cat([torch.zeros_like(ids[:, :1]), ids[:, :9]], dim=1)
            return {"logits": model(ids, targets, mask).numpy()}
        if hasattr(model, "lm_head"):
            return {"logits": model(ids, mask).numpy()}
        hidden, logits = model(ids, mask)
        return {"hidden": hidden.numpy(), **({} if logits is None else {"logits": logits.numpy()})}


@pytest.mark.parametrize("name", list(generations.MODELS))
def test_both_generations_import_to_the_same_model(folders5, tmp_path, name):
    folder5 = folders5 / name
    config5 = json.loads((folder5 / "config.json").read_text())
    assert config5["transformers_version"].startswith("5.")
    model4 = generations.build(name)
    from safetensors.torch import load_file

    # the same weights as transformers 5's folder, saved by transformers 4.x
    tensors = load_file(str(folder5 / "model.safetensors"))
    model4.load_state_dict(tensors, strict=False)
    retied = "lm_head.weight" not in tensors and not model4.config.tie_word_embeddings
    if retied:  # transformers 5 ties T5 v1.1's output layer to the embedding (and says so: tie_word_embeddings)
        with torch.no_grad():
            model4.lm_head.weight.copy_(tensors["shared.weight"])
    model4.save_pretrained(tmp_path / "v4")
    assert json.loads((tmp_path / "v4" / "config.json").read_text())["transformers_version"].startswith("4.")
    imported4, imported5 = import_folder(tmp_path / "v4"), import_folder(folder5)
    if retied:
        assert imported5.model.config.tie_embeddings and not imported4.model.config.tie_embeddings
        assert imported4.model.config.replace(tie_embeddings=True) == imported5.model.config
    else:
        assert imported4.model.config == imported5.model.config
    ids, mask = generations.sample_ids()
    ours4, ours5 = _ours(imported4.model, name, ids, mask), _ours(imported5.model, name, ids, mask)
    theirs5 = dict(np.load(folder5 / "outputs.npz"))
    theirs4 = {k: v.numpy() for k, v in generations.outputs(model4, ids, mask).items()}
    assert set(ours5) <= set(theirs5) and ours5
    for key in ours5:
        np.testing.assert_array_equal(ours4[key], ours5[key])
        assert np.abs(ours5[key] - theirs5[key]).max() < 1e-4, (key, np.abs(ours5[key] - theirs5[key]).max())
        assert np.abs(ours4[key] - theirs4[key]).max() < 1e-4, (key, np.abs(ours4[key] - theirs4[key]).max())


def _llama_folder(tmp_path: Path, **changes) -> Path:
    folder = tmp_path / "llama"
    generations.build("llama-theta-tied").save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.quick
@pytest.mark.parametrize(("changes", "named"), [
    ({"rope_scaling": {"rope_type": "su", "factor": 2.0}}, "rope type 'su'"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "extra": 1}}, "extra"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}, "rope_theta"),
    ({"rope_parameters": {"full_attention": {"rope_theta": 1e4}, "sliding_attention": {"rope_theta": 1e4}}},
     "per layer type"),
])  # fmt: skip
def test_rope_settings_edgeattn_does_not_implement_are_named(tmp_path, changes, named):
    with pytest.raises(ConfigError, match=named):
        import_folder(_llama_folder(tmp_path, **changes))


@pytest.mark.quick
def test_both_layouts_agreeing_and_the_old_one_alone_read_the_same(tmp_path):
    new = import_folder(_llama_folder(tmp_path, rope_parameters={"rope_theta": 100000.0, "rope_type": "default"}))
    assert new.model.lm.rope_theta == 100000.0
    assert new.model.lm.rope_type == "default"


def test_the_export_check_stops_a_folder_edgeattn_misreads(tmp_path, monkeypatch):
    """A folder read with the wrong rotary base (the bug of reading only 4.x's top-level key) is
    refused by the check against transformers, naming the largest difference; read right, it passes."""
    from edgeattn.families.causal import hf as hf_causal
    from edgeattn.hf_reference import check_against_transformers, require_transformers_agreement

    folder = tmp_path / "llama"
    generations.build("llama-theta-tied").save_pretrained(folder)
    right = check_against_transformers(import_folder(folder))
    assert right.passed and right.max_abs < 1e-4, right.line()
    real = hf_causal.rope_settings
    monkeypatch.setattr(hf_causal, "rope_settings", lambda hf, path, n: {**real(hf, path, n), "rope_theta": 10000.0})
    with pytest.raises(ExportError, match=r"disagrees with transformers.*logits max abs diff .* FAIL"):
        require_transformers_agreement(import_folder(folder))


def test_a_folder_of_a_newer_generation_is_checked_by_a_python_that_reads_it(folders5, monkeypatch):
    """transformers 4.x cannot read a 5.x folder as it was meant: without a Python that can, the
    check stops the export and says what to do; with transformers 5's Python it checks, and still
    catches a misreading."""
    from edgeattn.families.causal import hf as hf_causal
    from edgeattn.hf_reference import PYTHON_ENV, check_against_transformers, require_transformers_agreement

    if transformers.__version__.startswith("5."):
        pytest.skip("transformers 5 is installed here")
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    imported = import_folder(folders5 / "gemma3-sliding")
    with pytest.raises(ExportError, match="written by transformers 5.* install transformers 5, .*--check-python.*"
                                          "--no-check"):  # fmt: skip
        check_against_transformers(imported)
    python = str(transformers5_python())
    check = check_against_transformers(imported, python)
    assert check.transformers_version.startswith("5.") and check.passed and check.max_abs < 1e-4, check.line()
    monkeypatch.setenv(PYTHON_ENV, python)
    assert check_against_transformers(import_folder(folders5 / "llama-theta-tied")).passed
    real = hf_causal.rope_settings
    monkeypatch.setattr(hf_causal, "rope_settings", lambda hf, path, n: {**real(hf, path, n), "rope_theta": 10000.0})
    with pytest.raises(ExportError, match=r"disagrees with transformers.*against transformers 5.*FAIL"):
        require_transformers_agreement(import_folder(folders5 / "llama-theta-tied"))
    with pytest.raises(ExportError, match="could not start"):
        check_against_transformers(imported, str(Path(python).parent / "no-such-python"))


def test_a_model_too_large_to_hold_is_checked_against_transformers_offloaded_alike(folders5, tmp_path, monkeypatch,
                                                                                   caplog):  # fmt: skip
    """Above the size the check offloads at, transformers' model keeps part of its float32 weights
    on disk (read as each layer runs), in process and in transformers 5's Python: the same answers
    to the last bit as the model held whole. A tied weight stays in memory (Whisper's output
    projection is its decoder's embedding, which the folder does not hold twice)."""
    import logging

    from edgeattn import hf_reference
    from tests.helpers.speech_folders import speech_folder

    folder = tmp_path / "llama"
    generations.build("llama-theta-tied").save_pretrained(folder)
    speech_folder(tmp_path / "whisper")
    cases = [(import_folder(folder), None), (import_folder(folders5 / "gemma3-sliding"), str(transformers5_python())),
             (import_folder(tmp_path / "whisper"), None)]  # fmt: skip
    whole = [hf_reference.check_against_transformers(imported, python) for imported, python in cases]
    monkeypatch.setattr(hf_reference, "OFFLOAD_ABOVE", 0)
    monkeypatch.setattr(hf_reference, "OFFLOAD_MEMORY", 64 << 10)
    with caplog.at_level(logging.INFO, logger="edgeattn.hf_reference"):
        offloaded = [hf_reference.check_against_transformers(imported, python) for imported, python in cases]
    assert caplog.text.count("offloaded to disk") == 3, caplog.text
    for a, b in zip(whole, offloaded, strict=True):
        assert a.passed and b.passed and a.max_abs == b.max_abs, (a.line(), b.line())


def test_cli_export_shows_the_check(tmp_path):
    folder = tmp_path / "llama"
    generations.build("llama-theta-tied").save_pretrained(folder)
    from click.testing import CliRunner

    from edgeattn.cli import cli

    result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "import against transformers" in result.output and " ok" in result.output
    check = json.loads((tmp_path / "out" / "manifest.json").read_text())["import_check"]
    assert check["passed"] and check["transformers"] == transformers.__version__ and "max abs diff" in check["result"]
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(tmp_path / "unchecked"),
                                      "--no-check"])  # fmt: skip
    assert result.exit_code == 0 and "left out by --no-check" in result.output, result.output
    check = json.loads((tmp_path / "unchecked" / "manifest.json").read_text())["import_check"]
    assert check == {"transformers": "", "result": "left out by --no-check", "passed": None}
