"""The real checkpoints' folders and their exports, shared by the real tests: a folder is built by
its script in the transformers 5 environment (``.ci/transformers5.sh``) and cached under
``~/.cache/edgeattn-real``; an export is the command line's, with verification and the gate on."""

from __future__ import annotations

import math
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.real import texts

HERE = Path(__file__).parent
ROOT = Path(os.environ.get("EDGEATTN_REAL", Path.home() / ".cache" / "edgeattn-real"))
#: the gate's held-out file: 120 KB of prose
HELDOUT_BYTES = 120_000


def real_folder(folder: Path, script: str, timeout: int = 900) -> Path:
    """``folder``, built first by ``script`` when the transformers 5 environment is there (skips
    without it; fails in CI, whose .ci/run makes both)."""
    venv = Path(os.environ.get("EDGEATTN_TF5", Path.home() / ".cache" / "edgeattn-tf5"))
    if not (folder / "reference.json").is_file() or not (folder / "built.json").is_file():
        if not (venv / ".edgeattn-ready-1").is_file():
            if os.environ.get("CI"):
                pytest.fail(f"no transformers 5 environment at {venv}: .ci/run makes it with .ci/transformers5.sh")
            pytest.skip(f"no transformers 5 environment at {venv} (bash .ci/transformers5.sh makes it)")
    subprocess.run([str(venv / "bin" / "python"), str(HERE / script), str(folder)], check=True, capture_output=True,
                   timeout=timeout)  # fmt: skip
    return folder


def cli_export(folder: Path, work: Path, name: str, precisions: str = "int8,int4") -> tuple[Path, str, float]:
    """(the export, its output, seconds) of ``edgeattn export --from-hf folder`` at ``precisions``,
    gated on 120 KB of held-out prose."""
    from click.testing import CliRunner

    from edgeattn.cli import cli

    heldout = work / "heldout.txt"
    heldout.write_text("\n".join(texts.split("heldout", HELDOUT_BYTES)) + "\n", encoding="utf-8")
    start = time.perf_counter()
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(work / name),
                                      "--precision", precisions, "--heldout", str(heldout)])  # fmt: skip
    seconds = time.perf_counter() - start
    assert result.exit_code == 0, result.output + repr(result.exception)
    return work / name, result.output, seconds


def perplexity(model, rows: list[dict]) -> float:
    """Over ``rows``' token ids, teacher forced in batches of rows of like length (the gate's way)."""
    from edgeattn.exporters.gate import heldout_sources, next_tokens

    held = heldout_sources(model.config, texts=[r["ids"] for r in rows])
    scored = next_tokens(model.next_token_logits, held.ids, held.mask, model.config.vocab_size)
    return math.exp(-scored.logp[scored.valid].mean())


def assert_logits_equal_transformers(folder: Path, export: Path) -> None:
    """The fp32 graph's logits of the folder's first evaluation paragraph against transformers 5's
    own (``logits.npy``): within 1e-4 + 1e-3 of their scale, the same top token everywhere."""
    import json

    import numpy as np

    from edgeattn.runtime import load

    rows = json.loads((folder / "reference.json").read_text())["evaluation"]["rows"]
    want = np.load(folder / "logits.npy")  # (T - 1, vocab)
    ids = np.array([rows[0]["ids"]])
    got = load(export, precision="fp32").next_token_logits(ids, np.ones_like(ids))[0, :-1]
    assert np.abs(got - want).max() <= 1e-4 + 1e-3 * np.abs(want).max(), np.abs(got - want).max()
    assert (got.argmax(-1) == want.argmax(-1)).mean() == 1.0


def perplexities(export: Path, reference: dict, paragraphs: int = 40) -> tuple[float, dict[str, float]]:
    """(transformers' perplexity, each precision's) over the first ``paragraphs`` evaluation
    paragraphs (never in the held-out file), printed side by side."""
    from edgeattn.runtime import load

    rows = reference["evaluation"]["rows"][:paragraphs]
    tokens = sum(len(r["ids"]) - 1 for r in rows)
    want = math.exp(-sum(r["logp_sum"] for r in rows) / tokens)
    got = {p: perplexity(load(export, precision=p), rows) for p in ("fp32", "int8", "int4")}
    print(f"\nperplexity on {tokens} tokens: transformers {want:.3f}, " +
          ", ".join(f"{p} {v:.3f} ({100 * (v / want - 1):+.1f}%)" for p, v in got.items()))  # fmt: skip
    return want, got
