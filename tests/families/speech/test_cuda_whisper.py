"""A speech model (Whisper) on the CUDA provider: its decoder caches bound on the device and written
in place, the same transcripts as on the CPU (greedy and beams, one window and long-form), fp16
made and gated on the CPU following float32 on the GPU. Skipped without CUDA."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.speech_folders import audio, speech_folder

pytest.importorskip("transformers")
from click.testing import CliRunner  # noqa: E402

from edgeattn.cli import cli  # noqa: E402
from edgeattn.runtime import load  # noqa: E402

pytestmark = pytest.mark.cuda
CUDA = "CUDAExecutionProvider"


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """A random Whisper exported at fp32, fp32-opt and fp16 (fp16 made and gated on the CPU)."""
    root = tmp_path_factory.mktemp("cuda-whisper")
    folder = speech_folder(root / "folder")
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(root / "out"),
                                      "--precision", "fp32-opt,fp16"])  # fmt: skip
    assert result.exit_code == 0, result.output
    return root / "out"


@pytest.mark.parametrize("precision", ["fp32", "fp32-opt"])
def test_float32_on_cuda_hears_as_on_the_cpu(export, precision):
    cpu = load(export, precision=precision, providers=["CPUExecutionProvider"])
    gpu = load(export, precision=precision, providers=[CUDA])
    assert gpu.device == "cuda" and gpu.io_binding
    for seconds, options in ((1.5, {"language": "fr", "timestamps": True}), (5.3, {"language": "de", "num_beams": 3}),
                             (5.3, {"word_timestamps": True})):  # fmt: skip
        samples = audio(seconds, seed=int(seconds * 10))
        want = cpu.transcribe(samples, max_new_tokens=20, **options)
        got = gpu.transcribe(samples, max_new_tokens=20, **options)
        assert [s.tokens for s in got.segments] == [s.tokens for s in want.segments], options
        assert got.language == want.language


def test_the_decoder_cache_stays_on_the_device_and_is_written_in_place(export):
    gpu = load(export, precision="fp32", providers=[CUDA])
    features = np.stack([gpu.log_mel(audio(1.2, seed=s), pad_to_window=True) for s in (1, 2)])
    state = gpu.stepper(features, capacity=8)
    assert state.host == {}
    before = {name: value.data_ptr() for name, value in state.cache.values.items()}
    prompt = np.array([gpu.decoding.prompt("fr", "transcribe")] * 2)
    state.step(prompt)
    state.reorder(np.array([1, 0]))
    state.step(np.full((2, 1), 7))
    for name, value in state.cache.values.items():
        assert value.device_name().lower() == "cuda" and value.data_ptr() == before[name]
        written = value.numpy()
        assert np.abs(written[:, :, : prompt.shape[1] + 1]).sum() > 0 and not written[:, :, prompt.shape[1] + 1 :].any()


def test_fp16_on_cuda_follows_float32(export):
    cpu = load(export, precision="fp32", providers=["CPUExecutionProvider"])
    half = load(export, precision="fp16", providers=[CUDA])
    features = np.stack([cpu.log_mel(audio(seconds, seed=9), pad_to_window=True) for seconds in (0.8, 1.6, 2.0)])
    prompt = np.array([cpu.decoding.prompt("de", "transcribe", timestamps=True)] * 3)
    want, got = cpu.stepper(features, capacity=24), half.stepper(features, capacity=24)
    tokens, same = prompt, []
    for _ in range(16):  # teacher-forced on float32's greedy tokens
        a, b = want.step(tokens), got.step(tokens)
        cosine = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
        assert np.isfinite(b).all() and cosine.min() > 0.999
        same.append(a.argmax(-1) == b.argmax(-1))
        tokens = a.argmax(-1)[:, None]
    assert np.mean(same) >= 0.95
    heard = half.transcribe(audio(5.3, seed=53), language="de", max_new_tokens=20)
    assert heard.segments and all(np.isfinite(s.avg_logprob) for s in heard.segments)
