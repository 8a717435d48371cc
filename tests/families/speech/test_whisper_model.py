"""Whisper folders import into edgeattn's PyTorch Whisper, which answers as transformers' does:
encoder states, teacher-forced logits and cached decoding, at batch 1 and 2, for 80 and 128 mel
bins and asymmetric depths (turbo: a deep encoder, a shallow decoder)."""

from __future__ import annotations

import json

import pytest
import torch

from edgeattn.errors import CheckpointError, ConfigError
from edgeattn.families.speech.hf import import_whisper, map_config
from tests.helpers.speech_folders import whisper_folder

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.quick


@pytest.mark.parametrize("n_mels,encoder_layers,decoder_layers", [(80, 3, 1), (128, 1, 2)])
def test_whisper_answers_as_transformers(tmp_path, n_mels, encoder_layers, decoder_layers):
    reference = whisper_folder(tmp_path, n_mels, encoder_layers, decoder_layers)
    ours = import_whisper(tmp_path)
    assert (ours.config.n_encoder_layers, ours.config.n_decoder_layers, ours.config.section.n_mels) == (
        encoder_layers, decoder_layers, n_mels)
    features = torch.randn(2, n_mels, 200)
    ids = torch.randint(0, 116, (2, 9))
    ids[:, 0] = 116
    with torch.no_grad():
        memory = ours.encode(features)
        want = reference.model.encoder(features).last_hidden_state
        assert memory.shape == (2, 100, 64) and (memory - want).abs().max() < 1e-4
        logits = ours(features, ids)
        theirs = reference(input_features=features, decoder_input_ids=ids).logits
        assert (logits - theirs).abs().max() < 1e-4
        single = ours(features[1:], ids[1:])  # a row alone equals its row in the batch
        assert (single - logits[1:]).abs().max() < 1e-4
        cross, past, steps = ours.cross_kv(memory), None, []
        for t in range(ids.shape[1]):  # one token at a time through the cache: the teacher-forced logits
            step, past = ours.decode(ids[:, t : t + 1], cross_kv=cross, past=past)
            steps.append(step)
        assert (torch.cat(steps, dim=1) - logits).abs().max() < 1e-4


def test_config_layouts_and_refusals(tmp_path):
    whisper_folder(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    config = map_config(hf, "config.json")
    assert (config.bos_id, config.eos_id, config.max_len, config.section.audio_positions) == (116, 118, 40, 100)
    assert config.from_dict(config.to_dict()) == config
    newer = {**hf, "dtype": "float32"}  # transformers 5 writes dtype, not torch_dtype
    newer.pop("torch_dtype", None)
    assert map_config(newer, "config.json") == config
    with pytest.raises(ConfigError, match="decoder_attention_heads"):
        map_config({**hf, "decoder_attention_heads": 8}, "config.json")
    with pytest.raises(ConfigError, match="activation_function"):
        map_config({**hf, "activation_function": "relu"}, "config.json")
    with pytest.raises(ConfigError, match="lacks 'd_model'"):
        map_config({k: v for k, v in hf.items() if k != "d_model"}, "config.json")
    (tmp_path / "config.json").write_text(json.dumps({**hf, "architectures": ["BertModel"]}))
    with pytest.raises(ConfigError, match="not WhisperForConditionalGeneration"):
        import_whisper(tmp_path)


def test_a_tensor_with_no_place_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    whisper_folder(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["model.encoder.extra.weight"] = torch.zeros(2)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="model.encoder.extra.weight"):
        import_whisper(tmp_path)


@pytest.mark.slow  # a transformers 5 environment's process: out of the quick tier
def test_a_folder_saved_by_transformers_5_answers_as_transformers_5_did(tmp_path):
    """The folder and its reference outputs made in the transformers 5 environment (CI makes it)."""
    import subprocess
    from pathlib import Path

    import numpy as np

    from tests.helpers.transformers5 import transformers5_python

    script = Path(__file__).parents[2] / "helpers" / "whisper_folder5.py"
    subprocess.run([str(transformers5_python()), str(script), str(tmp_path)], check=True, capture_output=True,
                   timeout=300)  # fmt: skip
    assert "dtype" in json.loads((tmp_path / "config.json").read_text())
    ours = import_whisper(tmp_path)
    reference = np.load(tmp_path / "reference.npz")
    with torch.no_grad():
        features, ids = torch.from_numpy(reference["features"]), torch.from_numpy(reference["ids"])
        assert np.abs(ours.encode(features).numpy() - reference["states"]).max() < 1e-4
        assert np.abs(ours(features, ids).numpy() - reference["logits"]).max() < 1e-4
