"""Whisper's decoding rules (torch-free) driving edgeattn's PyTorch Whisper give the tokens
transformers' ``generate`` gives on the same folder: prompts for language and task, language
detection, suppressed tokens, and the timestamp rules, at batch 1 and 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edgeattn.runtime.families.speech.decoding import WhisperDecoding, WhisperRules, WhisperSettingsError, greedy
from tests.helpers.speech_folders import (
    EOS,
    GENERATION,
    NO_TIMESTAMPS,
    SOT,
    whisper_folder,
)

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("whisper-decoding")
    reference = whisper_folder(path, vocab_size=51865, seed=3, target_positions=64)
    reference.generation_config = transformers.GenerationConfig(**GENERATION)
    reference.generation_config.save_pretrained(path)
    return path


def _ours(folder, features, language, task, timestamps, new_tokens):
    from edgeattn.families.speech.hf import import_whisper

    model, decoding = import_whisper(folder), WhisperDecoding.from_folder(folder)
    with torch.no_grad():
        cross = model.cross_kv(model.encode(torch.from_numpy(features)))
        if language is None:
            first = model.decode(torch.full((len(features), 1), decoding.start), cross_kv=cross)[0][:, -1].numpy()
            languages = decoding.detect_language(first).tolist()
        else:
            languages = [language] * len(features)
        prompts = [decoding.prompt(lang, task, timestamps) for lang in languages]
        past = None

        def step(tokens):
            nonlocal past
            logits, past = model.decode(torch.from_numpy(tokens), cross_kv=cross, past=past)
            return logits[:, -1].numpy()

        return greedy(step, prompts, WhisperRules(decoding, len(prompts[0]), timestamps), new_tokens)


def _theirs(folder, features, language, task, timestamps, new_tokens):
    model = transformers.WhisperForConditionalGeneration.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model.generate(torch.from_numpy(features), language=language, task=task,
                             return_timestamps=timestamps, max_new_tokens=new_tokens, do_sample=False)  # fmt: skip
    rows = []
    for row in out.tolist():
        if EOS in row:  # up to its end token; rows that ended early are padded after it
            row = row[: row.index(EOS) + 1]
        rows.append(row)
    return rows


@pytest.mark.parametrize("language,task,timestamps,batch", [
    ("fr", "transcribe", False, 2), ("de", "translate", True, 2), (None, "transcribe", True, 1)])  # fmt: skip
def test_tokens_equal_transformers_generate(folder, language, task, timestamps, batch):
    features = np.random.default_rng(7).standard_normal((batch, 80, 200)).astype(np.float32)
    ours = _ours(folder, features, language, task, timestamps, 40)
    theirs = _theirs(folder, features, language, task, timestamps, 40)
    width = 3 + (not timestamps)  # start, language, task (, no-timestamps): transformers hands back the rest
    begin = WhisperDecoding.from_dict(GENERATION).timestamp_begin
    if not timestamps:
        assert [o[width:] for o in ours] == theirs
    else:  # transformers hands back its whole segments: the tokens up to the last timestamp
        for o, t in zip(ours, theirs, strict=True):
            assert o[width : width + len(t)] == t and len(t) >= 4 and t[-1] >= begin
    if timestamps:  # the rules showed: the first token a timestamp, timestamps never decreasing
        for seq in ours:
            sampled = seq[width:]
            assert sampled[0] >= begin and sampled[0] <= begin + 50
            stamps = [t for t in sampled if t >= begin]
            assert stamps == sorted(stamps)
    else:
        assert all(seq[3] == NO_TIMESTAMPS and all(t < begin for t in seq[4:]) for seq in ours)
    assert not any(t in GENERATION["suppress_tokens"] for seq in ours for t in seq[width:])


def test_settings_and_refusals(folder):
    decoding = WhisperDecoding.from_folder(folder)
    assert decoding.alignment_heads == ((0, 1), (0, 3)) and decoding.timestamp_begin == NO_TIMESTAMPS + 1
    assert decoding.prompt("fr", "translate") == [SOT, 50265, 50358, NO_TIMESTAMPS]
    assert decoding.prompt("<|ja|>", timestamps=True) == [SOT, 50266, 50359]
    with pytest.raises(WhisperSettingsError, match="no language 'xx'"):
        decoding.prompt("xx")
    with pytest.raises(WhisperSettingsError, match="task is one of"):
        decoding.prompt("fr", "summarise")
    english = WhisperDecoding.from_dict({**GENERATION, "is_multilingual": False, "lang_to_id": {}})
    assert english.prompt(None) == [SOT, NO_TIMESTAMPS]
    with pytest.raises(WhisperSettingsError, match="English-only"):
        english.prompt("fr")
    with pytest.raises(WhisperSettingsError, match="decoder_start_token_id"):
        WhisperDecoding.from_dict({k: v for k, v in GENERATION.items() if k != "decoder_start_token_id"})
    assert json.loads((folder / "generation_config.json").read_text())["no_timestamps_token_id"] == NO_TIMESTAMPS
