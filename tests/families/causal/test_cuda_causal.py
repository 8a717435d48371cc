"""A language model on the CUDA provider: its cache bound on the device and written in place, the
same answers as on the CPU, fp16 through the gate. Skipped without CUDA."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import causal_folders

pytest.importorskip("transformers")
from edgeattn.runtime import load  # noqa: E402

pytestmark = pytest.mark.cuda
CUDA = "CUDAExecutionProvider"


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """A trained Llama exported at fp32, fp32-opt and fp16 (fp16 made and gated on the CPU)."""
    return causal_folders.export_trained(tmp_path_factory.mktemp("cuda-lm"), "fp32-opt,fp16")


def _prompts():
    """Three left-padded prompts of the corpus's tokens."""
    rng = np.random.default_rng(0)
    ids = np.zeros((3, 11), np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate((11, 6, 1)):
        ids[row, 11 - n :] = rng.integers(5, 90, n)
        mask[row, 11 - n :] = 1
    return ids, mask


@pytest.mark.parametrize("precision", ["fp32", "fp32-opt"])
def test_float32_on_cuda_answers_as_on_the_cpu(export, precision):
    cpu = load(export, precision=precision, providers=["CPUExecutionProvider"])
    gpu = load(export, precision=precision, providers=[CUDA])
    assert gpu.device == "cuda" and gpu.io_binding
    ids, mask = _prompts()
    want, got = cpu.state(ids, mask, capacity=40), gpu.state(ids, mask, capacity=40)
    tokens = np.zeros(3, np.int64)
    for _ in range(12):  # the prompt's logits, then steps over the growing cache
        a, b = want.step(tokens), got.step(tokens)
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=1e-4)
        tokens = a.argmax(-1)
    np.testing.assert_array_equal(gpu.generate(ids, mask, 24).tokens, cpu.generate(ids, mask, 24).tokens)


def test_cache_stays_on_the_device_and_is_written_in_place(export):
    gpu = load(export, precision="fp32", providers=[CUDA])
    ids, mask = _prompts()
    state = gpu.state(ids, mask, capacity=16)
    assert not state.on_host and state.host == {}
    value = next(iter(state.cache.values.values()))
    assert value.device_name().lower() == "cuda"
    before = value.numpy()[:, :, ids.shape[1]].copy()  # the slot the first step writes
    state.step(np.zeros(3, np.int64))  # the prompt's logits
    state.step(np.full(3, 7, np.int64))  # one token fed, into the slot after the prompt
    after = next(iter(state.cache.values.values())).numpy()
    assert not np.array_equal(after[:, :, ids.shape[1]], before)  # written into the bound buffer
    filled = state.position
    state.reserve(32)  # grows: the filled slots copied on the device
    assert state.capacity >= filled + 32
    np.testing.assert_array_equal(next(iter(state.cache.values.values())).numpy()[:, :, :filled], after[:, :, :filled])


def test_fp16_on_cuda_follows_float32(export):
    cpu = load(export, precision="fp32", providers=["CPUExecutionProvider"])
    half = load(export, precision="fp16", providers=[CUDA])
    ids, mask = _prompts()
    want, got = cpu.state(ids, mask, capacity=40), half.state(ids, mask, capacity=40)
    tokens, same = np.zeros(3, np.int64), []
    for _ in range(16):  # teacher-forced on float32's greedy tokens
        a, b = want.step(tokens), got.step(tokens)
        cosine = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
        assert np.isfinite(b).all() and cosine.min() > 0.999
        same.append(a.argmax(-1) == b.argmax(-1))
        tokens = a.argmax(-1)
    assert np.mean(same) >= 0.95
