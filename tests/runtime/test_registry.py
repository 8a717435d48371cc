"""The precision registry, the export layout, the typed manifest, the host facts and the
sensitive-node search: the shared pieces the exporters, runtime, CLI and benchmark read."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from edgeattn.config import ModelConfig
from edgeattn.errors import ExportError
from edgeattn.exporters.sensitivity import Trial, search_sensitive
from edgeattn.host import dynamic_int8_weights, has_bf16
from edgeattn.runtime.layout import external_data_file, graph_file
from edgeattn.runtime.manifest import FileEntry, Manifest, ManifestError, read_manifest
from edgeattn.runtime.precisions import (
    FP32,
    PRECISIONS,
    PrecisionError,
    Thresholds,
    Verdict,
    float32_precisions,
    get_precision,
    markdown_table,
    parse_precisions,
    thresholds_table,
)

pytestmark = pytest.mark.quick

PRECISIONS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "precisions.md"
CFG = ModelConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1, max_len=16)


# ----------------------------------------------------------------------------------- registry
def test_every_converted_precision_has_a_converter_and_every_converter_a_record():
    from edgeattn.exporters.quantize import converter

    converted = {p.name for p in PRECISIONS.values() if p.build == "convert"}
    assert converted == {p.name for p in PRECISIONS.values() if p.converter is not None}
    assert all(callable(converter(name)) for name in converted)
    with pytest.raises(ValueError, match="not made by a converter"):
        converter(FP32)
    assert [p.name for p in PRECISIONS.values() if p.build == "export"] == [FP32]
    for p in PRECISIONS.values():
        assert (p.form is None) == (p.build in ("export", "engine")), p.name
        assert p.gated == (p.name != FP32), p.name


def test_parse_precisions_orders_by_registry_and_names_unknown_ones():
    assert parse_precisions(["int4", " int8 ", "", "fp32-opt"]) == ["fp32", "fp32-opt", "int8", "int4"]
    assert parse_precisions(None) == ["fp32"]
    with pytest.raises(PrecisionError, match="unknown precision 'int3'; choose from fp32, fp32-opt") as info:
        parse_precisions(["int3"])
    assert isinstance(info.value, ExportError)
    assert float32_precisions() == ["fp32", "fp32-opt"]


def test_thresholds_give_verdicts_as_values():
    t = get_precision("int8").thresholds
    verdicts = t.verdicts({"encoder": {"cosine_mean": 0.5, "cosine_min": 0.99, "logits_cosine_mean": 0.1}})
    assert verdicts == [Verdict("encoder", "cosine_mean", 0.5, 0.999)]
    assert str(verdicts[0]) == "encoder cosine_mean 0.50000 < 0.999"
    assert t.limit("logits_cosine_mean") is None and isinstance(t, Thresholds)


def test_the_manuals_tables_are_the_registrys():
    text = PRECISIONS_PAGE.read_text(encoding="utf-8")
    assert markdown_table() in text
    assert thresholds_table() in text


def test_cli_choices_and_help_come_from_the_registry():
    from click.testing import CliRunner

    from edgeattn.cli import cli

    runner = CliRunner()
    export_help = runner.invoke(cli, ["export", "--help"]).output
    assert ",".join(PRECISIONS) in export_help.replace("\n", "").replace(" ", "")
    bad = runner.invoke(cli, ["verify", "x", "--precision", "int8"])
    assert bad.exit_code == 2 and "'fp32', 'fp32-opt'" in bad.output


# ------------------------------------------------------------------------------------- layout
def test_layout_names_every_file():
    assert graph_file("encoder") == "encoder.onnx"
    assert graph_file("decoder", "int8-static") == "decoder.int8-static.onnx"
    assert external_data_file("encoder.onnx") == "encoder.onnx.data"
    with pytest.raises(PrecisionError):
        graph_file("encoder", "int3")


# ----------------------------------------------------------------------------------- manifest
def _manifest_json(tmp_path: Path) -> dict:
    (tmp_path / "encoder.onnx").write_bytes(b"graph")
    m = Manifest(edgeattn_version="0.1.0", created="now", source="test", config=CFG)
    from edgeattn.runtime.manifest import GraphEntry
    from edgeattn.runtime.specs import graph_spec

    m.graphs["encoder"] = GraphEntry.of_spec(tmp_path / "encoder.onnx", graph_spec("encoder", CFG), 17)
    return m.to_json()


def test_manifest_round_trips_through_json(tmp_path):
    data = _manifest_json(tmp_path)
    manifest = Manifest.from_json(json.loads(json.dumps(data)))
    assert manifest.to_json() == data
    assert manifest.config == CFG and manifest.gates == {} and manifest.greedy_parity is None
    entry = manifest.entry("encoder")
    assert entry.total_bytes == 5 and entry.sha256 and entry.file == "encoder.onnx"
    with pytest.raises(ManifestError, match=r"not exported at precision 'int8' \(it has fp32\)"):
        manifest.entry("encoder", "int8")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format_version=2), "has format_version 2; this edgeattn reads version 1"),
        (lambda d: d.pop("config"), "top level lacks 'config'"),
        (lambda d: d["graphs"]["encoder"].pop("sha256"), "graphs.encoder lacks 'sha256'"),
        (lambda d: d["graphs"]["encoder"].update(bytes="5"), "graphs.encoder.bytes must be an integer, got '5'"),
        (lambda d: d["graphs"]["encoder"].update(opset=True), "graphs.encoder.opset must be an integer"),
        (lambda d: d["graphs"]["encoder"]["inputs"][0].update(shape="batch"), r"inputs.0.shape must be a list"),
        (lambda d: d["config"].update(d_model="big"), "config is not a valid model config"),
        (lambda d: d.update(graphs={}), "lists no graphs"),
        (lambda d: d.update(gates={"int8": {"metrics": {}}}), "gates.int8 lacks 'thresholds'"),
        (lambda d: d.update(weights=[1]), "weights must be an object"),
    ],
)
def test_manifest_validation_names_the_first_problem(tmp_path, change, message):
    data = copy.deepcopy(_manifest_json(tmp_path))
    change(data)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=message):
        read_manifest(tmp_path)


def test_manifest_reads_gate_failures_written_as_text_before_verdicts(tmp_path):
    data = _manifest_json(tmp_path)
    data["gates"] = {"int8": {"metrics": {"encoder": {"cosine_mean": 0.5}}, "thresholds": {"cosine_mean": 0.999},
                              "passed": False, "failures": ["encoder cosine_mean 0.50000 < 0.999"],
                              "degraded": True}}  # fmt: skip
    gate = Manifest.from_json(data).gates["int8"]
    assert gate.failures == [Verdict("encoder", "cosine_mean", 0.5, 0.999)]
    data["gates"]["int8"]["failures"] = ["encoder is bad"]
    with pytest.raises(ManifestError, match="gates.int8.failures.0 is not a gate verdict"):
        Manifest.from_json(data)


def test_file_entry_counts_external_data(tmp_path):
    (tmp_path / "g.onnx").write_bytes(b"12")
    (tmp_path / "g.onnx.data").write_bytes(b"12345")
    entry = FileEntry.describe(tmp_path / "g.onnx")
    assert entry.bytes == 2 and entry.total_bytes == 7 and entry.external_data[0].file == "g.onnx.data"


# --------------------------------------------------------------------------------------- host
def test_dynamic_int8_weights_are_unsigned_without_vnni():
    assert dynamic_int8_weights(["avx2", "fma"]) == "uint8"
    assert dynamic_int8_weights(["avx512f", "avx512_vnni"]) == "int8"
    assert dynamic_int8_weights(["amx_int8"]) == "int8"


def test_bf16_is_native_with_amx_or_avx512_bf16_only():
    """Eager bf16 autocast and OpenVINO's bf16 hint are timed where bf16 is not emulated."""
    assert has_bf16(["avx512f", "avx512_vnni", "avx512_bf16"]) and has_bf16(["amx_tile", "amx_bf16"])
    assert not has_bf16(["avx2", "fma"]) and not has_bf16(["avx512f", "avx512_vnni"])


# -------------------------------------------------------------------------------- sensitivity
def test_search_ranks_nodes_by_damage_alone_and_keeps_the_fewest_that_pass():
    damage = {"a": 0.01, "b": 0.30, "c": 0.05, "d": 0.20}  # quantising a node costs this much
    calls: list[list[str]] = []

    def trial(exclude: list[str]) -> Trial[str]:
        calls.append(exclude)
        loss = sum(v for k, v in damage.items() if k not in exclude)
        return Trial(",".join(sorted(exclude)), {"cosine": 1.0 - loss}, loss < 0.1)

    found = search_sensitive({k: [k] for k in damage}, trial)
    assert found.excluded == ["b", "d"] and found.trial.candidate == "b,d" and found.trial.passed
    assert found.trials == len(calls) == 4 + 2
    assert max(found.scores, key=found.scores.get) == "b"


def test_search_keeps_every_node_when_nothing_passes():
    found = search_sensitive({"x": ["x"], "y": ["y"]}, lambda exclude: Trial(len(exclude), {"m": 0.0}, False))
    assert found.excluded == ["x", "y"] and found.trial.candidate == 2 and not found.trial.passed
    with pytest.raises(ValueError):
        search_sensitive({}, lambda exclude: Trial(0, {}, True))


def test_nodes_are_grouped_by_layer_into_a_bounded_number_of_groups():
    from edgeattn.exporters.sensitivity import group_nodes

    weights = {f"n{i}_{p}": f"layers.{i}.attn.{p}.weight.T" for i in range(30) for p in ("qkv", "o")}
    weights |= {"head": "lm_head.weight.T", "table": "embed.weight"}
    groups = group_nodes(weights, max_groups=12)
    assert len(groups) <= 12 and groups["lm_head"] == ["head"] and groups["embed"] == ["table"]
    assert groups["layers 0-2"] == ["n0_qkv", "n0_o", "n1_qkv", "n1_o", "n2_qkv", "n2_o"]
    assert sorted(n for g in groups.values() for n in g) == sorted(weights)


def test_search_stops_at_its_time_budget_with_its_best_so_far(monkeypatch):
    from edgeattn.exporters import sensitivity

    clock = iter(range(0, 1000, 10))  # each trial takes 10 s
    monkeypatch.setattr(sensitivity.time, "monotonic", lambda: next(clock))
    groups = {f"g{i}": [f"n{i}"] for i in range(8)}
    found = search_sensitive(groups, lambda exclude: Trial(len(exclude), {"m": 0.5}, False), seconds=60)
    assert found.cut_short and found.trials < 8 + 8 and not found.trial.passed
    assert 0 < len(found.scores) < 8  # scoring stopped at half the budget
