"""One copy of every weight: graphs keep their float32 weights in the export's checkpoint, the
runtime builds only the sessions its calls use and holds weights several graphs share once."""

from __future__ import annotations

import shutil
import sys

import numpy as np
import onnx
import pytest
import torch

from edgeattn.config import ModelConfig
from edgeattn.exporters.compact import fold_transposes
from edgeattn.exporters.export import export_model
from edgeattn.exporters.precision_builds import PrecisionOptions
from edgeattn.exporters.quantize import plain_weights, quantizable_nodes
from edgeattn.model import build_model
from edgeattn.runtime import load, read_manifest
from edgeattn.runtime.layout import TRANSPOSED_SUFFIX, WEIGHTS

CFG = ModelConfig(vocab_size=300, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2,
                  max_len=64, dropout=0.0, position="t5", relative_shared=True, norm="rmsnorm", norm_first=True,
                  attention_scaled=False, bias=False, scale_embedding=False, scale_decoder_output=True)  # fmt: skip


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    out = tmp_path_factory.mktemp("compact") / "out"
    model = build_model(CFG, seed=0)
    options = PrecisionOptions(allow_degraded=True, sensitive_search=False)  # random weights: layout, not accuracy
    export_model(model, out, precisions=["fp32-opt", "int8"], precision_options=options)
    return out, model


def _big_initializers(path, embedded: bool) -> dict[str, onnx.TensorProto]:
    graph = onnx.load(str(path), load_external_data=False).graph
    external = {t.name: t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    if not embedded:
        return external
    return {t.name: t for t in graph.initializer if t.name not in external and len(t.raw_data) >= 1024}


def test_graphs_keep_their_weights_in_the_checkpoint_once(export, tmp_path):
    out, model = export
    manifest = read_manifest(out)
    export_model(model, tmp_path / "apart", verify=False, compact=False)
    apart = read_manifest(tmp_path / "apart")
    compact_bytes = sum(e.bytes for e in manifest.graphs.values()) + (out / WEIGHTS).stat().st_size
    apart_bytes = sum(e.bytes for e in apart.graphs.values()) + (tmp_path / "apart" / WEIGHTS).stat().st_size
    assert compact_bytes < 0.6 * apart_bytes  # on a model this small the graphs' structure weighs as much as weights
    for name, entry in manifest.graphs.items():
        assert not _big_initializers(out / entry.file, embedded=True), name
        assert WEIGHTS in {d.file for d in entry.external_data}
    regions = {}
    for name in ("encoder", "decoder"):
        for t in _big_initializers(out / manifest.graphs[name].file, embedded=False).values():
            where = {e.key: e.value for e in t.external_data}
            assert where["location"] == WEIGHTS
            regions.setdefault(name, set()).add((where["offset"], where["length"]))
    assert regions["encoder"] & regions["decoder"]  # the shared embedding and bias tables: stored once
    decoder = onnx.load(str(out / manifest.graphs["decoder"].file), load_external_data=False).graph
    transposed = [n for n in decoder.node if n.op_type == "Transpose" and n.input[0].endswith(TRANSPOSED_SUFFIX)]
    assert transposed  # the tied output layer (and the projections) read the checkpoint's matrices
    fp32_opt = manifest.entry("encoder", "fp32-opt")
    assert WEIGHTS in {d.file for d in fp32_opt.external_data}  # the optimised graphs share them too


def test_folded_sources_give_the_quantisers_plain_weights(export, tmp_path):
    out, _ = export
    proto = fold_transposes(onnx.load(str(out / "decoder.onnx")))
    assert not [n for n in proto.graph.node if n.op_type == "Transpose" and n.input[0].endswith(TRANSPOSED_SUFFIX)]
    onnx.save(proto, tmp_path / "folded.onnx")
    # a product read through a Transpose of the checkpoint is as quantisable as its folded form
    assert quantizable_nodes(tmp_path / "folded.onnx") == quantizable_nodes(out / "decoder.onnx")
    copy = tmp_path / "copy"  # the export's folder stays as it is
    copy.mkdir()
    for name in ("decoder.onnx", WEIGHTS):
        shutil.copy(out / name, copy / name)
    plain = plain_weights(copy / "decoder.onnx")
    assert plain != copy / "decoder.onnx" and plain.parent == copy
    folded = onnx.load(str(plain))
    assert not [n for n in folded.graph.node if n.op_type == "Transpose" and n.input[0].endswith(TRANSPOSED_SUFFIX)]
    assert quantizable_nodes(plain) == quantizable_nodes(tmp_path / "folded.onnx")
    assert plain_weights(plain) == plain


def test_runtime_builds_only_the_sessions_it_uses_and_shares_weights(export):
    out, model = export
    rt = load(out, providers=["CPUExecutionProvider"])
    assert rt.sessions.created == ["encoder"]
    tokens = rt.greedy(np.array([[5, 6, 7, 8, 9]]), max_new_tokens=6)
    # never the attention graph, nor the decoder with the growing cache where the export has decoder_fixed
    assert sorted(rt.sessions.created) == ["cross_kv", "decoder_fixed", "encoder"]
    assert any("embed" in name for name in rt._shared)
    import torch

    with torch.no_grad():
        want = model.greedy(torch.tensor([[5, 6, 7, 8, 9]]), max_new_tokens=6).numpy()
    assert np.array_equal(tokens, want)
    assert rt.run("attention", _attention_feeds())["attention_output"].shape == (1, 3, 32)
    assert "attention" in rt.sessions.created


def _attention_feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 32)).astype(np.float32)
    return {"query": x, "key": x, "value": x, "key_padding_mask": np.ones((1, 3), np.int64)}


def test_a_corrupted_checkpoint_stops_the_load_even_for_graphs_not_yet_built(export, tmp_path):
    import shutil

    from edgeattn.runtime.manifest import ManifestError

    copy = tmp_path / "copy"
    shutil.copytree(export[0], copy)
    data = bytearray((copy / WEIGHTS).read_bytes())
    data[-5] ^= 0xFF
    (copy / WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="does not match its manifest sha256"):
        load(copy, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("precision", ["fp32", "fp32-opt"])
def test_a_stack_makes_its_score_terms_once(export, precision, tmp_path):
    """One T5 bias table per stack: its bucketed bias, the causal mask and (once ONNX Runtime has
    merged the index_put conversion's per-layer copies) the slot cache's write index are computed
    once per graph, not once per layer (they were, and cost a decoding step hundreds of small
    operators)."""
    import onnxruntime as ort

    out, _ = export
    manifest = read_manifest(out)
    for name in ("encoder", "decoder", "decoder_fixed"):
        graph = onnx.load(str(out / manifest.graphs[name].at(precision).file), load_external_data=False).graph
        ops = [n.op_type for n in graph.node]
        assert ops.count("Log") == 1, (name, precision)  # the buckets' logarithm: one bias per stack
        if name != "encoder":  # one causal mask (none where the fused operator masks by an attribute)
            assert ops.count("LessOrEqual") <= 1, (name, precision)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(out / manifest.graphs["decoder_fixed"].at(precision).file), options,
                         providers=["CPUExecutionProvider"])  # fmt: skip
    optimized = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
    writes = [n for n in optimized.node if n.op_type == "ScatterND"]
    assert len(writes) == 2 * CFG.n_decoder_layers
    assert len({n.input[1] for n in writes}) == 1  # every layer's keys and values written at one index


def test_stacks_without_a_shared_table_keep_one_bias_per_layer():
    """T5 positions with a table per layer: each layer's own bias, the same as computing each alone."""
    cfg = CFG.replace(relative_shared=False, n_encoder_layers=3)
    model = build_model(cfg, seed=1).eval()
    tables = {id(layer.self_attn.relative) for layer in model.encoder.layers}
    assert len(tables) == 3
    ids = torch.randint(0, cfg.vocab_size, (2, 9))
    x = model.embed_tokens(ids)
    out, _ = model.encoder(x)
    h = x
    for layer in model.encoder.layers:
        h, _ = layer(h)  # each layer's block makes its own terms
    assert torch.allclose(out, model.encoder.final_norm(h), atol=1e-6)


def test_a_decoder_layer_adds_few_operators_to_a_decoding_step(tmp_path):
    """What one more decoder layer costs a decoding step, counted after ONNX Runtime's graph
    optimisations: its products, norms, attention cores and cache writes, not chains of shape
    arithmetic (124 operators a layer before the score terms were shared and the heads merged by
    sizes ONNX Runtime folds; 48 now)."""
    import onnxruntime as ort

    from edgeattn.exporters.onnx_export import export_graph

    counts = {}
    for layers in (2, 3):
        model = build_model(CFG.replace(n_decoder_layers=layers), seed=0).eval()
        path = tmp_path / f"decoder_fixed{layers}.onnx"
        export_graph(model, "decoder_fixed", path)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(tmp_path / f"optimized{layers}.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        counts[layers] = len(onnx.load(options.optimized_model_filepath, load_external_data=False).graph.node)
    assert counts[3] - counts[2] <= 50, counts


def test_the_checkpoint_index_finds_weights_as_stored_and_transposed_hashing_only_what_is_asked(tmp_path, monkeypatch):
    """A weight is found in the checkpoint as stored or transposed (a matrix hashed a few rows at a
    time), one of no checkpoint tensor's shape without hashing anything, and a same-shaped weight
    of other values not at all."""
    from safetensors.numpy import save_file

    from edgeattn.exporters import compact

    rng = np.random.default_rng(0)
    a, b, square = (rng.standard_normal(s).astype(np.float32) for s in ((300, 70), (70, 300), (64, 64)))
    path = tmp_path / "w.safetensors"
    save_file({"a": a, "b": b, "square": square}, str(path))
    monkeypatch.setattr(compact, "HASH_CHUNK", 4096)  # the transposes hashed in many pieces
    index = compact.CheckpointIndex(path)
    hashed: list = []
    digest = index._digest
    monkeypatch.setattr(index, "_digest", lambda region, dims: hashed.append(region) or digest(region, dims))
    f32 = onnx.TensorProto.FLOAT
    assert index.find(f32, (5, 7), np.zeros((5, 7), np.float32).tobytes()) is None and not hashed
    exact = index.find(f32, (300, 70), a.tobytes())
    assert exact is not None and exact[1] is None
    flipped = index.find(f32, (300, 70), np.ascontiguousarray(b.T).tobytes())  # b stored (70, 300)
    assert flipped is not None and flipped[1] == (70, 300)
    assert index.find(f32, (64, 64), np.ascontiguousarray(square.T).tobytes())[1] == (64, 64)
    assert index.find(f32, (64, 64), np.ones((64, 64), np.float32).tobytes()) is None


@pytest.mark.parametrize("name", ["qwen2-biases", "gemma3-sliding", "llama-gqa-tied"])
def test_a_written_graph_points_at_the_checkpoint_instead_of_writing_its_weights(tmp_path, monkeypatch, name):
    """An imported language model's graph is written pointing at the checkpoint's bytes (the
    packed gate/up product at its two tensors side by side, a Linear's weight through a Transpose)
    without writing them, verified against eager PyTorch; a tensor changed since the checkpoint was
    saved is written as the graph needs it."""
    pytest.importorskip("transformers")
    from edgeattn.exporters.compact import CheckpointIndex
    from edgeattn.exporters.external_data import DataSink
    from edgeattn.exporters.onnx_export import written_graph
    from edgeattn.families.causal.hf import import_causal_folder
    from edgeattn.weights import save_weights
    from tests.helpers.causal_folders import save_folder

    folder, _ = save_folder(name, tmp_path / "folder")
    model = import_causal_folder(folder)
    written: list[str] = []
    put = DataSink.put
    monkeypatch.setattr(
        DataSink, "put", lambda self, tensor, array: written.append(tensor.name) or put(self, tensor, array)
    )
    out = tmp_path / "out"
    export_model(model, out)  # verified
    graph = onnx.load(str(out / "causal_decoder.onnx"), load_external_data=False).graph
    where = {t.name: {e.key: e.value for e in t.external_data} for t in graph.initializer}
    header = CheckpointIndex(out / WEIGHTS).named
    for layer in range(model.config.n_decoder_layers):
        for product, parts in (("ff.gate_up_proj", ("ff.gate_proj", "ff.up_proj")), ("attn.o_proj", ("attn.o_proj",)),
                               ("ff.down_proj", ("ff.down_proj",))):  # fmt: skip
            source = f"layers.{layer}.{product}.weight.T{TRANSPOSED_SUFFIX}"
            regions = [header[f"layers.{layer}.{part}.weight"][0] for part in parts]
            assert where[source] == {"location": WEIGHTS, "offset": str(regions[0].offset),
                                     "length": str(sum(r.length for r in regions))}, source  # fmt: skip
    assert where["embed.weight"]["location"] == WEIGHTS
    assert not [n for n in written if n.startswith(("embed", "lm_head")) or "o_proj" in n or "gate_up" in n
                or "down_proj" in n]  # fmt: skip
    assert read_manifest(out).graphs["causal_decoder"].parity.passed

    save_weights(model, tmp_path / "again" / WEIGHTS)
    with torch.no_grad():
        model.layers[1].ff.down_proj.weight.add_(1.0)  # not what the checkpoint holds any more
    proto, _ = written_graph(model, "causal_decoder", data=tmp_path / "again" / "g.onnx.data",
                             checkpoint=CheckpointIndex(tmp_path / "again" / WEIGHTS))  # fmt: skip
    names = {t.name for t in proto.graph.initializer}
    assert "layers.1.ff.down_proj.weight.T" in names and f"layers.0.ff.down_proj.weight.T{TRANSPOSED_SUFFIX}" in names


def test_a_traced_graph_is_never_loaded_with_its_weights(tmp_path, monkeypatch):
    """A traced graph's weights stay in the files torch wrote them to: those the checkpoint holds
    are pointed at there, the rest copied a region at a time, none read into the graph whole."""
    from edgeattn.exporters import onnx_export

    loads: list[bool] = []
    load = onnx_export.onnx.load

    def recorded(path, *args, load_external_data=True, **kwargs):
        if sys._getframe(1).f_code.co_name == "export_graph":
            loads.append(load_external_data)
        return load(path, *args, load_external_data=load_external_data, **kwargs)

    monkeypatch.setattr(onnx_export.onnx, "load", recorded)
    out = tmp_path / "out"
    export_model(build_model(CFG, seed=1), out)  # verified
    assert loads and not any(loads)
    manifest = read_manifest(out)
    for name, entry in manifest.graphs.items():
        assert entry.parity.passed, name
        assert WEIGHTS in {d.file for d in entry.external_data}, name
