"""The mobile target (``edgeattn package --target mobile``): ORT-format files that load with ONNX
Runtime's optimisation off and on, a reduced-build config that names every kernel they ask for,
and answers equal to the export's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

import edgeattn.exporters.mobile as mobile
from edgeattn.cli import cli
from edgeattn.errors import ExportError
from edgeattn.exporters.export import export_model
from edgeattn.exporters.mobile import CONFIG, package_mobile
from edgeattn.runtime import load
from edgeattn.runtime.manifest import sha256_file
from edgeattn.sources import resolve_model


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """The demo sorter exported at fp32, int8 and int8-static (every graph of the seq2seq family)."""
    out = tmp_path_factory.mktemp("mobile") / "sorter"
    source = resolve_model()
    export_model(source.model, out, precisions=["int8", "int8-static"], verify=False, tokenizer=source.tokenizer,
                 task=source.task)  # fmt: skip
    return out


@pytest.fixture(scope="module")
def bundle(demo, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "phone"
    return out, package_mobile(demo, out)


def _kernels_loaded(path: Path, level: ort.GraphOptimizationLevel, work: Path) -> set[str]:
    """What ONNX Runtime's session asks for when it loads ``path`` at ``level``, read back by its
    own tools (independently of the packager's code)."""
    from onnxruntime.tools.ort_format_model import create_config_from_models
    from onnxruntime.tools.reduced_build_config_parser import parse_config

    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.add_session_config_entry("session.save_model_format", "ORT")
    options.optimized_model_filepath = str(work / f"{path.stem}.{int(level)}.ort")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                         disabled_optimizers=["NchwcTransformer"])  # fmt: skip
    create_config_from_models([Path(options.optimized_model_filepath)], work / "one.config", False)
    required, _ = parse_config(str(work / "one.config"), False)
    return {f"{d};{v};{op}" for d, by in required.items() for v, ops in by.items() for op in ops}


def test_every_graph_and_cpu_precision_is_an_ort_file_whose_kernels_the_config_names(bundle, demo, tmp_path):
    from onnxruntime.tools.reduced_build_config_parser import parse_config

    out, result = bundle
    graphs = ["attention", "encoder", "cross_kv", "decoder", "decoder_fixed"]
    assert {(f.graph, f.precision) for f in result.files} == {(g, p) for g in graphs
                                                              for p in ("fp32", "int8", "int8-static")}  # fmt: skip
    described = json.loads((out / "bundle.json").read_text())
    assert {p.name for p in out.iterdir()} == {"bundle.json", CONFIG, "tokenizer.json", *(f.file for f in result.files)}
    required, _ = parse_config(str(out / CONFIG), True)  # ONNX Runtime's parser reads it, types and all
    configured = {f"{d};{v};{op}" for d, by in required.items() for v, ops in by.items() for op in ops}
    for f in described["files"]:
        path = out / f["file"]
        assert path.read_bytes()[4:8] == b"ORTM"  # the ORT format's FlatBuffers identifier
        # float32 as the export computes it; a reduced precision by the package's own measure (its
        # quantised embedding's lookup runs another kernel in the ORT format: 1.9e-3 apart at most)
        assert f["sha256"] == sha256_file(path) and f["passed"] and f["max_abs"] < (1e-4 if f["precision"] == "fp32"
                                                                                  else 5e-3), f  # fmt: skip
        for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
            asked = _kernels_loaded(path, level, tmp_path)
            assert asked <= configured, (f["file"], level, asked - configured)
    assert described["graphs"]["decoder"]["inputs"][0]["name"] == "input_ids"
    assert described["operator_config"]["kernels"] == len(configured)


def test_the_ort_files_answer_as_the_runtime_does(bundle, demo):
    """The encoder's ORT file, run the way an app would, gives the hidden states the Python
    runtime gives for the same tokens (a padded batch), at fp32 and int8."""
    out, _ = bundle
    ids = np.array([[5, 3, 4, 0, 0, 0], [12, 11, 10, 9, 8, 7]], np.int64)
    mask = (np.arange(6) < np.array([[3], [6]])).astype(np.int64)
    for precision, file in (("fp32", "encoder.ort"), ("int8", "encoder.int8.ort")):
        session = ort.InferenceSession(str(out / file), providers=["CPUExecutionProvider"])
        got = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask})[0]
        want = load(demo, providers=["CPUExecutionProvider"], precision=precision).encode(ids, mask)
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_kernels_only_a_load_asks_for_are_recorded_and_configured(bundle, tmp_path):
    """What a session leaves after loading a file is read back, and a kernel it holds that the file
    does not is named and written into the config (here the session's graph is stood in for by
    another graph's file: ONNX Runtime 1.32 applies no optimisation of its own to a fixed-style
    ORT file, so a real load adds none)."""
    out, _ = bundle
    work = tmp_path / "b"
    work.mkdir()
    for name in ("encoder.int8.ort", "decoder.int8.ort"):
        (work / name).write_bytes((out / name).read_bytes())
    files = [mobile.OrtFile("encoder.int8.ort", "encoder", "int8", "", 0, [], [], 0.0, 1.0, 0, True)]
    result = mobile.MobileBundle(work, files)
    mobile._write_config(work, result, {"encoder.int8.ort": [work / "encoder.int8.ort", work / "decoder.int8.ort"]})
    own = mobile._operators([work / "encoder.int8.ort"], tmp_path)
    added = result.files[0].runtime_added
    assert added and not set(added) & own
    assert set(added) <= mobile._configured(work / CONFIG)


def test_a_bundle_that_answers_differently_is_refused_and_nothing_is_written(demo, tmp_path, monkeypatch):
    real = mobile.create_session

    class Off:  # the export's encoder answering 1e-3 away from its ORT file
        def __init__(self, session):
            self.session = session

        def run(self, names, feeds):
            return [o + np.float32(1e-3) if o.dtype == np.float32 else o for o in self.session.run(names, feeds)]

    def create_session(path, *args, **kwargs):
        session = real(path, *args, **kwargs)
        return Off(session) if Path(path).name == "encoder.onnx" else session

    monkeypatch.setattr(mobile, "create_session", create_session)
    out = tmp_path / "phone"
    with pytest.raises(ExportError, match=r"do not answer as the export does(.|\n)*encoder\.ort .* FAIL"):
        package_mobile(demo, out, ["fp32"])
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_command_line_and_its_refusals(demo, tmp_path):
    runner = CliRunner()
    out = tmp_path / "phone"
    result = runner.invoke(cli, ["package", str(demo), "--target", "mobile", "-o", str(out), "--precision", "int8"])
    assert result.exit_code == 0, result.output
    assert "encoder.int8.ort" in result.output and f"wrote {out} (mobile: 5 files" in result.output
    again = runner.invoke(cli, ["package", str(demo), "--target", "mobile", "-o", str(out)])
    assert again.exit_code == 1 and "not empty; choose another or pass --force" in again.output
    missing = runner.invoke(cli, ["package", str(demo), "--target", "mobile", "-o", str(tmp_path / "x"),
                                  "--precision", "int4"])  # fmt: skip
    assert missing.exit_code == 1 and "holds no 'int4' graphs" in missing.output
    assert "Traceback" not in missing.output + again.output


def test_packaging_needs_no_torch(demo, tmp_path):
    from tests.helpers.torch_free import run_without_torch

    run_without_torch("from edgeattn.exporters.mobile import package_mobile\n"
                      f"package_mobile({str(demo)!r}, {str(tmp_path / 'phone')!r}, ['int8'])\n")  # fmt: skip
    assert (tmp_path / "phone" / "encoder.int8.ort").is_file()


def test_a_4_bit_embedding_table_becomes_8_bit_values_with_the_same_answers(tmp_path):
    """An int4 encoder's large embedding table (GatherBlockQuantized over signed 4-bit values):
    ONNX Runtime writes it into an ORT file it then cannot load, so the bundle holds its values
    as int8 with the same scales, answering exactly as the export's int4 graph."""
    from dataclasses import replace

    import onnx

    from edgeattn.config import get_preset
    from edgeattn.exporters.mobile import eight_bit_tables
    from edgeattn.model import build_model

    config = replace(get_preset("bert-base"), d_model=64, n_heads=2, d_ff=128, n_encoder_layers=1, max_len=64)
    export_model(build_model(config, seed=0), tmp_path / "int4", graphs=["encoder"], precisions=["int4"], verify=False)
    graph = onnx.load(str(tmp_path / "int4" / "encoder.int4.onnx"))
    assert any(n.op_type == "GatherBlockQuantized" for n in graph.graph.node)  # 30,522 x 64: a large table
    assert eight_bit_tables(graph) == 1 and not any(n.op_type == "GatherBlockQuantized" for n in graph.graph.node)
    bundle = package_mobile(tmp_path / "int4", tmp_path / "mobile", ["int4"])
    (found,) = bundle.files
    assert found.passed and found.max_abs == 0.0, found  # the same products as the 4-bit node's
