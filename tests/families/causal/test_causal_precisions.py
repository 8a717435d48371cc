"""Decoder-only exports through the gate: int8 and int4 of a small Llama pass it on held-out text,
a model built to break int4 (an outlier input channel, the same function in float32) is caught,
and a large tied embedding reads the output layer's 8-bit weights instead of a copy."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from tests.helpers import causal_folders

transformers = pytest.importorskip("transformers")
from edgeattn.errors import ExportError  # noqa: E402
from edgeattn.exporters.export import export_model  # noqa: E402
from edgeattn.hf import import_folder  # noqa: E402
from edgeattn.runtime import load  # noqa: E402
from edgeattn.runtime.safety import graph_bytes  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return causal_folders.save_folder("llama-gqa-tied", tmp_path_factory.mktemp("gate") / "hf", trained=True)[0]


def test_int8_int4_and_fp16_pass_the_gate_on_held_out_text(folder, tmp_path):
    """The command line a user runs, held-out text in a file; the gate's figures in the manifest;
    fp16's caches float16, bound and written in place as float32's are."""
    from click.testing import CliRunner

    from edgeattn.cli import cli

    notes = causal_folders.heldout_notes(tmp_path / "notes.txt")  # 30 unseen pairs
    out = tmp_path / "lm"
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(out),
                                      "--precision", "int8,int4,fp16", "--heldout", str(notes)])  # fmt: skip
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    for precision in ("int8", "int4"):
        gate = manifest["gates"][precision]
        assert gate["passed"] and "file notes.txt (30 sequences)" in gate["heldout"], gate
        metrics = gate["metrics"]["causal_decoder"]
        assert metrics["teacher_top1"] >= 0.85 and metrics["perplexity_kept"] >= 0.85 and metrics["loop_free"] >= 0.95
        assert gate["metrics"]["generation"]["exact_match"] >= 0.7
    variant = manifest["graphs"]["causal_decoder"]["precisions"]["int4"]
    assert variant["quantization"]["accuracy_level"] == 4  # the role's int8 activations
    # fitted by GPTQ on the held-out text (too little of it for the gate not to measure it too)
    assert variant["quantization"]["method"] == "gptq" and variant["quantization"]["fitted_products"] > 0
    assert variant["quantization"]["fitted_on"] == "file notes.txt, which the gate measures too"
    for precision in ("int8", "int4"):  # the key/value cache in int8, its scales measured on the text
        cache = manifest["graphs"]["causal_decoder"]["precisions"][precision]["kv_cache"]
        assert cache["dtype"] == "int8" and cache["measured_on"].startswith("file notes.txt"), cache
    model = load(out, precision="int4")
    graph = onnx.load(str(out / "causal_decoder.int4.onnx"), load_external_data=False)
    assert {v.type.tensor_type.elem_type for v in graph.graph.input if v.name.startswith("cache_")} == {
        onnx.TensorProto.INT8}  # fmt: skip
    state = model.state(np.array([[5, 9, 12, 7]]), np.ones((1, 4), np.int64), capacity=12)
    assert next(iter(state.host.values())).dtype == np.int8
    assert len(model.generate_text(["the sea is", "hello"], 8)) == 2
    gate = manifest["gates"]["fp16"]
    assert gate["passed"] and gate["metrics"]["causal_decoder"]["teacher_top1"] >= 0.99, gate
    assert manifest["graphs"]["causal_decoder"]["precisions"]["fp16"]["quantization"]["io"] == \
        "float32, the caches float16"  # fmt: skip
    graph = onnx.load(str(out / "causal_decoder.fp16.onnx"), load_external_data=False)
    types = {t.name: t.type.tensor_type.elem_type for t in [*graph.graph.input, *graph.graph.output]}
    assert types["cache_key_0"] == types["updated_key_0"] == onnx.TensorProto.FLOAT16
    assert types["logits"] == onnx.TensorProto.FLOAT
    half, full = load(out, precision="fp16"), load(out)
    state = half.state(np.array([[5, 9, 12, 7]]), np.ones((1, 4), np.int64), capacity=12)
    assert next(iter(state.host.values())).dtype == np.float16
    prompts = ["the sea is", "waves fold over"]
    assert half.generate_text(prompts, 8) == full.generate_text(prompts, 8)


def test_large_candidates_are_gated_from_mapped_files_that_go_with_them(folder, tmp_path, monkeypatch):
    """Where a quantised graph's weights pass the mapping threshold (here: every graph's), the gate's
    sessions open its file with the weights in a data file beside it, not the serialised graph held
    in memory; a candidate's files are gone once it is (int8's before int4 is gated); the export
    is written from those files without loading their weights, and it, its files and its gate
    figures are byte for byte those of graphs held in memory."""
    from edgeattn.exporters import quantize
    from edgeattn.runtime.exported_model import ExportedModel
    from edgeattn.runtime.layout import external_data_file

    texts = causal_folders.heldout_notes(tmp_path / "notes.txt")
    hf = import_folder(folder)
    fields = {"tokenizer": hf.tokenizer, "architecture": hf.architecture}
    heldout = [hf.tokenizer.encode(t) for t in texts.read_text().splitlines() if t.strip()]
    from edgeattn.exporters.precision_builds import PrecisionOptions

    def export(out):
        export_model(hf.model, out, precisions=["fp32", "int8", "int4"], verify=False,
                     precision_options=PrecisionOptions(heldout_data=heldout), **fields)  # fmt: skip
        return json.loads((out / "manifest.json").read_text())

    held = export(tmp_path / "held")
    opened: list = []
    original = ExportedModel.from_graphs.__func__

    def from_graphs(cls, config, graphs, *args, **kwargs):
        for path in opened:  # an earlier precision's candidate, released: its files are gone
            assert not path.parent.exists(), path
        opened.extend(graphs.values())
        for graph in graphs.values():  # the weights in a data file beside the graph, which the session maps
            assert not isinstance(graph, bytes) and graph.with_name(external_data_file(graph.name)).is_file(), graph
        return original(cls, config, graphs, *args, **kwargs)

    loaded: list[str] = []  # folders whose graphs' external weights were read into memory whole
    load_data = onnx.load_external_data_for_model

    def load_external_data_for_model(model, base_dir):
        loaded.append(str(base_dir))
        return load_data(model, base_dir)

    monkeypatch.setattr(quantize, "MAPPED_ABOVE", 0)
    monkeypatch.setattr(ExportedModel, "from_graphs", classmethod(from_graphs))
    monkeypatch.setattr(onnx, "load_external_data_for_model", load_external_data_for_model)
    mapped = export(tmp_path / "mapped")
    assert len(opened) == 2, opened
    assert not [d for d in loaded if any(str(p.parent) == d for p in opened)], loaded
    assert mapped["gates"] == held["gates"]
    for precision in ("int8", "int4"):  # the same graph and data files, recorded alike
        assert mapped["graphs"]["causal_decoder"]["precisions"][precision] == \
            held["graphs"]["causal_decoder"]["precisions"][precision]  # fmt: skip
    prompt = np.array([[5, 9, 12, 7, 30, 2]])
    for precision in ("int8", "int4"):
        a, b = load(tmp_path / "held", precision=precision), load(tmp_path / "mapped", precision=precision)
        np.testing.assert_array_equal(a.generate(prompt, None, 6).tokens, b.generate(prompt, None, 6).tokens)


def test_an_outlier_channel_that_breaks_int4_is_caught(tmp_path):
    """Input channel 0 of every product after a norm scaled up 300x, its norm weight down as much:
    float32 computes the same function, but each 4-bit block holding that channel loses the rest."""
    out, reference = causal_folders.save_folder("llama-gqa-tied", tmp_path / "hf", trained=True)
    with torch.no_grad():
        model = reference.model
        for layer in model.layers:
            layer.input_layernorm.weight[0] /= 300
            layer.post_attention_layernorm.weight[0] /= 300
            for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                           layer.mlp.gate_proj, layer.mlp.up_proj):  # fmt: skip
                linear.weight[:, 0] *= 300
    reference.save_pretrained(out)
    hf = import_folder(out)
    with pytest.raises(ExportError, match="int4 graphs miss their accuracy thresholds.*causal_decoder teacher_top1"):
        export_model(hf.model, tmp_path / "lm", precisions=["int4"])
    assert not (tmp_path / "lm").exists()


def test_a_large_tied_embedding_reads_the_output_layers_8bit_weights(tmp_path):
    """int4 keeps a language model's output layer at 8 bits (the role's int4_head_bits), and the
    tied embedding gathers from those weights instead of keeping its own copy."""
    torch.manual_seed(0)
    big = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=1 << 15, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)).eval()  # fmt: skip
    big.save_pretrained(tmp_path / "hf")
    hf = import_folder(tmp_path / "hf")
    result = export_model(hf.model, tmp_path / "lm", precisions=["int4"], precision_options=_degraded_ok())
    variant = result.manifest.graphs["causal_decoder"].precisions["int4"]
    assert variant.quantization["tied_tables"]
    proto = onnx.load(str(tmp_path / "lm" / variant.file))
    gather = next(n for n in proto.graph.node if n.op_type == "GatherBlockQuantized")
    product = next(n for n in proto.graph.node if n.op_type == "MatMulNBits" and n.output[0] == "logits")
    assert gather.input[2] == product.input[2]  # the same scales, and the table reshaped from its weights
    assert onnx.helper.get_attribute_value(next(a for a in product.attribute if a.name == "bits")) == 8
    assert onnx.helper.get_attribute_value(next(a for a in gather.attribute if a.name == "bits")) == 8
    assert variant.quantization["output_layer_bits"] == 8 and variant.quantization["method"] == "rtn"
    bits_of = {n.input[1]: onnx.helper.get_attribute_value(next(a for a in n.attribute if a.name == "bits"))
               for n in proto.graph.node if n.op_type == "MatMulNBits"}  # fmt: skip
    four = ("o_proj", "gate_up", "down_proj")
    assert {w: b for w, b in bits_of.items() if any(p in w for p in four)} and \
        all(b == 4 for w, b in bits_of.items() if any(p in w for p in four))  # fmt: skip
    assert all(b == 8 for w, b in bits_of.items() if "qkv_proj" in w)  # the role's wide one
    assert not [t for t in proto.graph.initializer if t.name == "embed.weight"]
    assert [d.file for d in variant.external_data] == [variant.file + ".data"]  # weights beside it, mapped at load
    bits = 8 * graph_bytes(tmp_path / "lm" / variant.file) / hf.model.config.parameter_count()
    assert bits <= 8.7, bits  # nearly all weights are the 8-bit table's (blocks of 64, float32 scales: 8.5)
    ids = np.random.default_rng(0).integers(0, 1 << 15, size=(2, 9))
    fp32, int4 = load(tmp_path / "lm"), load(tmp_path / "lm", precision="int4")
    a, b = fp32.next_token_logits(ids), int4.next_token_logits(ids)
    cosine = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert cosine.min() > 0.9


def _degraded_ok():
    """Random weights of a 32k vocabulary: flat logits whose top token is noise, kept to measure size."""
    from edgeattn.exporters.precision_builds import PrecisionOptions

    return PrecisionOptions(allow_degraded=True)


@pytest.mark.parametrize("normalized", [True, False], ids=["top-k-normalised", "top-k-raw"])
def test_a_mixture_of_experts_passes_the_gate_with_its_experts_in_qmoe(tmp_path, normalized):
    """A trained Qwen3-MoE (two mixtures of 4 experts, a dense layer between) at int8 and int4: its
    experts 8- and 4-bit in ONNX Runtime's QMoE (chosen weights normalised or left as the router's
    softmax gives them), the router kept 8-bit, through the gate on held-out text; the float32
    forms (every expert's product, and the MoE operator) equal eager PyTorch."""
    from click.testing import CliRunner

    from edgeattn.cli import cli

    model = causal_folders.build("qwen3-moe")
    model.config.norm_topk_prob = normalized
    for layer in model.model.layers:
        if hasattr(layer.mlp, "norm_topk_prob"):
            layer.mlp.norm_topk_prob = normalized
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    causal_folders.write_tokenizer(folder)
    causal_folders.train(model, folder)
    model.save_pretrained(folder)
    causal_folders.write_tokenizer(folder)
    out = tmp_path / "lm"
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(out), "--precision",
                                      "fp32-opt,int8,int4", "--heldout",
                                      str(causal_folders.heldout_notes(tmp_path / "notes.txt"))])  # fmt: skip
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["causal"]["norm_topk"] is normalized
    assert manifest["config"]["causal"]["dense_layers"] == [1]
    for precision, operator in (("fp32", None), ("fp32-opt", "MoE"), ("int8", "QMoE"), ("int4", "QMoE")):
        name = "causal_decoder.onnx" if precision == "fp32" else f"causal_decoder.{precision}.onnx"
        ops = [n.op_type for n in onnx.load(str(out / name), load_external_data=False).graph.node]
        assert ops.count("TopK") == (2 if operator is None else 0 if normalized or operator == "MoE" else 2)
        if operator:
            assert ops.count(operator) == 2, (precision, operator)
    for precision in ("int8", "int4"):
        gate = manifest["gates"][precision]
        assert gate["passed"] and not gate["degraded"], gate
        assert gate["metrics"]["causal_decoder"]["teacher_top1"] >= 0.9, gate
        quantization = manifest["graphs"]["causal_decoder"]["precisions"][precision]["quantization"]
        assert quantization["experts"] == {"operator": "QMoE", "nodes": 2, "method": "rtn"}
    graph = onnx.load(str(out / "causal_decoder.int4.onnx"), load_external_data=False)
    routers = [n for n in graph.graph.node if n.op_type == "MatMulNBits" and "ff.router" in n.input[1]]
    assert len(routers) == 2 and all(next(a.i for a in n.attribute if a.name == "bits") == 8 for n in routers)
    ids = np.array([[5, 9, 12, 7, 30, 41], [0, 0, 8, 14, 3, 22]])
    mask = (ids > 0).astype(np.int64)
    eager = import_folder(folder).model
    with torch.no_grad():
        want = eager(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    for precision in ("fp32", "fp32-opt"):
        got = load(out, precision=precision).next_token_logits(ids, mask)
        assert np.abs(got - want)[mask.astype(bool)].max() < 1e-4, precision
    int4 = load(out, precision="int4").next_token_logits(ids, mask)
    assert (int4.argmax(-1) == want.argmax(-1))[mask.astype(bool)].mean() >= 0.75
