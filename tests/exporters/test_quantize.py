"""Optimised and reduced-precision graphs: fusion counts, files, the runtime, and the accuracy gate."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import onnx
import pytest
import torch

from edgeattn.config import ModelConfig
from edgeattn.errors import ExportError
from edgeattn.exporters import quantize
from edgeattn.exporters.export import export_model, quantize_export
from edgeattn.exporters.fusion import fused_copy
from edgeattn.exporters.gate import evaluate, heldout_sources
from edgeattn.exporters.precision_builds import PrecisionOptions
from edgeattn.exporters.quantize import ConversionJob, converter
from edgeattn.exporters.reference import eager_generate
from edgeattn.host import dynamic_int8_weights, has_vnni
from edgeattn.model import build_model
from edgeattn.runtime import load, read_manifest
from edgeattn.runtime.manifest import sha256_file
from edgeattn.runtime.precisions import get_precision
from edgeattn.runtime.safety import graph_bytes
from edgeattn.runtime.session import create_session

CFG = ModelConfig(
    vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, max_len=64, dropout=0.0
)
ALL = ["fp32-opt", "int8", "int8-static", "fp16", "int4"]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    out = tmp_path_factory.mktemp("quant") / "out"
    model = build_model(CFG, seed=3)
    result = export_model(model, out, precisions=ALL, precision_options=PrecisionOptions(allow_degraded=True))
    return out, model, result


def test_every_precision_is_written_listed_and_gated(quantized):
    out, _, result = quantized
    manifest = read_manifest(out)
    for graph, entry in manifest.graphs.items():
        assert set(entry.precisions) == set(ALL)
        for precision, variant in entry.precisions.items():
            path = out / f"{graph}.{precision}.onnx"
            assert variant.file == path.name and variant.sha256 == sha256_file(path)
            meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
            assert meta["edgeattn.precision"] == precision and meta["edgeattn.graph"] == graph
    assert set(manifest.gates) == set(ALL)
    for precision in ALL:
        gate = manifest.gates[precision]
        assert gate.thresholds == get_precision(precision).thresholds.to_dict()
        assert gate.passed and not gate.degraded, gate.failures
        assert {"encoder", "attention", "cross_kv", "decoder", "decoder_fixed", "generation"} <= set(gate.metrics)
    assert result.gates["int8"].metrics["encoder"]["cosine_mean"] >= 0.999


def test_weights_several_graphs_of_a_precision_hold_are_stored_once(quantized):
    """The int8 decoder in its two cache forms (and the quantised embedding the encoder and decoders
    share) keep their common weights once, in weights.int8.data, which the manifest lists and hashes."""
    out, _, _ = quantized
    manifest = read_manifest(out)
    common = out / "weights.int8.data"
    assert common.is_file()
    for graph in ("encoder", "decoder", "decoder_fixed"):
        variant = manifest.graphs[graph].precisions["int8"]
        listed = {d.file: d for d in variant.external_data}
        assert listed["weights.int8.data"].sha256 == sha256_file(common)
    held: dict[str, set[bytes]] = {}  # the sizeable int8 weights each graph keeps inside its own file
    for graph in manifest.graphs:
        proto = onnx.load(str(out / f"{graph}.int8.onnx"), load_external_data=False)
        held[graph] = {t.raw_data for t in proto.graph.initializer if len(t.raw_data) >= 1024}
        if graph in ("decoder", "decoder_fixed"):
            external = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
            assert any(e.value == "weights.int8.data" for t in external for e in t.external_data)
    for a in held:
        for b in held:
            assert a == b or not held[a] & held[b], (a, b)
    int8 = [out / f"{g}.int8.onnx" for g in manifest.graphs]
    stored = sum(p.stat().st_size for p in int8) + common.stat().st_size
    assert stored < sum(graph_bytes(p) for p in int8)  # less than if each graph held its own
    assert graph_bytes(*int8) <= stored + (out / "weights.safetensors").stat().st_size


def test_fp32_opt_fuses_every_attention_block_and_keeps_parity(quantized):
    out, _, _ = quantized
    manifest = read_manifest(out)
    enc = manifest.graphs["encoder"].precisions["fp32-opt"]
    dec = manifest.graphs["decoder"].precisions["fp32-opt"]
    assert enc.attention_fused == enc.attention_blocks == 2  # layer 0 included
    assert dec.attention_fused == dec.attention_blocks == 4  # self and cross, every layer
    fixed = manifest.graphs["decoder_fixed"].precisions["fp32-opt"]
    assert fixed.attention_fused == fixed.attention_blocks == 4  # self-attention over the slots too
    # CPU graphs keep LayerNormalization + Add (ORT's CPU SkipLayerNormalization is slower);
    # fp16, the GPU precision, fuses them
    assert enc.fused_operators["LayerNormalization"] == 4 and "SkipLayerNormalization" not in enc.fused_operators
    assert dec.fused_operators["LayerNormalization"] == 6 and "SkipLayerNormalization" not in dec.fused_operators
    fp16 = onnx.load(str(out / "encoder.fp16.onnx")).graph
    assert Counter(n.op_type for n in fp16.node)["SkipLayerNormalization"] == 4
    # fp16 norms run in float16 (their kernels accumulate in float32): no Cast pair around them
    cast_outputs = {o for n in fp16.node if n.op_type == "Cast" for o in n.output}
    norms = [n for n in fp16.node if n.op_type.endswith("LayerNormalization")]
    assert norms and not any(i in cast_outputs for n in norms for i in n.input[:2])
    for graph in ("attention", "encoder", "cross_kv", "decoder", "decoder_fixed"):
        parity = manifest.graphs[graph].precisions["fp32-opt"].parity
        assert parity.passed and parity.max_abs < 1e-4


def test_cpu_sessions_do_not_refuse_layer_norms_into_skip_layer_norm(quantized, tmp_path):
    out, _, _ = quantized
    cache = tmp_path / "optimized.onnx"
    create_session(out / "encoder.int8.onnx", optimized_cache=cache)
    ops = Counter(n.op_type for n in onnx.load(str(cache)).graph.node)
    assert ops["LayerNormalization"] == 4 and ops["SkipLayerNormalization"] == 0


def test_static_int8_residuals_read_the_float_activation(tmp_path):
    """A float operator reading a QDQ pair's output reads the activation itself after the
    rewrite (the pair stays for the matrix product); an int8 Gather's own pair is left alone; the
    residual sum is exact where the pair's copy was rounded."""
    from onnx import TensorProto, helper, numpy_helper

    from edgeattn.exporters.qdq_bypass import bypass_float_consumers

    rng = np.random.default_rng(0)
    table, w = rng.standard_normal((50, 16)).astype(np.float32), rng.standard_normal((16, 16)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"]),
             helper.make_node("Mul", ["emb", "two"], ["x"]),
             helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Add", ["x", "y"], ["out"])]  # fmt: skip
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 16]) for n in ("out", "y")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])], outputs,
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(np.float32(2.0), "two")],
    )  # fmt: skip
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(src))
    ids = rng.integers(0, 50, 12)
    settings = converter("int8-static")(src, dst, ConversionJob(calibration=lambda: [{"ids": ids}]))
    model = onnx.load(str(dst))
    made = {o: n for n in model.graph.node for o in n.output}
    add, matmul, mul = (next(n for n in model.graph.node if n.op_type == op) for op in ("Add", "MatMul", "Mul"))
    assert settings["float_consumers_bypassed"] == 1 and made[add.input[0]] is mul  # the float activation x
    assert made[matmul.input[0]].op_type == "DequantizeLinear"  # the product still reads x's QDQ pair
    assert made[mul.input[0]].op_type == "DequantizeLinear"  # the Gather's pair is left alone
    assert bypass_float_consumers(model) == 0  # nothing left to rewire
    out, y = create_session(dst).run(None, {"ids": ids})
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    x = 2 * (init["table_quantized"][ids].astype(np.float32) - init["table_zero_point"]) * init["table_scale"]
    np.testing.assert_allclose(out - y, x, atol=1e-5)  # x's own 8-bit copy would be off by up to half a step:
    assert float(init[made[matmul.input[0]].input[1]]) > 1e-2


def test_int8_settings_and_sizes_are_recorded(quantized):
    out, _, _ = quantized
    manifest = read_manifest(out)
    info = manifest.graphs["decoder"].precisions["int8"].quantization
    assert info["weight_type"] == dynamic_int8_weights() and info["per_channel"] is True
    assert info["reduce_range"] is False and info["reason"]  # full range: signed with VNNI, unsigned without
    static = manifest.graphs["encoder"].precisions["int8-static"].quantization
    assert static["format"] == "QDQ" and static["calibration"] == "minmax"
    assert static["weight_type"] == "int8" and static["reduce_range"] is (not has_vnni())
    # matrix products keep float outputs: no quantise/dequantise pass between them and their float consumers
    assert static["float_outputs"] == ["MatMul"]
    graph = onnx.load(str(out / "encoder.int8-static.onnx"), load_external_data=False).graph
    producer = {o: n.op_type for n in graph.node for o in n.output}
    requantized = [n.name for n in graph.node if n.op_type == "QuantizeLinear" and producer.get(n.input[0]) == "MatMul"]
    assert sum(n.op_type == "MatMul" for n in graph.node) >= 4 and requantized == []
    # float operators (residual Adds) read float activations, not a dequantised copy: only matrix
    # products read dequantised activations, but for the embedding's, part of its int8 Gather
    made = {o: n for n in graph.node for o in n.output}
    pairs = {n.output[0]: made[made[n.input[0]].input[0]].op_type for n in graph.node  # DQ -> what made the float
             if n.op_type == "DequantizeLinear" and producer.get(n.input[0]) == "QuantizeLinear"}  # fmt: skip
    float_reads = {pairs[i] for n in graph.node if n.op_type != "MatMul" for i in n.input if i in pairs}
    assert static["float_consumers_bypassed"] >= 2 and float_reads <= {"Gather"}
    cache = out / "static.optimized.onnx"
    create_session(out / "encoder.int8-static.onnx", optimized_cache=cache)
    ops = Counter(n.op_type for n in onnx.load(str(cache)).graph.node)
    assert ops["MatMulIntegerToFloat"] >= 4 and ops["QLinearMatMul"] == 0
    fp32 = onnx.load(str(out / "decoder.onnx")).ByteSize()  # the graph with the checkpoint weights it reads
    assert (
        manifest.graphs["decoder"].precisions["int8"].bytes < 0.55 * fp32
    )  # tiny graphs: structure weighs; 25% at reference size
    assert manifest.graphs["decoder"].precisions["int4"].bytes < 0.35 * fp32
    ops = {n.op_type for n in onnx.load(str(out / "decoder.int4.onnx")).graph.node}
    assert "MatMulNBits" in ops


@pytest.mark.parametrize("precision", ALL)
def test_runtime_runs_each_precision(quantized, precision):
    out, model, _ = quantized
    rt = load(out, precision=precision)
    held = heldout_sources(CFG, n=6, seed=4)
    tokens = rt.generate(held.ids, held.mask, 12).tokens
    eager = eager_generate(model, held.ids, held.mask, 12).tokens
    agreement = (tokens[:, : eager.shape[1]] == eager[:, : tokens.shape[1]]).mean()
    assert agreement >= (1.0 if precision in ("fp32-opt", "fp16") else 0.5)


def _corrupt_scales(path, factor=60.0):
    model = onnx.load(str(path))
    hit = 0
    for init in model.graph.initializer:
        if init.name.endswith("_scale") or init.name.endswith("_scales"):
            arr = onnx.numpy_helper.to_array(init)
            init.CopyFrom(onnx.numpy_helper.from_array((arr * factor).astype(arr.dtype), init.name))
            hit += 1
    assert hit, "no scales found to corrupt"
    onnx.save(model, str(path))


def test_gate_catches_corrupted_int4_scales(tmp_path, monkeypatch):
    real = quantize.quantize_int4

    def broken(src, dst, job):
        info = real(src, dst, job)
        _corrupt_scales(dst)
        return info

    monkeypatch.setattr(quantize, "quantize_int4", broken)  # what int4's record names
    model = build_model(CFG, seed=3)
    with pytest.raises(ExportError, match="int4 graphs miss their accuracy thresholds"):
        export_model(model, tmp_path / "out", precisions=["int4"])
    assert not (tmp_path / "out").exists()
    result = export_model(model, tmp_path / "kept", precisions=["int4"],
                          precision_options=PrecisionOptions(allow_degraded=True))  # fmt: skip
    manifest = read_manifest(tmp_path / "kept")
    assert manifest.gates["int4"].degraded and manifest.gates["int4"].failures
    assert manifest.graphs["encoder"].precisions["int4"].degraded is True
    assert not result.gates["int4"].passed


def test_gate_fails_a_corrupted_int8_graph(quantized, tmp_path):
    out, model, _ = quantized
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    _corrupt_scales(copy / "encoder.int8.onnx")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["graphs"]["encoder"]["precisions"]["int8"]["sha256"] = sha256_file(copy / "encoder.int8.onnx")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    result = evaluate(model, load(copy, precision="int8"), "int8", heldout_sources(CFG, n=16))
    assert not result.passed
    assert any(f.graph == "encoder" and f.metric.startswith("cosine") for f in result.failures)


def test_sensitive_nodes_are_kept_in_float32_to_pass(tmp_path):
    cfg = CFG.replace(architecture="encoder", n_decoder_layers=0, norm_first=True)
    model = build_model(cfg, seed=0)
    with torch.no_grad():
        model.encoder.layers[1].norm2.weight[3] = 300.0  # an outlier channel into layer 1's feed-forward
    result = export_model(model, tmp_path / "out", graphs=["encoder"], precisions=["int8"])
    assert result.gates["int8"].passed
    excluded = read_manifest(tmp_path / "out").graphs["encoder"].precisions["int8"].quantization["excluded_nodes"]
    assert "/encoder/layers.1/ff/linear1/MatMul" in excluded and len(excluded) <= 3


def test_quantize_an_existing_export(tmp_path):
    out = tmp_path / "out"
    export_model(build_model(CFG, seed=1), out, graphs=["encoder"])
    gates = quantize_export(out, ["int8"])
    assert gates["int8"].passed
    assert (out / "encoder.int8.onnx").is_file()
    assert load(out, precision="int8").encode(np.ones((1, 5), dtype=np.int64)).shape == (1, 5, 32)
    with pytest.raises(ExportError, match="unknown precision 'int3'"):
        quantize_export(out, ["int3"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_calibration_file_reads_ids_or_text_and_names_bad_lines(tmp_path):
    from edgeattn.exporters.calibration import read_sequences_file as read_calibration_file
    from edgeattn.runtime.tokenizer import WordTokenizer

    path = tmp_path / "calib.txt"
    path.write_text("# token ids\n5 6 7\n\n39 3\n")
    assert read_calibration_file(path, CFG) == [[5, 6, 7], [39, 3]]
    tokenizer = WordTokenizer(["<pad>", "<bos>", "<eos>", "a", "b"])
    path.write_text("a b\nb\n")
    assert read_calibration_file(path, CFG, tokenizer) == [[3, 4], [4]]
    cases = {
        "5 6\n5 x\n": "calib.txt line 2: expected whitespace-separated token ids",
        "5 40\n": "calib.txt line 1: token id 40 is outside the vocabulary 0..39",
        "5\n" + " ".join(["5"] * 65) + "\n": "calib.txt line 2: 65 tokens, more than the model's max_len 64",
        "# nothing\n\n": "holds no sequences",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(ExportError, match=message):
            read_calibration_file(path, CFG)
    path.write_text("a\nc\n")
    with pytest.raises(ExportError, match="calib.txt line 2: unknown token"):
        read_calibration_file(path, CFG, tokenizer)
    with pytest.raises(ExportError, match="cannot read calibration file"):
        read_calibration_file(tmp_path / "missing.txt", CFG)
    with pytest.raises(ExportError, match="held-out file .* holds no sequences"):
        path.write_text("\n")
        read_calibration_file(path, CFG, what="held-out")


def test_static_int8_is_calibrated_on_the_users_sequences(tmp_path):
    """Two calibration sets give different activation scales; the manifest says which was used."""
    model = build_model(CFG, seed=3)

    def scales(name: str, data: list[list[int]] | None) -> tuple[dict[str, np.ndarray], dict]:
        out = tmp_path / name
        options = PrecisionOptions(allow_degraded=True, calibration_data=data, calibration_source="file c.txt")
        export_model(
            model, out, graphs=["encoder"], verify=False, precisions=["int8-static"], precision_options=options
        )
        proto = onnx.load(str(out / "encoder.int8-static.onnx"))
        found = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer if t.name.endswith("_scale")}
        return found, read_manifest(out).graphs["encoder"].precisions["int8-static"].quantization

    drawn, drawn_info = scales("drawn", None)
    narrow, narrow_info = scales("narrow", [[5, 5, 5, 5]] * 4)
    assert "drawn from the model's vocabulary" in drawn_info["calibration_data"]
    assert narrow_info["calibration_data"] == "file c.txt (4 sequences)"
    shared = set(drawn) & set(narrow)
    assert shared and any(not np.allclose(drawn[k], narrow[k]) for k in shared)


def test_candidates_are_gated_in_memory_and_written_once(tmp_path, monkeypatch):
    """The gate and the sensitive-node search measure candidate graphs from in-memory sessions: the
    export directory is neither reloaded nor its manifest rewritten until the chosen graphs are in."""
    from edgeattn.runtime.exported_model import ExportedModel
    from edgeattn.runtime.manifest import Manifest

    cfg = CFG.replace(architecture="encoder", n_decoder_layers=0, norm_first=True)
    model = build_model(cfg, seed=0)
    with torch.no_grad():
        model.encoder.layers[1].norm2.weight[3] = 300.0  # forces the sensitive-node search
    out = tmp_path / "out"
    export_model(model, out, graphs=["encoder"], verify=False)
    writes, loads = [], []
    real_write, real_init = Manifest.write, ExportedModel.__init__
    monkeypatch.setattr(Manifest, "write", lambda self, d: writes.append(d) or real_write(self, d))
    monkeypatch.setattr(ExportedModel, "__init__", lambda self, *a, **k: loads.append(a) or real_init(self, *a, **k))
    gates = quantize_export(out, ["int8"])
    assert gates["int8"].passed and len(writes) == 1 and loads == []
    assert read_manifest(out).graphs["encoder"].precisions["int8"].quantization["excluded_nodes"]


def test_int4_attention_adds_the_projection_biases_itself(quantized):
    """Self-attention's q, k and v biases are the fused operator's bias input, not three Adds after
    the 4-bit products (int4 is made from the unpacked fused form); the products feed it directly."""
    out, _, _ = quantized
    graph = onnx.load(str(out / "encoder.int4.onnx"), load_external_data=False).graph
    made = {o: n for n in graph.node for o in n.output}
    attention = [n for n in graph.node if n.op_type == "MultiHeadAttention"]
    assert len(attention) == CFG.n_encoder_layers
    for node in attention:
        assert len(node.input) > 3 and node.input[3], node.name  # the packed (q, k, v) bias
        assert [made[i].op_type for i in node.input[:3]] == ["MatMulNBits"] * 3, node.name


@pytest.fixture(scope="module")
def plain_static(tmp_path_factory):
    out = tmp_path_factory.mktemp("plain") / "out"
    options = PrecisionOptions(allow_degraded=True, static_form="plain")
    export_model(build_model(CFG, seed=3), out, precisions=["int8-static"], precision_options=options)
    return out


def test_static_int8_from_the_plain_graph_is_standard_onnx(plain_static, quantized):
    """With ``static_form="plain"``, int8-static's attention, encoder and cross_kv graphs hold standard
    operators only, so that other engines (OpenVINO) run them whole, with the attention core (q·kᵀ,
    p·v) left in float32; the decoders keep the fused attention over their cache, whose plain form
    ONNX Runtime runs slower. By default (fused) the encoder keeps ONNX Runtime's attention."""
    out = plain_static
    manifest = read_manifest(out)
    for name in ("attention", "encoder", "cross_kv"):
        graph = onnx.load(str(out / f"{name}.int8-static.onnx"), load_external_data=False).graph
        assert {n.domain for n in graph.node} <= {"", "ai.onnx"}, name
        assert manifest.graphs[name].precisions["int8-static"].source == "fp32", name
        made = {o: n for n in graph.node for o in n.output}
        weights = {t.name for t in graph.initializer}
        products = [n for n in graph.node if n.op_type == "MatMul"]
        quantized_weight = [n for n in products if made.get(n.input[1]) is not None
                            and made[n.input[1]].op_type == "DequantizeLinear"
                            and made[n.input[1]].input[0] in weights]  # fmt: skip
        core = [n for n in products if n not in quantized_weight]
        assert quantized_weight, name
        for node in core:  # neither operand of the attention core comes through a dequantise
            assert all(i not in made or made[i].op_type != "DequantizeLinear" for i in node.input), node.name
        if name == "encoder":  # per layer: q, k, v, output and two feed-forward products, and the core's two
            assert (len(quantized_weight), len(core)) == (6 * CFG.n_encoder_layers, 2 * CFG.n_encoder_layers)
    decoder = onnx.load(str(out / "decoder.int8-static.onnx"), load_external_data=False).graph
    assert sum(n.op_type == "MultiHeadAttention" for n in decoder.node) == 2 * CFG.n_decoder_layers
    assert manifest.graphs["decoder"].precisions["int8-static"].source.startswith("fp32-opt")
    default, _, _ = quantized
    encoder = onnx.load(str(default / "encoder.int8-static.onnx"), load_external_data=False).graph
    assert sum(n.op_type == "MultiHeadAttention" for n in encoder.node) == CFG.n_encoder_layers


def test_fused_attention_with_moved_biases_matches_the_model():
    """The unpacked fused form (biases inside the attention operator) computes what the model does,
    padding included."""
    model = build_model(CFG, seed=3).eval()
    fused = fused_copy(model, packed=False)
    ids = torch.randint(3, CFG.vocab_size, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        want, got = model.encode(ids, mask), fused.encode(ids, mask)
    assert torch.allclose(got[mask.bool()], want[mask.bool()], atol=1e-5)


def test_an_unknown_static_form_is_refused():
    from edgeattn.errors import ExportError
    from edgeattn.exporters.precision_builds import PrecisionOptions

    with pytest.raises(ExportError, match="static form .packed. is not one of auto, fused, plain"):
        PrecisionOptions(static_form="packed")


@pytest.mark.filterwarnings("ignore:Specified provider 'OpenVINOExecutionProvider'")  # the stock onnxruntime's
def test_auto_static_form_is_plain_where_the_runtime_runs_openvino(tmp_path, monkeypatch, built_in_providers):
    """The default static form follows the runtime's engine choice on this machine: with OpenVINO
    running here (taken so), an export without decoders gets standard-operator int8-static graphs,
    one with decoders keeps ONNX Runtime's fused encoder (its graphs stay on the CPU provider)."""

    from edgeattn.runtime import engines
    from edgeattn.runtime.providers import OPENVINO

    built_in_providers(OPENVINO, "CPUExecutionProvider")
    monkeypatch.setattr(engines, "openvino_usable", lambda device="CPU": True)
    model = build_model(CFG, seed=3)
    sources = {}
    for name, graphs in {"encoder": ["attention", "encoder"], "generating": ["encoder", "decoder"]}.items():
        export_model(model, tmp_path / name, graphs=graphs, precisions=["int8-static"], verify=False,
                     precision_options=PrecisionOptions(allow_degraded=True))  # fmt: skip
        manifest = read_manifest(tmp_path / name)
        sources[name] = {g: manifest.graphs[g].precisions["int8-static"].source for g in graphs}
    assert sources["encoder"] == {"attention": "fp32", "encoder": "fp32"}
    assert all(source.startswith("fp32-opt") for source in sources["generating"].values())
