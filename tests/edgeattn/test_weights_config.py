"""Config JSON round trips and checks; safetensors save/load with asserted keys and shapes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from edgeattn.config import PRESETS, ModelConfig, get_preset
from edgeattn.errors import CheckpointError, ConfigError
from edgeattn.model import build_model
from edgeattn.weights import load_model, load_weights, read_config, save_weights


def test_config_json_round_trip(tmp_path):
    cfg = ModelConfig(position="t5", attention_topk=0.25, norm="rmsnorm", activation="gated-gelu")
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    cfg.save(tmp_path / "c.json")
    assert ModelConfig.load(tmp_path / "c.json") == cfg
    for preset in PRESETS.values():
        assert ModelConfig.from_dict(json.loads(preset.to_json())) == preset


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"d_model": 30, "n_heads": 4}, "divisible"),
        ({"position": "rotary"}, "position"),
        ({"attention_topk": 1.5}, "attention_topk"),
        ({"architecture": "encoder-decoder", "head": "sequence"}, "head: for architecture='encoder' only"),
        ({"eos_id": 5000}, "eos_id"),
        ({"dropout": 1.0}, "dropout"),
    ],
)
def test_invalid_configs_are_refused_with_the_field_named(changes, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**changes)


def test_unknown_keys_and_presets_are_named():
    with pytest.raises(ConfigError, match="d_modle"):
        ModelConfig.from_dict({"d_modle": 4})
    with pytest.raises(ConfigError, match="known presets"):
        get_preset("nope")


@pytest.mark.quick
@pytest.mark.parametrize("arch", ["encoder-decoder", "encoder"])
def test_save_load_round_trip_gives_identical_outputs(tmp_path, tiny_config, arch):
    cfg = tiny_config if arch == "encoder-decoder" else tiny_config.replace(architecture="encoder", head="sequence")
    model = build_model(cfg, seed=5)
    path = save_weights(model, tmp_path / "m.safetensors")
    assert (tmp_path / "config.json").is_file()
    loaded = load_model(path)
    assert loaded.config == cfg
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        if arch == "encoder":
            torch.testing.assert_close(loaded(ids)[1], model(ids)[1], rtol=0, atol=0)
        else:
            tgt = torch.randint(0, 50, (2, 3))
            torch.testing.assert_close(loaded(ids, tgt), model(ids, tgt), rtol=0, atol=0)


@pytest.mark.quick
def test_tied_embedding_is_stored_once_and_stays_tied(tmp_path, tiny_config):
    model = build_model(tiny_config, seed=1)
    path = save_weights(model, tmp_path / "m.safetensors")
    assert "lm_head.weight" not in load_file(str(path))
    loaded = load_model(path)
    assert loaded.lm_head.weight.data_ptr() == loaded.embed.weight.data_ptr()


@pytest.mark.quick
def test_wrong_shape_names_the_tensor(tmp_path, tiny_config):
    model = build_model(tiny_config, seed=1)
    path = save_weights(model, tmp_path / "m.safetensors")
    tensors = load_file(str(path))
    tensors["encoder.layers.1.ff.linear1.weight"] = torch.zeros(3, 3)
    save_file(tensors, str(tmp_path / "bad.safetensors"))
    with pytest.raises(CheckpointError, match=r"encoder\.layers\.1\.ff\.linear1\.weight has shape \(3, 3\)"):
        load_weights(build_model(tiny_config), tmp_path / "bad.safetensors")


@pytest.mark.quick
def test_missing_and_unexpected_keys_are_named(tmp_path, tiny_config):
    model = build_model(tiny_config, seed=1)
    tensors = load_file(str(save_weights(model, tmp_path / "m.safetensors")))
    del tensors["decoder.layers.0.cross_attn.q_proj.bias"]
    save_file(tensors, str(tmp_path / "missing.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\): decoder\.layers\.0\.cross_attn\.q_proj\.bias"):
        load_weights(build_model(tiny_config), tmp_path / "missing.safetensors")
    tensors["decoder.layers.0.cross_attn.q_proj.bias"] = torch.zeros(32)
    tensors["extra.weight"] = torch.zeros(1)
    save_file(tensors, str(tmp_path / "extra.safetensors"))
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\): extra\.weight"):
        load_weights(build_model(tiny_config), tmp_path / "extra.safetensors")


def test_unreadable_checkpoint_is_refused_without_pickle(tmp_path):
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x80\x04this is a pickle, not safetensors")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        read_config(bad)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_config(tmp_path / "absent.safetensors")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"d_model": 10**9, "n_heads": 1}, r"about 2\.40e\+19 parameters \(9\.6e\+10 GB of float32 weights"),
        ({"n_encoder_layers": 10**6}, r"about 4\.92e\+10 parameters"),
        ({"vocab_size": 10**10}, r"parameters .* edgeattn takes models up to 8e\+09 parameters \(32 GB\)"),
        ({"max_len": 10**9}, "over edgeattn's limit of 1048576 positions"),
    ],
)
def test_absurd_sizes_are_refused_with_the_estimate_before_anything_is_allocated(tmp_path, changes, message):
    import time
    import tracemalloc

    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**changes)
    assert time.perf_counter() - start < 0.1 and tracemalloc.get_traced_memory()[1] < 1 << 20
    tracemalloc.stop()
    path = tmp_path / "huge.json"
    path.write_text(json.dumps({**ModelConfig().to_dict(), **changes}))
    result = subprocess.run([sys.executable, "-m", "edgeattn.cli", "export", "--config", str(path), "-o",
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "out").exists()


def test_parameter_count_matches_the_built_model():
    for name in ("tiny", "demo", "reference"):
        config = get_preset(name)
        built = sum(p.numel() for p in build_model(config).parameters())
        assert 0.9 * built <= config.parameter_count() <= built, name  # biases and norms left out


@pytest.mark.quick
def test_a_familys_section_and_fields_are_its_records_say():
    """The config asks the family records: which architectures there are, which section a family
    keeps (written under its name, read back from it), and which fields only its models set."""
    from edgeattn.families.causal.config import CausalLMConfig
    from edgeattn.families.speech.config import SpeechConfig
    from edgeattn.runtime.families import FAMILIES

    with pytest.raises(ConfigError, match="architecture='retina' is not one of encoder, encoder-decoder, decoder-only"):
        ModelConfig(architecture="retina")
    with pytest.raises(ConfigError, match="needs its vision section"):
        ModelConfig(architecture="vision")
    lm = CausalLMConfig(max_len=64, n_kv_heads=2).model_config(pad_id=0, bos_id=1, eos_id=2)
    assert lm.family is FAMILIES["causal"] and isinstance(lm.section, CausalLMConfig)
    data = lm.to_dict()
    assert data["causal"]["n_kv_heads"] == 2 and "section" not in data
    assert ModelConfig.from_dict(json.loads(json.dumps(data))) == lm
    assert ModelConfig.from_dict({**data, "speech": None}) == lm  # an older edgeattn wrote both keys
    with pytest.raises(ConfigError, match="one family's section, not causal, speech"):
        ModelConfig.from_dict({**data, "speech": SpeechConfig().to_dict()})
    with pytest.raises(ConfigError, match="disagree with its causal section: d_model=8"):
        lm.replace(d_model=8)
    with pytest.raises(ConfigError, match="needs its speech section"):
        get_preset("tiny").replace(architecture="speech-to-text")
    with pytest.raises(ConfigError, match="has no section of its own"):
        get_preset("tiny").replace(section=SpeechConfig())
    with pytest.raises(ConfigError, match=r"token_types, pooler: for architecture='encoder' only"):
        get_preset("tiny").replace(token_types=2, pooler="tanh")
    with pytest.raises(ConfigError, match="scale_decoder_output: for architecture='encoder-decoder' only"):
        get_preset("bert-base").replace(scale_decoder_output=True)
    with pytest.raises(ConfigError, match="alignment head \\(3, 0\\) is outside the decoder's 2 layers"):
        get_preset("tiny").replace(architecture="speech-to-text", section=SpeechConfig(alignment_heads=((3, 0),)))


def test_mapped_safetensors_read_as_the_library_does_and_hostile_files_are_refused(tmp_path):
    """A folder's weights are mapped, not read: each tensor equals safetensors' own reading in its
    own dtype (bfloat16 kept), a copy-on-write view, and a broken file is one CheckpointError."""
    from safetensors.torch import load_file

    from edgeattn.hf import read_tensors
    from edgeattn.weights import map_safetensors

    folder = tmp_path / "folder"
    folder.mkdir()
    tensors = {"a.weight": torch.randn(5, 3).to(torch.bfloat16), "b.bias": torch.randn(7),
               "c.index": torch.arange(4), "d.half": torch.randn(2, 2).half(), "e.empty": torch.zeros(0, 3),
               "f.flag": torch.tensor([True, False])}  # fmt: skip
    save_file(tensors, str(folder / "model.safetensors"))
    mapped, want = map_safetensors(folder / "model.safetensors"), load_file(str(folder / "model.safetensors"))
    assert set(mapped) == set(want)
    for name, tensor in want.items():
        assert mapped[name].dtype == tensor.dtype and torch.equal(mapped[name], tensor), name
    mapped["b.bias"].add_(1.0)  # copy-on-write: the file is untouched
    assert torch.equal(load_file(str(folder / "model.safetensors"))["b.bias"], want["b.bias"])
    assert set(read_tensors(folder)) == set(want)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) - 7])  # truncated
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        read_tensors(folder)


def _mapped_from(tensor: torch.Tensor, path) -> bool:
    """Whether ``tensor``'s memory lies in a mapping of the file ``path`` (/proc/self/maps)."""
    address = tensor.data_ptr()
    for line in open("/proc/self/maps"):
        span, *_, name = line.split(maxsplit=5) if len(line.split()) >= 6 else (line.split()[0], "")
        low, high = (int(x, 16) for x in span.split("-"))
        if low <= address < high:
            return name.strip() == str(path)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_model_mapped_onto_its_saved_weights_answers_the_same_from_the_file(tmp_path, tiny_config):
    """After ``map_onto`` every weight is a view of the file just written (tied ones stay tied), the
    outputs are unchanged, and writing into a weight changes the model, never the file."""
    from edgeattn.weights import map_onto

    torch.manual_seed(0)
    model = build_model(tiny_config).eval()
    ids, tgt = torch.randint(0, 50, (2, 7)), torch.randint(0, 50, (2, 3))
    with torch.no_grad():
        before = model(ids, tgt)
    path = save_weights(model, tmp_path / "w.safetensors")
    saved = load_file(str(path))
    rebound = map_onto(model, path)
    assert rebound == len(saved)
    assert all(_mapped_from(p, path) for p in model.parameters())
    assert model.lm_head.weight.data_ptr() == model.embed.weight.data_ptr()
    with torch.no_grad():
        after = model(ids, tgt)
        next(model.parameters()).add_(1.0)
    assert torch.equal(before, after)
    assert all(torch.equal(t, load_file(str(path))[k]) for k, t in saved.items())
