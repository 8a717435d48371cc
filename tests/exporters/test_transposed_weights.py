"""A language model's precisions are quantised straight from the checkpoint: the products a graph
reads through a Transpose of a checkpoint tensor get ONNX Runtime's own levels without a
transposed float32 copy of the model."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeattn.exporters import transposed_weights
from edgeattn.exporters.export import export_model
from edgeattn.exporters.external_data import DataSink
from edgeattn.exporters.quantize import ConversionJob, plain_weights, quantize_blockwise, tied_tables
from edgeattn.exporters.transposed_weights import quantize_rows
from edgeattn.host import quiet_quantization
from edgeattn.runtime import read_manifest
from edgeattn.runtime.layout import TRANSPOSED_SUFFIX, WEIGHTS


@pytest.mark.quick
@pytest.mark.parametrize("bits,block,n,k", [(4, 32, 70, 100), (8, 32, 33, 64), (4, 64, 300, 256), (4, 128, 5, 129)])
def test_levels_are_onnx_runtimes_own(bits, block, n, k, monkeypatch):
    """Levels and scales made a band of rows at a time from an [N, K] weight are byte for byte
    those ONNX Runtime's quantiser makes from its [K, N] transpose (a last block cut short, ties)."""
    with quiet_quantization():
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            MatMulNBitsQuantizer,
        )
    rng = np.random.default_rng(bits * block + n)
    weight = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    weight[0, :4] = [0.5, -0.5, 0.25, -0.25]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              [numpy_helper.from_array(np.ascontiguousarray(weight.T), "w")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    config = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=True, bits=bits, accuracy_level=4)
    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=block, is_symmetric=True, accuracy_level=4,
                                     algo_config=config)  # fmt: skip
    with quiet_quantization():
        quantizer.process()
    theirs = {t.name: numpy_helper.to_array(t) for t in quantizer.model.model.graph.initializer}
    monkeypatch.setattr(transposed_weights, "BAND_BYTES", 4 * k * 7)  # several bands
    packed, scales = quantize_rows(weight, bits, block)
    assert np.array_equal(theirs[f"w_Q{bits}"].reshape(packed.shape), packed)
    assert np.array_equal(theirs["w_scales"].reshape(scales.shape), scales)


@pytest.mark.parametrize("name", ["llama-gqa-tied", "qwen2-biases"])
def test_a_language_model_is_quantised_from_its_checkpoint_as_from_a_folded_copy(tmp_path, monkeypatch, name):
    """int4 and int8 of an imported language model come from the checkpoint's tensors without a
    transposed float copy: byte for byte the graph ONNX Runtime's quantiser makes from a folded
    copy, the tied embedding reading the output layer's levels, and the export gated."""
    pytest.importorskip("transformers")
    from edgeattn.families.causal.hf import import_causal_folder
    from tests.helpers.causal_folders import save_folder

    folder, _ = save_folder(name, tmp_path / "folder")
    model = import_causal_folder(folder)
    written: list[tuple[str, str]] = []  # (data file, tensor) of every weight a graph writes
    put = DataSink.put
    monkeypatch.setattr(DataSink, "put", lambda self, tensor, array: written.append((self.path.name, tensor.name))
                        or put(self, tensor, array))  # fmt: skip
    out = tmp_path / "out"
    export_model(model, out, precisions=["int8", "int4"])
    fused = [t for f, t in written if "fused" in f]
    assert fused  # the fused graph the precisions come from was written, pointing at the checkpoint:
    assert not [t for t in fused if t.endswith(".weight.T") or t.startswith(("embed", "lm_head"))]
    manifest = read_manifest(out)
    assert {"int8", "int4"} <= set(manifest.gates)
    for precision in ("int8", "int4"):
        entry = manifest.entry("causal_decoder", precision)
        graph = onnx.load(str(out / entry.file), load_external_data=False).graph
        assert not [n for n in graph.node if n.op_type == "MatMul" and "proj" in n.name], precision
        assert not [n for n in graph.node if n.op_type == "Transpose" and n.input[0].endswith(TRANSPOSED_SUFFIX)]

    work = tmp_path / "work"
    work.mkdir()
    for file in [WEIGHTS, *(f.name for f in out.glob("causal_decoder.onnx*"))]:
        shutil.copy(out / file, work / file)
    src = work / "causal_decoder.onnx"
    source = onnx.load(str(src), load_external_data=False)
    assert [n for n in source.graph.node if n.op_type == "Transpose" and n.input[0].endswith(TRANSPOSED_SUFFIX)]
    job = ConversionJob(block_size=32, head_bits=8)
    direct, folded = work / "direct.onnx", work / "folded.onnx"
    for from_, to in ((src, direct), (plain_weights(src), folded)):
        info = quantize_blockwise(from_, to, job, bits=4, block_size=32, accuracy_level=4, head_bits=8)
    ours, theirs = onnx.load(str(direct)), onnx.load(str(folded))
    assert [(n.op_type, list(n.input), list(n.output)) for n in ours.graph.node] == \
        [(n.op_type, list(n.input), list(n.output)) for n in theirs.graph.node]  # fmt: skip
    mine = {t.name: numpy_helper.to_array(t) for t in ours.graph.initializer}
    other = {t.name: numpy_helper.to_array(t) for t in theirs.graph.initializer}
    assert mine.keys() == other.keys()
    assert all(np.array_equal(mine[k], other[k]) for k in mine)
    assert sum(n.op_type == "MatMulNBits" for n in ours.graph.node) >= 3 * model.config.n_decoder_layers
    assert bool(tied_tables(source)) == bool(model.tied_aliases())  # the output layer read as the embedding's bytes
    assert info["bits"] == 4 and info["at_output_layer_bits"]
