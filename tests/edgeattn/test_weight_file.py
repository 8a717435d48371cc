"""Weights held in a file: parameters built on ``meta``, given storage in a mapped temporary file,
and safetensors written a tensor at a time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from edgeattn.config import PRESETS
from edgeattn.model import TransformerModel, build_model
from edgeattn.weight_file import (
    checkpoint_file,
    file_backed,
    has_meta_parameters,
    parameters_on_meta,
    write_safetensors,
)
from edgeattn.weights import checkpoint_tensors, load_state, read_config, save_weights

pytestmark = pytest.mark.quick


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.norm = nn.LayerNorm(4)
        self.register_buffer("steps", torch.arange(3.0), persistent=False)


def test_parameters_are_made_on_meta_and_buffers_as_usual() -> None:
    with parameters_on_meta():
        model = _Tied()
    assert has_meta_parameters(model)
    assert all(p.is_meta for p in model.parameters())
    assert model.head.weight is model.embed.weight
    assert torch.equal(model.steps, torch.arange(3.0))
    assert not has_meta_parameters(nn.Linear(2, 2))  # outside the block, as usual


def test_file_backed_parameters_keep_their_ties_and_take_the_loaded_values() -> None:
    with parameters_on_meta():
        model = _Tied()
    source = _Tied()
    state = {k: v.to(torch.bfloat16).clone() for k, v in source.state_dict().items() if k != "head.weight"}
    load_state(model, dict(state), "test", {"head.weight": "embed.weight"})
    assert not has_meta_parameters(model)
    assert model.head.weight is model.embed.weight
    for name, value in state.items():
        assert model.get_parameter(name).dtype == torch.float32
        assert torch.equal(model.get_parameter(name), value.float())
    x = torch.tensor([[1, 2, 3]])
    assert model.head(model.norm(model.embed(x))).shape == (1, 3, 10)


def test_file_backed_storage_starts_as_zeros_and_counts_each_tied_tensor_once() -> None:
    with parameters_on_meta():
        model = _Tied()
    size = file_backed(model)
    assert size >= (10 * 4 + 4 + 4) * 4
    assert all(not p.is_meta and not p.any() for p in model.parameters())
    assert file_backed(model) == 0  # nothing left on meta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool])
def test_safetensors_written_a_tensor_at_a_time_read_as_safetensors_writes_them(tmp_path, dtype) -> None:
    tensors = {
        "b.matrix": (torch.randn(5, 7) * 10).to(dtype),
        "a.scalar": torch.tensor(3).to(dtype),
        "c.empty": torch.zeros(0, 4).to(dtype),
        "d.strided": (torch.randn(6, 4) * 10).to(dtype).t(),
    }
    ours = write_safetensors(tensors, tmp_path / "ours.safetensors", {"k": "v"})
    theirs = tmp_path / "theirs.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(theirs), metadata={"k": "v"})
    got, want = load_file(str(ours)), load_file(str(theirs))
    assert list(got) == list(want) or set(got) == set(want)
    for name in tensors:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name])
    with safe_open(str(ours), framework="pt") as f:
        assert f.metadata() == {"k": "v"}


def test_an_import_of_a_bfloat16_file_costs_no_float32_copy_of_its_own(tmp_path) -> None:
    """A model of 4 x 64 MiB float32 weights loaded from a bfloat16 file: the process's anonymous
    memory grows by far less than one of them (a model built the usual way grows by all four)."""
    folder = tmp_path / "w.safetensors"
    save_file({f"{i}.weight": torch.randn(4096, 4096, dtype=torch.bfloat16) for i in range(4)}, str(folder))
    script = textwrap.dedent(f"""
        import torch
        from torch import nn
        from edgeattn.weight_file import parameters_on_meta
        from edgeattn.weights import load_state, map_safetensors
        from pathlib import Path

        def anon():
            for line in open("/proc/self/status"):
                if line.startswith("RssAnon"):
                    return int(line.split()[1]) * 1024

        def build():
            return nn.Sequential(*[nn.Linear(4096, 4096, bias=False) for _ in range(4)])

        before = anon()
        with parameters_on_meta():
            model = build()
        load_state(model, map_safetensors(Path({str(folder)!r})), "test")
        mapped = anon() - before
        total = sum(float(p.double().sum()) for p in model.parameters())
        usual = build()
        load_state(usual, map_safetensors(Path({str(folder)!r})), "test")
        assert total == sum(float(p.double().sum()) for p in usual.parameters())
        print(mapped, anon() - before)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    mapped, usual = (int(v) for v in out.split())
    assert mapped < 32 << 20, f"the file-backed import grew anonymous memory by {mapped / 2**20:.0f} MiB"
    assert usual > 200 << 20  # the usual build holds its float32 copy: the measure sees memory


def _imported(preset: str = "tiny") -> tuple[TransformerModel, dict[str, torch.Tensor]]:
    """A model imported as a folder is: built on ``meta``, loaded from bfloat16 tensors."""
    config = PRESETS[preset]
    state = {k: v.to(torch.bfloat16) for k, v in checkpoint_tensors(build_model(config)).items()}
    with parameters_on_meta():
        model = build_model(config)
    load_state(model, dict(state), "test", model.tied_aliases())
    return model, state


def test_an_imported_model_is_saved_by_naming_its_file_not_writing_it_again(tmp_path) -> None:
    model, state = _imported()
    held = checkpoint_file(model)
    assert held is not None
    inode = os.fstat(held._fd).st_ino
    first = save_weights(model, tmp_path / "a" / "weights.safetensors")
    assert os.stat(first).st_ino == inode  # the import's own file, now with a name
    written = tmp_path / "written"
    written.write_bytes(b"")
    assert os.stat(first).st_mode & 0o777 == os.stat(written).st_mode & 0o777  # not left private
    assert checkpoint_file(model) is None
    got = load_file(str(first))
    assert list(got) == list(checkpoint_tensors(model))
    for name, value in state.items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], value.float()), name
    assert read_config(first) == model.config
    with torch.no_grad():  # the model's writes after saving stay its own
        next(model.parameters()).add_(1.0)
    assert torch.equal(load_file(str(first))[next(iter(state))], got[next(iter(state))])
    second = save_weights(model, tmp_path / "b" / "weights.safetensors")  # saved again: written
    assert os.stat(second).st_ino != inode
    assert torch.equal(load_file(str(second))[next(iter(state))], got[next(iter(state))] + 1.0)


def test_a_checkpoint_file_writes_what_changed_and_refuses_what_it_was_not_laid_out_for(tmp_path) -> None:
    model, state = _imported()
    held = checkpoint_file(model)
    tensors = checkpoint_tensors(model)
    assert not held.save_as(tensors, {"k": "v" * 10_000}, tmp_path / "grown.safetensors")  # past the room
    assert not held.save_as(dict(list(tensors.items())[1:]), None, tmp_path / "fewer.safetensors")
    assert not (tmp_path / "grown.safetensors").exists() and not (tmp_path / "fewer.safetensors").exists()
    name = next(iter(tensors))
    tensors[name] = torch.full_like(tensors[name], 3.0)  # not in its region: copied there
    assert held.save_as(tensors, {"k": "v"}, tmp_path / "w.safetensors")
    got = load_file(str(tmp_path / "w.safetensors"))
    assert torch.equal(got[name], tensors[name])
    assert all(torch.equal(got[n], state[n].float()) for n in list(state)[1:])
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        assert f.metadata() == {"k": "v"}
    assert not held.save_as(tensors, {"k": "v"}, tmp_path / "again.safetensors")  # named once only
