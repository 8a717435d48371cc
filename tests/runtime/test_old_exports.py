"""Exports written by edgeattn before model families were recorded load unchanged, as their
family's runtime, and answer as they did (tests/fixtures/make_old_exports.py made them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgeattn.runtime import load
from edgeattn.runtime.families.encoder.runtime import EncoderRuntime
from edgeattn.runtime.families.seq2seq.runtime import Seq2SeqRuntime
from edgeattn.runtime.manifest import read_manifest

pytestmark = pytest.mark.quick

OLD = Path(__file__).resolve().parents[1] / "fixtures" / "old-exports"
RECORD = json.loads((OLD / "answers.json").read_text())
IDS, MASK = np.array(RECORD["ids"]), np.array(RECORD["mask"])


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_an_old_seq2seq_export_generates_as_it_did(precision):
    assert read_manifest(OLD / "seq2seq").family is None  # written before families were recorded
    model = load(OLD / "seq2seq", providers=["CPUExecutionProvider"], precision=precision)
    assert isinstance(model, Seq2SeqRuntime) and model.family.name == "seq2seq"
    want = RECORD["answers"][f"seq2seq/{precision}"]
    assert model.generate(IDS, MASK, 8).tokens.tolist() == want["tokens"]
    assert model.generate(IDS, MASK, 8, strategy="beam", num_beams=3).tokens.tolist() == want["beam"]
    np.testing.assert_allclose(model.encode(IDS, MASK), np.array(want["hidden"]), atol=1e-6)
    assert not hasattr(model, "classify")


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_an_old_encoder_export_classifies_as_it_did(precision):
    model = load(OLD / "encoder", providers=["CPUExecutionProvider"], precision=precision)
    assert isinstance(model, EncoderRuntime) and model.family.name == "encoder"
    want = RECORD["answers"][f"encoder/{precision}"]
    np.testing.assert_allclose(model.classify(IDS, MASK), np.array(want["logits"]), atol=1e-6)
    np.testing.assert_allclose(model.encode(IDS, MASK), np.array(want["hidden"]), atol=1e-6)
    assert not hasattr(model, "generate")
