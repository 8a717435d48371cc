"""The torch-free runtime against eager PyTorch: generation, batching, threads, checks, loading."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
import torch

from edgeattn.config import ModelConfig
from edgeattn.exporters.export import export_model
from edgeattn.exporters.reference import eager_generate
from edgeattn.model import build_model
from edgeattn.runtime import InputError, ManifestError, load

pytestmark = pytest.mark.quick

CFG = ModelConfig(
    vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, max_len=48,
    dropout=0.0, position="t5",
)  # fmt: skip


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("runtime") / "out"
    model = build_model(CFG, seed=11)
    export_model(model, out, verify=False)
    return out, model


def sources(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = [9, 4, 1]
    ids = np.zeros((3, 9), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(3, CFG.vocab_size, size=n)
        mask[i, :n] = 1
    return ids, mask


@pytest.mark.parametrize(
    "options",
    [{"strategy": "greedy"}, {"strategy": "beam", "num_beams": 3, "length_penalty": 0.8},
     {"strategy": "sample", "seed": 3, "top_k": 5, "top_p": 0.9, "temperature": 0.7}],
    ids=["greedy", "beam", "sample"],
)  # fmt: skip
def test_generation_matches_eager_pytorch(exported, options):
    out, model = exported
    rt = load(out, providers=["CPUExecutionProvider"])
    ids, mask = sources()
    got = rt.generate(ids, mask, max_new_tokens=20, **options)
    want = eager_generate(model, ids, mask, max_new_tokens=20, **options)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.scores, want.scores, atol=1e-4, rtol=0)


def test_greedy_matches_the_models_own_loop(exported):
    out, model = exported
    ids, mask = sources(1)
    want = model.greedy(torch.from_numpy(ids), torch.from_numpy(mask), 25).numpy()
    np.testing.assert_array_equal(load(out).generate(ids, mask, 25).tokens, want)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_batched_generation_equals_one_by_one(exported, strategy):
    out, _ = exported
    rt = load(out)
    ids, mask = sources(2)
    batched = rt.generate(ids, mask, 16, strategy=strategy)
    for i in range(3):
        n = int(mask[i].sum())
        alone = rt.generate(ids[i : i + 1, :n], None, 16, strategy=strategy)
        width = alone.tokens.shape[1]
        np.testing.assert_array_equal(batched.tokens[i, :width], alone.tokens[0])
        assert (batched.tokens[i, width:] == CFG.pad_id).all()
        assert batched.scores[i] == pytest.approx(alone.scores[0], abs=1e-4)


def test_stream_yields_what_generate_returns(exported):
    out, _ = exported
    rt = load(out)
    ids, mask = sources(3)
    steps = list(rt.stream(ids, mask, 12))
    np.testing.assert_array_equal(np.stack(steps, axis=1), rt.generate(ids, mask, 12).tokens)


def test_io_binding_path_equals_plain_path(exported):
    out, _ = exported
    ids, mask = sources(4)
    plain = load(out, io_binding=False).generate(ids, mask, 15, strategy="beam", num_beams=2)
    bound = load(out, io_binding=True).generate(ids, mask, 15, strategy="beam", num_beams=2)
    np.testing.assert_array_equal(plain.tokens, bound.tokens)
    np.testing.assert_allclose(plain.scores, bound.scores, atol=1e-6)


def test_sampling_with_a_seed_is_reproducible(exported):
    out, _ = exported
    rt = load(out)
    ids, mask = sources(5)
    a = rt.generate(ids, mask, 15, strategy="sample", seed=42).tokens
    np.testing.assert_array_equal(a, rt.generate(ids, mask, 15, strategy="sample", seed=42).tokens)


def test_concurrent_encode_from_8_threads_equals_serial(exported):
    out, _ = exported
    rt = load(out, threads=1)
    inputs = [sources(s) for s in range(16)]
    serial = [rt.encode(i, m) for i, m in inputs]
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for j in range(k, 16, 8):
                results[j] = rt.encode(*inputs[j])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for j in range(16):
        np.testing.assert_array_equal(results[j], serial[j])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda rt: rt.encode(np.ones((2, 3), dtype=np.float32)), "input_ids must hold integers"),
        (lambda rt: rt.encode(np.ones(3, dtype=np.int64)), r"input_ids must have shape \(batch, src_len\), got \(3,\)"),
        (lambda rt: rt.encode(np.ones((2, 3, 1), dtype=np.int64)), "must have shape"),
        (lambda rt: rt.encode(np.ones((2, 3), dtype=np.int64), np.ones((2, 4), dtype=np.int64)),
         r"attention_mask has shape \(2, 4\) but input_ids has \(2, 3\)"),
        (lambda rt: rt.encode(np.array([[1, 2, 40]])),
         r"holds 40, outside the vocabulary \(0..39\) at position \(0, 2\)"),
        (lambda rt: rt.encode(np.array([[1, -1]])), "outside the vocabulary"),
        (lambda rt: rt.encode(np.ones((1, 49), dtype=np.int64)), "at most 48"),
        (lambda rt: rt.encode(np.ones((1, 3), dtype=np.int64), np.array([[1, 2, 0]])), "only 0"),
        (lambda rt: rt.encode(np.ones((2, 3), dtype=np.int64), np.array([[1, 1, 0], [0, 0, 0]])),
         r"rows \[1\] have no token"),
        (lambda rt: rt.encode(np.zeros((0, 3), dtype=np.int64)), "at least one row"),
        (lambda rt: rt.generate(np.ones((1, 3), dtype=np.int64), max_new_tokens=49), "exceeds the model's max_len"),
        (lambda rt: rt.generate(np.ones((1, 3), dtype=np.int64), strategy="beam", num_beams=0), "num_beams"),
        (lambda rt: rt.classify(np.ones((1, 3), dtype=np.int64)), r"classify\(\) is for encoder exports"),
    ],
)  # fmt: skip
def test_bad_inputs_are_refused_before_any_session_runs(exported, call, message):
    out, _ = exported
    with pytest.raises((InputError, Exception), match=message):
        call(load(out))


def test_tampered_file_is_refused_naming_it(exported, tmp_path):
    out, _ = exported
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in out.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    data = bytearray((copy / "encoder.onnx").read_bytes())
    data[100] ^= 0x01
    (copy / "encoder.onnx").write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"encoder\.onnx does not match its manifest sha256"):
        load(copy)


def test_providers_fallback_and_precision_selection(exported, caplog):
    out, _ = exported
    with caplog.at_level(logging.WARNING):
        rt = load(out, providers=["CUDAExecutionProvider"])
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert rt.providers == ["CPUExecutionProvider"]
        assert "CUDAExecutionProvider is not available" in caplog.text
    with pytest.raises(ManifestError, match="not exported at precision 'int8'"):
        load(out, precision="int8")


def test_optimized_model_cache_is_written_then_used(exported, tmp_path):
    out, _ = exported
    cache = tmp_path / "cache"
    ids, mask = sources(6)
    first = load(out, optimized_cache=cache).generate(ids, mask, 10).tokens
    files = sorted(p.name for p in cache.iterdir() if p.suffix == ".onnx")
    assert len(files) == 3 and all(f.endswith(".opt.onnx") for f in files)  # generation's graphs, built on use
    assert {p.name for p in cache.iterdir()} == {*files, *(f + ".data" for f in files)}  # weights beside: standalone
    np.testing.assert_array_equal(load(out, optimized_cache=cache).generate(ids, mask, 10).tokens, first)


def test_encoder_heads(tmp_path):
    for head, shape in (("sequence", (2, 3)), ("token", (2, 6, 3))):
        cfg = CFG.replace(architecture="encoder", head=head, num_labels=3)
        model = build_model(cfg, seed=0)
        export_model(model, tmp_path / head, verify=False)
        rt = load(tmp_path / head)
        ids = np.array([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]])
        mask = (ids != 0).astype(np.int64)
        logits = rt.classify(ids, mask) if head == "sequence" else rt.tag(ids, mask)
        assert logits.shape == shape
        with torch.no_grad():
            ref = model(torch.from_numpy(ids), torch.from_numpy(mask))[1].numpy()
        np.testing.assert_allclose(logits, ref, atol=1e-4)
        with pytest.raises(AttributeError, match=r"generate\(\) is for seq2seq exports"):
            rt.generate(ids, mask, 5)
