"""The engine the runtime chooses for each graph when the caller names none, and the reason it gives;
the operator domains it reads from a graph's bytes to decide."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgeattn.config import get_preset
from edgeattn.errors import EdgeattnError
from edgeattn.exporters.export import export_model
from edgeattn.host import has_bf16
from edgeattn.model import build_model
from edgeattn.runtime import engines, load, providers
from edgeattn.runtime.engines import OPENVINO_AUTO, choose_engine, standard_only
from edgeattn.runtime.families import FAMILIES
from edgeattn.runtime.onnx_bytes import Malformed, operator_domains
from edgeattn.runtime.providers import OPENVINO, openvino_usable
from edgeattn.runtime.session import CPU, CUDA, create_session

ENCODER_FAMILY, SEQ2SEQ_FAMILY = FAMILIES["encoder"], FAMILIES["seq2seq"]

pytestmark = pytest.mark.quick


def _model(nodes: list[onnx.NodeProto], functions: list[onnx.FunctionProto] | None = None) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph(nodes, "g", [x], [y])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("custom", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8, functions=functions or [])


def _branch(op: str, domain: str = "") -> onnx.GraphProto:
    out = helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])
    return helper.make_graph([helper.make_node(op, ["x"], ["b"], domain=domain)], "branch", [], [out])


def test_operator_domains_come_from_nodes_subgraphs_and_functions():
    plain = _model([helper.make_node("Relu", ["x"], ["y"])])
    assert operator_domains(plain.SerializeToString()) == {"ai.onnx"}
    fused = _model(
        [helper.make_node("Gelu", ["x"], ["h"], domain="com.microsoft"), helper.make_node("Relu", ["h"], ["y"])]
    )
    assert operator_domains(fused.SerializeToString()) == {"ai.onnx", "com.microsoft"}
    # a contrib operator inside an If's branch, and a node of a model-local function
    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))
    branching = _model([cond, helper.make_node("If", ["c"], ["y"], then_branch=_branch("Relu"),
                                               else_branch=_branch("FastGelu", "com.microsoft"))])  # fmt: skip
    assert operator_domains(branching.SerializeToString()) == {"ai.onnx", "com.microsoft"}
    inner = helper.make_function("custom", "Twice", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
                                 [helper.make_opsetid("", 17)])  # fmt: skip
    calling = _model([helper.make_node("Twice", ["x"], ["y"], domain="custom")], functions=[inner])
    assert operator_domains(calling.SerializeToString()) == {"ai.onnx", "custom"}
    with pytest.raises(Malformed):
        operator_domains(b"\x3a\xff\xff")  # the graph field longer than the message


def test_standard_only_reads_a_file_and_names_one_it_cannot(tmp_path):
    path = tmp_path / "g.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])]), str(path))
    assert standard_only(path)
    onnx.save(_model([helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")]), str(path))
    assert not standard_only(path)
    path.write_bytes(b"\x3a\xff\xff")
    with pytest.raises(EdgeattnError, match="not a readable ONNX graph"):
        standard_only(path)


@pytest.fixture
def openvino_here(monkeypatch, built_in_providers):
    """OpenVINO taken as running here, CUDA as absent (the sessions made fall back to the CPU
    provider in an onnxruntime without OpenVINO; the choice is what is tested)."""
    built_in_providers(OPENVINO, CPU)
    monkeypatch.setattr(engines, "openvino_usable", lambda device="CPU": True)


def test_the_rule_in_order(tmp_path, monkeypatch, openvino_here, built_in_providers):

    plain, fused = tmp_path / "plain.onnx", tmp_path / "fused.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])]), str(plain))
    onnx.save(_model([helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")]), str(fused))
    for graph in ("encoder", "attention"):
        chosen = choose_engine(ENCODER_FAMILY.graphs[graph], plain)
        assert chosen.providers == (OPENVINO_AUTO, CPU) and not chosen.requested
        assert chosen.name == f"{OPENVINO} (precision_hint=f32)"  # float32, never OpenVINO's bf16 default on AMX
    said = {
        "generates": choose_engine(SEQ2SEQ_FAMILY.graphs["encoder"], plain, generates=True),
        "decoder": choose_engine(SEQ2SEQ_FAMILY.graphs["decoder"], plain, generates=True),
        "fused": choose_engine(ENCODER_FAMILY.graphs["encoder"], fused),
        "cache": choose_engine(ENCODER_FAMILY.graphs["encoder"], plain, ort_cache=True),
    }
    assert all(choice.providers == (CPU,) for choice in said.values())
    assert "decoder steps" in said["generates"].reason and "decoder steps" in said["decoder"].reason
    assert "ONNX Runtime's own operators" in said["fused"].reason and "--static-form plain" in said["fused"].reason
    assert "optimized_cache" in said["cache"].reason
    monkeypatch.setattr(engines, "openvino_usable", lambda device="CPU": False)
    assert "onnxruntime-openvino" in choose_engine(ENCODER_FAMILY.graphs["encoder"], plain).reason

    def loads_the_plugin(device: str = "CPU") -> bool:
        raise AssertionError("asked whether OpenVINO runs (which loads its plugin) for a graph it never runs")

    monkeypatch.setattr(engines, "openvino_usable", loads_the_plugin)  # a decoder or a generating export's graph
    assert choose_engine(SEQ2SEQ_FAMILY.graphs["decoder"], plain, generates=True).providers == (CPU,)
    assert choose_engine(SEQ2SEQ_FAMILY.graphs["encoder"], plain, generates=True).providers == (CPU,)
    built_in_providers(CUDA, OPENVINO, CPU)
    assert choose_engine(ENCODER_FAMILY.graphs["encoder"], plain).providers == (CUDA, CPU)


@pytest.fixture(scope="module")
def exports(shared_export):
    """The tiny model's encoder graphs alone (fp32 and int8), and all its graphs."""
    return {"encoder": shared_export("tiny", graphs=["attention", "encoder"], precisions=["int8"]),
            "all": shared_export("tiny")}  # fmt: skip


@pytest.mark.filterwarnings("ignore:Specified provider 'OpenVINOExecutionProvider'")  # the stock onnxruntime's
def test_load_chooses_each_graph_and_logs_why(exports, openvino_here, caplog):
    with caplog.at_level(logging.INFO, logger="edgeattn.runtime.exported_model"):
        model = load(exports["encoder"])
    assert {graph: engine.providers for graph, engine in model.engines.items()} == {
        "attention": (OPENVINO_AUTO, CPU), "encoder": (OPENVINO_AUTO, CPU)}  # fmt: skip
    assert sum("graph on" in r.getMessage() for r in caplog.records) == 2  # one line each, with its reason
    int8 = load(exports["encoder"], precision="int8")
    assert all(engine.providers == (CPU,) for engine in int8.engines.values())  # ONNX Runtime's QAttention inside
    generating = load(exports["all"])
    assert {engine.providers for engine in generating.engines.values()} == {(CPU,)}
    asked = load(exports["encoder"], providers=[CPU])
    assert all(engine.requested and engine.providers == (CPU,) for engine in asked.engines.values())


@pytest.mark.skipif(openvino_usable() or CUDA in __import__("onnxruntime").get_available_providers(),
                    reason="OpenVINO or CUDA runs here")  # fmt: skip
def test_without_openvino_or_cuda_every_graph_runs_on_the_cpu_provider(exports):
    model = load(exports["encoder"])
    assert model.providers == [CPU]
    assert {engine.providers for engine in model.engines.values()} == {(CPU,)}
    assert all("OpenVINO does not run here" in engine.reason for engine in model.engines.values())


@pytest.mark.skipif(not openvino_usable(), reason="needs OpenVINO that runs on this CPU")
def test_openvino_chosen_runs_the_encoder_in_float32(exports, tiny_config, tmp_path):
    """Where OpenVINO really runs, the graphs it is chosen for run on it, to within 1e-4 of ONNX
    Runtime's CPU provider; a cache of ONNX Runtime's optimised graphs is refused with OpenVINO."""
    ids = np.random.default_rng(0).integers(4, tiny_config.vocab_size, (2, 11)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    model = load(exports["encoder"], threads=2)
    assert model.sessions["encoder"].get_providers()[0] == OPENVINO
    reference = load(exports["encoder"], providers=[CPU]).encode(ids, mask)
    real = mask.astype(bool)
    np.testing.assert_allclose(model.encode(ids, mask)[real], reference[real], atol=1e-4)
    with pytest.raises(EdgeattnError, match="leave optimized_cache out"):
        create_session(exports["encoder"] / "encoder.onnx", providers=[OPENVINO], optimized_cache=tmp_path / "c")


# ------------------------------------------------------------------ bf16: a precision OpenVINO brings
def test_bf16_is_refused_where_openvino_cannot_run_it_as_asked(tmp_path, monkeypatch):
    """bf16 is gated through OpenVINO: where OpenVINO does not run, or the CPU has no bfloat16
    instructions (OpenVINO would quietly run float32), the export says so and writes nothing."""
    from edgeattn.errors import ExportError

    model = build_model(get_preset("tiny"), seed=0)
    monkeypatch.setattr(engines, "why_unavailable", lambda name: f"{name} is not installed (test)")
    with pytest.raises(ExportError, match="cannot be made and gated here: OpenVINOExecutionProvider is not installed"):
        export_model(model, tmp_path / "a", graphs=["encoder"], verify=False, precisions=["bf16"])
    monkeypatch.setattr(engines, "why_unavailable", lambda name: None)
    monkeypatch.setattr(engines, "has_bf16", lambda: False)
    with pytest.raises(ExportError, match="no bfloat16 instructions"):
        export_model(model, tmp_path / "b", graphs=["encoder"], verify=False, precisions=["bf16"])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.filterwarnings("ignore:Specified provider 'OpenVINOExecutionProvider'")  # the stock onnxruntime's
def test_bf16_graphs_are_the_fp32_graphs_and_load_on_openvino_only(tmp_path, monkeypatch, caplog):
    """A bf16 export holds the fp32 graphs again (their weights in the checkpoint, stored once), and
    loads on OpenVINO with the bf16 hint; where OpenVINO cannot run, loading it is an error that
    says why, and on a provider named by the caller it runs in float32, with a warning."""
    import onnxruntime as ort

    from edgeattn.runtime.engines import engine_unavailable
    from edgeattn.runtime.precisions import get_precision

    bf16 = get_precision("bf16")
    with monkeypatch.context() as patch:  # taken as running here (sessions fall back to the CPU provider)
        patch.setattr(ort, "get_available_providers", lambda: [OPENVINO, CPU])
        patch.setattr(providers, "_registered", set())
        patch.setattr(engines, "has_bf16", lambda: True)
        out = tmp_path / "out"
        export_model(build_model(get_preset("tiny"), seed=0), out, graphs=["encoder"], verify=False,
                     precisions=["bf16"])  # fmt: skip
        model = load(out, precision="bf16")
        assert model.engines["encoder"].providers == (bf16.engine_provider, CPU)
        assert dict(bf16.engine_options)["precision_hint"] == "bf16"
    manifest = json.loads((out / "manifest.json").read_text())
    variant = manifest["graphs"]["encoder"]["precisions"]["bf16"]
    assert variant["source"] == "fp32" and variant["bytes"] < 200_000  # the graph alone: weights stay shared
    if engine_unavailable(bf16) is not None:
        with pytest.raises(EdgeattnError, match="the bf16 graphs are .* cannot run here"):
            load(out, precision="bf16")
    with caplog.at_level(logging.WARNING, logger="edgeattn.runtime.exported_model"):
        load(out, precision="bf16", providers=[CPU])
    assert "on CPUExecutionProvider they run in float32" in caplog.text


@pytest.mark.skipif(not openvino_usable() or not has_bf16(),
                    reason="needs OpenVINO on a CPU with bfloat16 instructions")  # fmt: skip
def test_bf16_passes_the_gate_and_runs_in_bfloat16_on_openvino(tmp_path, tiny_config):
    out = tmp_path / "out"
    result = export_model(build_model(get_preset("tiny"), seed=0), out, precisions=["bf16"])
    assert result.gates["bf16"].passed
    ids = np.random.default_rng(0).integers(4, tiny_config.vocab_size, (2, 11)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    model = load(out, precision="bf16", threads=2)
    assert {engine.providers[0][0] for engine in model.engines.values()} == {OPENVINO}
    reference = load(out, providers=[CPU]).encode(ids, mask)
    real = mask.astype(bool)
    a, b = model.encode(ids, mask)[real], reference[real]
    cosine = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert cosine.min() > 0.9999 and np.abs(a - b).max() > 1e-5  # bfloat16 really ran
    assert model.generate(ids, mask, max_new_tokens=4) is not None  # the decoders compile in bf16 too
