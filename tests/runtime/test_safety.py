"""Hostile export directories: whoever controls the directory controls its hashes, so every
file the manifest or a graph names is checked for where it leads before anything opens it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeattn.config import ModelConfig
from edgeattn.exporters.export import export_model
from edgeattn.model import build_model
from edgeattn.runtime import ExportedModel, ManifestError, UnsafeFileError, load, read_manifest
from edgeattn.runtime.manifest import DataFile, sha256_file
from edgeattn.runtime.onnx_bytes import external_data_entries

pytestmark = pytest.mark.quick

ENC = ModelConfig(architecture="encoder", vocab_size=50, d_model=32, n_heads=4, d_ff=48, n_encoder_layers=2,
                  n_decoder_layers=0, max_len=40, dropout=0.0, position="learned", scale_embedding=False)  # fmt: skip


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """An encoder export whose graph keeps its weights in external data (encoder.onnx.data)."""
    out = tmp_path_factory.mktemp("safety") / "export"
    export_model(build_model(ENC, seed=0), out, graphs=["encoder"], verify=False, external_threshold=0, compact=False)
    assert (out / "encoder.onnx.data").is_file()
    return out


@pytest.fixture
def export(tmp_path, pristine) -> Path:
    """A fresh copy of the export, inside ``tmp_path / "box"`` so that ``tmp_path`` is outside it."""
    box = tmp_path / "box"
    shutil.copytree(pristine, box)
    load(box)  # the untouched copy loads
    return box


def rehash(export: Path) -> None:
    """Rewrite the manifest's sums and sizes to match the files, as someone holding the directory can."""
    manifest = read_manifest(export)
    entry = manifest.graphs["encoder"]
    path = export / entry.file if not Path(entry.file).is_absolute() else Path(entry.file)
    entry.sha256, entry.bytes = sha256_file(path), path.stat().st_size
    for data in entry.external_data:
        where = export / data.file
        if where.exists():
            data.sha256, data.bytes = sha256_file(where), where.stat().st_size
    manifest.write(export)


def rename_graph(export: Path, name: str) -> None:
    manifest = read_manifest(export)
    manifest.graphs["encoder"].file = name
    manifest.write(export)


def edit_external(graph: Path, edit) -> None:
    """Apply ``edit(entries: dict)`` to every external-data entry of ``graph``, in place."""
    model = onnx.load(str(graph), load_external_data=False)
    for tensor in model.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            edit(entries)
            del tensor.external_data[:]
            for key, value in entries.items():
                tensor.external_data.add(key=key, value=value)
    graph.write_bytes(model.SerializeToString())


@pytest.mark.parametrize("where", ["parent", "absolute", "subfolder"])
def test_a_manifest_naming_a_file_outside_the_export_is_refused(export, where):
    outside = export.parent / "outside.onnx"
    shutil.copy(export / "encoder.onnx", outside)
    names = {"parent": "../outside.onnx", "absolute": str(outside), "subfolder": "sub/encoder.onnx"}
    if where == "subfolder":
        (export / "sub").mkdir()
        shutil.copy(export / "encoder.onnx", export / "sub" / "encoder.onnx")
    rename_graph(export, names[where])
    rehash(export)
    with pytest.raises(UnsafeFileError, match="is not a plain file name inside the directory"):
        load(export)


def test_graph_and_manifest_links_are_refused(export, tmp_path):
    copy = tmp_path / "elsewhere.onnx"
    shutil.move(export / "encoder.onnx", copy)
    (export / "encoder.onnx").symlink_to(copy)
    with pytest.raises(UnsafeFileError, match="encoder.onnx is a symbolic link"):
        load(export)
    (export / "encoder.onnx").unlink()
    os.link(copy, export / "encoder.onnx")  # a hard link: the same file outside the export
    with pytest.raises(UnsafeFileError, match="has 2 hard links"):
        load(export)
    (export / "encoder.onnx").unlink()
    shutil.copy(copy, export / "encoder.onnx")
    shutil.move(export / "manifest.json", tmp_path / "manifest.json")
    (export / "manifest.json").symlink_to(tmp_path / "manifest.json")
    with pytest.raises(UnsafeFileError, match="manifest.json is a symbolic link"):
        read_manifest(export)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda e: e.update(location="../stolen.data"), "is not a plain file name"),
        (lambda e: e.update(location="/etc/hostname"), "is not a plain file name"),
        (lambda e: e.update(location="extra.data"), "which the manifest does not list"),
        (lambda e: e.update(location="link.data"), "link.data is a symbolic link"),
        (lambda e: e.update(location="null"), "null is a symbolic link"),
        (lambda e: e.update(location="hard.data"), "hard.data has 2 hard links"),
        (lambda e: e.update(location="fifo"), "fifo is not a regular file"),
        (lambda e: e.update(offset=str(10**9)), "past the end of the file"),
        (lambda e: e.update(length="-5"), "past the end of the file"),
        (lambda e: e.update(offset="x"), "non-integer offset"),
    ],
)
def test_hostile_external_data_is_refused_before_onnx_runtime_opens_it(export, tmp_path, monkeypatch, edit, message):
    data = export / "encoder.onnx.data"
    shutil.copy(data, tmp_path / "stolen.data")
    shutil.copy(data, export / "extra.data")
    (export / "link.data").symlink_to(tmp_path / "stolen.data")
    (export / "null").symlink_to("/dev/null")
    os.link(tmp_path / "stolen.data", export / "hard.data")  # the same file as one outside the export
    os.mkfifo(export / "fifo")  # a special file: reading it would block
    edit_external(export / "encoder.onnx", edit)
    rehash(export)
    opened = []
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "InferenceSession", lambda *a, **k: opened.append(a))
    with pytest.raises(UnsafeFileError, match=message) as info:
        load(export)
    assert "encoder.onnx: tensor" in str(info.value) or "encoder.onnx keeps data" in str(info.value)
    assert not opened  # ONNX Runtime never saw the graph


def test_graphs_held_in_memory_may_not_keep_external_data(pristine):
    graph = (pristine / "encoder.onnx").read_bytes()
    with pytest.raises(UnsafeFileError, match="a graph held in memory has no directory"):
        ExportedModel.from_graphs(ENC, {"encoder": graph})


def test_the_protobuf_reader_finds_what_onnx_finds(tmp_path):
    """Initialisers, a Constant node's tensor and a tensor inside an If branch, all kept outside."""
    big = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8), "w")
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones((8, 8), np.float32), "cv"))
    inner = helper.make_graph([helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(
        np.full((8, 8), 2.0, np.float32), "bv"))], "branch", [],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [8, 8])])  # fmt: skip
    nodes = [const, helper.make_node("MatMul", ["x", "w"], ["y0"]), helper.make_node("Add", ["y0", "c"], ["y1"]),
             helper.make_node("If", ["cond"], ["z"], then_branch=inner, else_branch=inner),
             helper.make_node("Add", ["y1", "z"], ["y"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])], [big],
    )  # fmt: skip
    model = helper.make_model(graph)
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0, convert_attribute=True)  # fmt: skip
    loaded = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    from onnx.external_data_helper import _get_all_tensors

    def key(entry: tuple[str, dict[str, str]]) -> tuple:
        return entry[0], sorted(entry[1].items())

    want = sorted(((t.name, {e.key: e.value for e in t.external_data}) for t in _get_all_tensors(loaded)
                   if t.data_location == TensorProto.EXTERNAL), key=key)  # fmt: skip
    got = sorted(external_data_entries((tmp_path / "m.onnx").read_bytes()), key=key)
    assert len(want) == 4 and got == want
    with pytest.raises(ValueError):
        external_data_entries(b"\x0a\xff\xff")  # a field longer than the message


def test_a_truncated_graph_is_a_manifest_error_not_a_crash(export):
    graph = export / "encoder.onnx"
    graph.write_bytes(graph.read_bytes()[:-7])
    rehash(export)
    with pytest.raises(ManifestError):
        load(export)


def test_the_cli_refuses_in_one_line(export, tmp_path):
    rename_graph(export, "../outside.onnx")
    shutil.copy(export / "encoder.onnx", tmp_path / "outside.onnx")
    rehash(export)
    result = subprocess.run([sys.executable, "-m", "edgeattn.cli", "run", str(export), "1 2 3"], capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "not a plain file name" in result.stderr


def test_data_file_entries_outside_the_export_are_refused(export, tmp_path):
    manifest = read_manifest(export)
    data = manifest.graphs["encoder"].external_data[0]
    shutil.copy(export / data.file, tmp_path / "copy.data")
    manifest.graphs["encoder"].external_data = [DataFile(file="../copy.data", sha256=data.sha256, bytes=data.bytes)]
    manifest.write(export)
    with pytest.raises(UnsafeFileError, match="'../copy.data' is not a plain file name"):
        load(export)


def test_files_that_are_not_what_they_claim_are_named(tmp_path, export):
    from edgeattn.runtime import TokenizerError
    from edgeattn.runtime.tokenizer import load_tokenizer

    for text, message in {'{"not": "a tokenizer"}': "neither an edgeattn word tokenizer nor a Hugging Face",
                          "garbage": "cannot read tokenizer", "": "cannot read tokenizer"}.items():  # fmt: skip
        (tmp_path / "tokenizer.json").write_text(text)
        with pytest.raises(TokenizerError, match=message):
            load_tokenizer(tmp_path / "tokenizer.json")
    (export / "manifest.json").write_text("[1, 2]")
    with pytest.raises(ManifestError, match="must hold a JSON object"):
        load(export)
    (export / "encoder.onnx").write_bytes(b"")
    from edgeattn.runtime.safety import check_external_data

    with pytest.raises(ManifestError, match="is empty, not an ONNX graph"):
        check_external_data(export / "encoder.onnx")
