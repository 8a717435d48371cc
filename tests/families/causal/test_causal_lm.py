"""Decoder-only language models from Hugging Face folders: every architecture's logits equal
transformers' eager ones, on batches padded left and right, and a row's logits equal its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeattn.errors import CheckpointError, ConfigError
from edgeattn.families.causal.hf import import_causal_folder
from edgeattn.families.causal.model import CausalLMConfig, rotate
from tests.helpers import causal_folders

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.quick

MODELS = causal_folders.MODELS


@pytest.fixture(scope="module", params=MODELS)
def folder(request, tmp_path_factory):
    return causal_folders.save_folder(request.param, tmp_path_factory.mktemp("causal") / request.param)


def _batch(side: str) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(1)
    lengths = [11, 6, 1]
    ids = np.zeros((3, 11), np.int64)
    mask = np.zeros((3, 11), np.int64)
    for i, n in enumerate(lengths):
        cols = slice(11 - n, 11) if side == "left" else slice(0, n)
        ids[i, cols] = rng.integers(3, 97, n)
        mask[i, cols] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


@pytest.mark.parametrize("side", ["left", "right"])
def test_logits_equal_transformers_on_padded_batches(folder, side):
    path, reference = folder
    ours = import_causal_folder(path)
    ids, mask = _batch(side)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = reference(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        got = ours(ids, mask)
        real = mask.bool()
        assert (got[real] - want[real]).abs().max().item() <= 1e-4
        for row in range(3):  # a row's logits alone equal its logits in the batch
            alone = ours(ids[row : row + 1, real[row]], mask[row : row + 1, real[row]])
            assert (alone[0] - got[row, real[row]]).abs().max().item() <= 1e-4


def test_interleaved_rotation_is_rotate_half_on_interleaved_dimensions():
    x = torch.randn(2, 3, 5, 8)
    angles = torch.randn(2, 1, 5, 4)
    cos, sin = angles.cos(), angles.sin()
    order = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])  # rotate-half pairs (i, i + 4) side by side
    want = rotate(x, cos, sin, "rotate-half")[..., order]
    torch.testing.assert_close(rotate(x[..., order], cos, sin, "interleaved"), want)


def test_bad_folders_and_configs_are_one_error(tmp_path, folder):
    import json
    import shutil

    path, _ = folder
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    config = json.loads((bad / "config.json").read_text())
    config["architectures"] = ["MambaForCausalLM"]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="is not one edgeattn imports: .*GPT2LMHeadModel, LlamaForCausalLM"):
        import_causal_folder(bad)
    with pytest.raises(ConfigError, match="not a multiple of n_kv_heads"):
        CausalLMConfig(n_heads=4, n_kv_heads=3)
    from safetensors.torch import load_file, save_file

    shutil.rmtree(bad)
    shutil.copytree(path, bad)
    tensors = load_file(bad / "model.safetensors")
    name = next(k for k in tensors if k.endswith("weight") and tensors[k].dim() == 2 and "emb" not in k
                and "wte" not in k and "wpe" not in k)  # fmt: skip
    tensors[name] = tensors[name][:-1].contiguous()
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="has shape"):
        import_causal_folder(bad)


@pytest.mark.parametrize("side", ["left", "right"])
def test_greedy_over_the_slot_cache_equals_transformers_generate(folder, side):
    """32 new tokens for prompts of different lengths, one cache of prompt + 32 slots written in place."""
    path, reference = folder
    ours = import_causal_folder(path)
    ids, mask = _batch(side)
    got = ours.greedy(ids, mask, 32, stop_at_eos=False)
    for row in range(3):  # transformers on each prompt alone (its own padding rules aside)
        real = mask[row].bool()
        prompt = ids[row : row + 1, real]
        reference.generation_config.eos_token_id = None  # all 32 tokens, none suppressed (min_new_tokens would)
        want = reference.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, do_sample=False,
                                  pad_token_id=0)[0, prompt.shape[1] :]  # fmt: skip
        assert got[row].tolist() == want.tolist(), (row, side)


def test_a_mixture_of_experts_config_names_its_dense_layers_and_refuses_what_it_lacks(tmp_path):
    """transformers builds a layer dense where mlp_only_layers lists it or decoder_sparse_step skips
    it; either major's expert count is read; a config without the expert sizes is refused by name."""
    from edgeattn.families.causal.moe import config_fields

    path = tmp_path / "config.json"
    fields = config_fields({"num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                            "decoder_sparse_step": 2, "mlp_only_layers": [3]}, path, 6)  # fmt: skip
    assert fields == {"n_experts": 8, "experts_per_token": 2, "expert_d_ff": 16, "norm_topk": False,
                      "dense_layers": (0, 2, 3, 4)}  # fmt: skip
    with pytest.raises(ConfigError, match="moe_intermediate_size"):
        config_fields({"num_experts": 8, "num_experts_per_tok": 2}, path, 2)
    with pytest.raises(ConfigError, match="experts_per_token between 1 and 4"):
        CausalLMConfig(n_experts=4, experts_per_token=5, expert_d_ff=8)
