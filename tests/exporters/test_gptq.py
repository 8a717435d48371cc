"""GPTQ: a product's levels fitted to its inputs keep its outputs closer than rounding does, ONNX
Runtime computes with exactly the fitted levels, the language-model walk leaves the model as it
came, and the fit's text is the held-out text the gate does not measure."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from edgeattn.errors import ExportError
from edgeattn.exporters.fitted_weights import fitted_from_graph
from edgeattn.exporters.gptq import Hessians, calibration_rows, gptq, inverse_factor, nearest
from edgeattn.exporters.precision_builds import FIT_TOKENS, PrecisionOptions, fit_sequences
from edgeattn.exporters.quantize import ConversionJob, quantize_blockwise

pytestmark = pytest.mark.quick


def _correlated_inputs(rows: int, features: int, seed: int) -> torch.Tensor:
    """Inputs whose features move together (as a layer's do), a few of them large."""
    g = torch.Generator().manual_seed(seed)
    mixing = torch.randn(features, features, generator=torch.Generator().manual_seed(7)) / features**0.5
    scale = torch.ones(features)
    scale[:4] = 8.0
    return (torch.randn(rows, features, generator=g) @ mixing) * scale


def test_gptq_keeps_a_products_outputs_closer_than_rounding_to_nearest():
    torch.manual_seed(0)
    weight = torch.randn(48, 128) * 0.05
    hessians = Hessians(128)
    hessians.add(_correlated_inputs(2048, 128, seed=1))
    fitted = gptq(weight, hessians.value, bits=4, block=32)
    assert fitted.codes.shape == (48, 128) and fitted.scales.shape == (48, 4)
    assert fitted.codes.max() <= 15 and fitted.codes.dtype == np.uint8
    unseen = _correlated_inputs(1024, 128, seed=2)  # the same kind of inputs, not fitted on
    want = unseen @ weight.T
    gptq_error = (unseen @ torch.from_numpy(fitted.dequantized()).T - want).norm()
    rtn_error = (unseen @ nearest(weight, 4, 32).T - want).norm()
    assert gptq_error < 0.8 * rtn_error, (gptq_error, rtn_error)
    # every level is on the grid its block's scale makes
    assert np.allclose(fitted.dequantized(), (fitted.codes.astype(np.float32) - 8) * np.repeat(fitted.scales, 32, 1))


@pytest.mark.parametrize("features", [96, 2048 + 96])
def test_the_inverse_factor_is_the_upper_cholesky_factor_of_the_inverse(features):
    """Through LAPACK's triangular inverse (large) or in torch (small), the same factor."""
    hessians = Hessians(features)
    hessians.add(_correlated_inputs(4 * features, features, seed=3))
    h = hessians.value + 0.01 * hessians.value.diag().mean() * torch.eye(features)
    got = inverse_factor(h)
    assert torch.equal(got, got.triu()) and bool((got.diag() > 0).all())
    want = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h.double())), upper=True)
    assert torch.allclose(got.double(), want, rtol=1e-3, atol=1e-4 * float(want.abs().max()))
    with pytest.raises(torch.linalg.LinAlgError):
        inverse_factor(-torch.eye(features))


def _product_graph(weight: np.ndarray) -> onnx.ModelProto:
    k, n = weight.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="product")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", n])],
        [numpy_helper.from_array(weight, "w")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_fit_is_asked_for_the_plan_the_graph_is_quantised_to(tmp_path):
    weight = (np.random.default_rng(0).standard_normal((64, 24)) * 0.1).astype(np.float32)
    src = tmp_path / "src.onnx"
    onnx.save(_product_graph(weight), str(src))
    asked = []
    job = ConversionJob(fit=lambda bits_of, block: asked.append((bits_of, block)) or {}, fit_source="t")
    quantize_blockwise(src, tmp_path / "q.onnx", job, bits=4, block_size=32, accuracy_level=0, head_bits=8,
                       method="gptq")  # fmt: skip
    assert asked == [({"w": 8}, 32)]  # the graph's output layer is at head_bits
    asked.clear()
    quantize_blockwise(src, tmp_path / "e.onnx", ConversionJob(fit=job.fit, exclude=["product"]), bits=4,
                       block_size=32, accuracy_level=0, head_bits=8, method="gptq")  # fmt: skip
    assert asked == [({}, 32)]  # a product kept float is not fitted


@pytest.mark.parametrize("features", [64, 48])  # 48: the last block of 32 padded, as MatMulNBits pads it
def test_a_fit_is_written_where_its_bits_and_blocks_match(tmp_path, features):
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((features, 24)) * 0.1).astype(np.float32)
    graph = _product_graph(weight)
    graph.graph.node[0].output[0] = "hidden"  # not the graph's output: a 4-bit product
    graph.graph.node.append(helper.make_node("Relu", ["hidden"], ["y"]))
    src = tmp_path / "src.onnx"
    onnx.save(graph, str(src))
    hessians = Hessians(features)
    hessians.add(_correlated_inputs(512, features, seed=3))
    fitted = gptq(torch.from_numpy(weight.T), hessians.value, bits=4, block=32)
    assert fitted.codes.shape == (24, features) and fitted.scales.shape == (24, 2)
    job = ConversionJob(fit=lambda bits_of, block: {"w": fitted} if bits_of == {"w": 4} else {}, fit_source="t")
    info = quantize_blockwise(src, tmp_path / "q.onnx", job, bits=4, block_size=32, accuracy_level=0, head_bits=8,
                              method="gptq")  # fmt: skip
    assert info["method"] == "gptq" and info["fitted_products"] == 1
    x = rng.standard_normal((5, features)).astype(np.float32)
    session = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(["y"], {"x": x})[0]
    assert np.allclose(got, np.maximum(x @ fitted.dequantized().T, 0), atol=1e-4)
    read = fitted_from_graph(onnx.load(str(tmp_path / "q.onnx")))["w"]  # what packaging carries over
    assert np.array_equal(read.codes, fitted.codes) and np.array_equal(read.scales, fitted.scales)
    # round-to-nearest's levels differ: the graph holds the fit's, not the quantiser's
    plain = quantize_blockwise(src, tmp_path / "r.onnx", ConversionJob(), bits=4, block_size=32, accuracy_level=0,
                               head_bits=8, method="rtn")  # fmt: skip
    assert plain["method"] == "rtn"
    rtn = ort.InferenceSession(str(tmp_path / "r.onnx"), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    assert not np.allclose(rtn, got, atol=1e-4)
    # a fit of some other weight under this one's name is refused
    wrong = gptq(torch.from_numpy(weight.T[::-1].copy()), hessians.value, bits=4, block=32)
    with pytest.raises(ExportError, match="GPTQ's fit of w is not the graph's weight of that name"):
        quantize_blockwise(src, tmp_path / "w.onnx", ConversionJob(fit=lambda b, k: {"w": wrong}), bits=4,
                           block_size=32, accuracy_level=0, head_bits=8, method="gptq")  # fmt: skip
    # no text to fit on: rounded to nearest, and the record says why
    unfitted = quantize_blockwise(src, tmp_path / "u.onnx", ConversionJob(), bits=4, block_size=32, accuracy_level=0,
                                  head_bits=8, method="gptq")  # fmt: skip
    assert unfitted["method"] == "rtn" and "no text to fit on" in unfitted["not_fitted_because"]


def test_the_language_model_walk_fits_its_4bit_products_and_leaves_the_model_as_it_came():
    from edgeattn.families.causal.config import CausalLMConfig
    from edgeattn.families.causal.fit import fit_causal
    from edgeattn.families.causal.graph_builder import layer_products, product_weight
    from edgeattn.families.causal.model import CausalLM

    torch.manual_seed(0)
    model = CausalLM(CausalLMConfig(vocab_size=300, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
                                    max_len=64)).eval()  # fmt: skip
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bits_of = {}
    for i, layer in enumerate(model.layers):
        for name in layer_products(layer):
            bits_of[product_weight(i, name)] = 8 if name == "attn.qkv_proj" else 4
    ids = calibration_rows([list(range(3, 250))] * 2, tokens=256, width=32)
    fitted = fit_causal(model, ids, bits_of, block=32)
    assert set(fitted) == {w for w, b in bits_of.items() if b == 4}
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    for name, fit in fitted.items():
        layer, product = int(name.split(".")[1]), name.split(".", 2)[2].rsplit(".weight", 1)[0]
        weight = torch.cat([m.weight for m in layer_products(model.layers[layer])[product]], 0).detach()
        error = np.linalg.norm(fit.dequantized() - weight.numpy()) / np.linalg.norm(weight.numpy())
        assert fit.codes.shape == tuple(weight.shape) and error < 0.25, (name, error)


def test_calibration_rows_are_taken_evenly_over_the_text():
    rows = calibration_rows([list(range(100)), list(range(100, 1000))], tokens=256, width=64)
    assert rows.shape == (4, 64) and rows[0, 0] == 0 and rows[-1, -1] == 999
    assert calibration_rows([[1, 2, 3]], width=64).tolist() == [[1, 2, 3]]
    with pytest.raises(ValueError, match="no calibration tokens"):
        calibration_rows([[]])


def test_gptq_fits_on_the_held_out_text_the_gate_does_not_measure():
    rng = np.random.default_rng(0)
    held = [rng.integers(3, 300, size=int(n)).tolist() for n in rng.integers(20, 60, size=400)]
    options = PrecisionOptions(heldout_data=held, heldout_source="file notes.txt", gate_tokens=8192)
    sequences, said = fit_sequences(options)
    from edgeattn.exporters.gate import spread_rows

    measured = {tuple(held[i]) for i in spread_rows([len(s) for s in held], 8192)}
    assert sequences and not {tuple(s) for s in sequences} & measured
    assert sum(map(len, sequences)) >= FIT_TOKENS and "the gate does not measure" in said
    few = PrecisionOptions(heldout_data=held[:20], heldout_source="file notes.txt", gate_tokens=8192)
    assert fit_sequences(few) == (held[:20], "file notes.txt, which the gate measures too")
    mine = PrecisionOptions(heldout_data=held, calibration_data=held[:3], calibration_source="file calib.txt")
    assert fit_sequences(mine)[0] == held[:3] and "calib.txt" in fit_sequences(mine)[1]
    assert fit_sequences(PrecisionOptions()) is None  # the gate's random ids: nothing to fit on


def test_the_walk_runs_its_layers_a_few_rows_at_a_time_to_the_same_fit(monkeypatch):
    """A layer run over the calibration rows in chunks (its activations bounded) fits every product
    as the layer run over all rows at once does, and keeps each fit on disk (mapped), not in memory."""
    from edgeattn.families.causal import fit as walk
    from edgeattn.families.causal.config import CausalLMConfig
    from edgeattn.families.causal.graph_builder import layer_products, product_weight
    from edgeattn.families.causal.model import CausalLM

    torch.manual_seed(1)
    model = CausalLM(CausalLMConfig(vocab_size=300, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
                                    max_len=64)).eval()  # fmt: skip
    bits_of = {product_weight(i, name): 4 for i, layer in enumerate(model.layers) for name in layer_products(layer)}
    ids = calibration_rows([list(range(3, 250))] * 2, tokens=256, width=32)
    whole = walk.fit_causal(model, ids, bits_of, block=32)
    monkeypatch.setattr(walk, "CHUNK_TOKENS", 70)  # two rows of 32 at a time
    chunked = walk.fit_causal(model, ids, bits_of, block=32)
    assert set(whole) == set(chunked) and len(ids) > 2
    for name, fit in whole.items():
        assert isinstance(fit.codes, np.memmap)
        assert np.array_equal(fit.codes, chunked[name].codes), name
        np.testing.assert_allclose(fit.scales, chunked[name].scales, rtol=1e-5)
