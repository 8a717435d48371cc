"""A language model's key/value cache kept in int8 (GroupQueryAttention's quantised cache): scales
measured on the float graph follow its cache, decoding with them follows the float cache's, and
scales that clip the cache are seen to break it (so the comparison can fail)."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest

from tests.helpers import causal_folders

transformers = pytest.importorskip("transformers")
from edgeattn.exporters.export import export_model  # noqa: E402
from edgeattn.exporters.kv_cache import measure_scales, quantize_cache, rope_partners, why_not_supported  # noqa: E402
from edgeattn.hf import import_folder  # noqa: E402
from edgeattn.runtime import load  # noqa: E402
from edgeattn.runtime.exported_model import ExportedModel  # noqa: E402
from edgeattn.runtime.families.causal.runtime import forced_feeds  # noqa: E402

pytestmark = pytest.mark.skipif(why_not_supported() is not None, reason=str(why_not_supported()))


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("kv8")
    folder, _ = causal_folders.save_folder("llama-gqa-tied", root / "hf", trained=True)
    out = root / "lm"
    export_model(import_folder(folder).model, out, verify=False, precisions=["fp32-opt"])  # GroupQueryAttention
    return out


def _prompts(vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Three prompts of lengths 5, 19 and 33 (right-padded), ids drawn from the vocabulary."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, size=(3, 33))
    mask = np.zeros_like(ids)
    for row, length in enumerate((5, 19, 33)):
        mask[row, :length] = 1
    return ids * mask, mask


def _with_int8_cache(export, tmp_path, margin: float) -> ExportedModel:
    full = load(export)
    src = export / full.manifest.graphs["causal_decoder"].precisions["fp32-opt"].file
    ids, mask = _prompts(full.config.vocab_size, seed=1)
    scales = measure_scales(src, [forced_feeds(full.config, ids, mask)], full.config, "drawn ids", margin=margin)
    dst = tmp_path / "causal_decoder.kv8.onnx"
    shutil.copy(src, dst)
    for data in [*export.glob("*.safetensors"), *export.glob("*.data")]:  # weights the graph keeps outside
        shutil.copy(data, tmp_path / data.name)
    record = quantize_cache(dst, scales)
    assert record is not None and record["dtype"] == "int8" and record["margin"] == margin
    return ExportedModel.from_graphs(full.config, {"causal_decoder": dst}, precision="int8")


def test_an_int8_cache_decodes_as_the_float_cache(export, tmp_path):
    full = load(export, precision="fp32-opt")
    kv8 = _with_int8_cache(export, tmp_path, margin=1.0)
    graph = onnx.load(str(tmp_path / "causal_decoder.kv8.onnx"), load_external_data=False)
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.graph.input, *graph.graph.output]}
    assert types["cache_key_0"] == types["updated_value_0"] == onnx.TensorProto.INT8
    assert types["logits"] == onnx.TensorProto.FLOAT
    ids, mask = _prompts(full.config.vocab_size, seed=2)  # other prompts than the scales saw
    ours, theirs = kv8.state(ids, mask, capacity=48), full.state(ids, mask, capacity=48)
    assert next(iter(ours.host.values())).dtype == np.int8
    tokens = np.zeros(3, np.int64)
    agree, cosines = [], []
    for _ in range(12):  # decoding steps read the cache back: each fed float32's own greedy token
        a, b = ours.step(tokens), theirs.step(tokens)
        agree.append(a.argmax(-1) == b.argmax(-1))
        cosines.append((a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1))
        tokens = b.argmax(-1)
    assert np.mean(agree) >= 0.9 and np.min(cosines) > 0.995, (np.mean(agree), np.min(cosines))
    a, b = kv8.next_token_logits(ids, mask), full.next_token_logits(ids, mask)
    valid = mask.astype(bool)
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert cos[valid].min() > 0.995, cos[valid].min()


def test_scales_that_clip_the_cache_break_it(export, tmp_path):
    full = load(export, precision="fp32-opt")
    clipped = _with_int8_cache(export, tmp_path, margin=0.05)
    ids, mask = _prompts(full.config.vocab_size, seed=2)
    a, b = clipped.next_token_logits(ids, mask), full.next_token_logits(ids, mask)
    valid = mask.astype(bool)
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert cos[valid].min() < 0.99, cos[valid].min()


def test_rotary_partners_pair_each_rotated_channel(export):
    config = load(export).config
    partners = rope_partners(config)
    assert partners is not None and sorted(partners) == list(range(config.section.dim))
    assert (partners[partners] == np.arange(config.section.dim)).all()  # a pair is mutual
    rotary = int(config.section.dim * config.section.rotary_fraction)
    assert (partners[:rotary] != np.arange(rotary)).all()


@pytest.mark.parametrize("asked", [None, "float32"])
def test_quantize_keeps_the_cache_as_asked(export, tmp_path, asked):
    """By default int8's cache is int8, its scales measured with room to spare on token ids drawn
    from the vocabulary (no text given); ``--kv-cache float32`` keeps it float32, and says so."""
    from click.testing import CliRunner

    from edgeattn.cli import cli

    out = tmp_path / "lm"
    shutil.copytree(export, out)
    flags = [] if asked is None else ["--kv-cache", asked]
    result = CliRunner().invoke(cli, ["quantize", str(out), "--precision", "int8", "--allow-degraded", *flags])
    assert result.exit_code == 0, result.output
    variant = load(out, precision="int8").manifest.graphs["causal_decoder"].precisions["int8"]
    graph = onnx.load(str(out / variant.file), load_external_data=False)
    cache = next(v.type.tensor_type.elem_type for v in graph.graph.input if v.name.startswith("cache_"))
    if asked is None:
        assert variant.kv_cache["dtype"] == "int8" and cache == onnx.TensorProto.INT8
        assert variant.kv_cache["measured_on"] == "token ids drawn from the vocabulary"
        assert variant.kv_cache["margin"] == 2.0
    else:
        assert variant.kv_cache == {"dtype": "float32", "not_int8_because": "--kv-cache float32 was asked for"}
        assert cache == onnx.TensorProto.FLOAT


def test_kv_cache_is_refused_where_no_graph_keeps_one_in_int8():
    from click.testing import CliRunner

    from edgeattn.cli import cli

    result = CliRunner().invoke(cli, ["export", "--preset", "tiny", "-o", "unused", "--precision", "int8",
                                      "--kv-cache", "int8"])  # fmt: skip
    assert result.exit_code == 2 and "--kv-cache is for a language model's int8 and int4" in result.output
