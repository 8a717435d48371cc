"""A mixture-of-experts node at reduced precision: ``quantize_experts`` rewrites ONNX Runtime's
``MoE`` as ``QMoE`` whose answers are the float node's with the experts' weights rounded as the
rewrite says (8 bits a row, 4 bits in blocks or a row), and within rounding of the float node."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeattn.exporters.experts import _quantized, quantize_experts

pytestmark = pytest.mark.quick

E, D, F, K, T = 4, 64, 32, 2, 7


def _graph(fc1: np.ndarray, fc2: np.ndarray, normalize: int) -> onnx.ModelProto:
    node = helper.make_node("MoE", ["x", "router", "fc1", "", "fc2", ""], ["y"], name="moe", domain="com.microsoft",
                            k=K, activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.0,
                            activation_beta=0.0, normalize_routing_weights=normalize)  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "router")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(fc1, "fc1"), numpy_helper.from_array(fc2, "fc2")],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _run(model: onnx.ModelProto, x: np.ndarray, router: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x, "router": router})[0]


def _reference(x, router, gate, up, down, normalize):
    """Qwen3-MoE's block in numpy: softmax, top k, (normalised) weights, SwiGLU experts."""
    probs = np.exp(router - router.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(len(x)):
        chosen = np.argsort(-probs[t])[:K]
        weights = probs[t, chosen] / (probs[t, chosen].sum() if normalize else 1.0)
        for e, w in zip(chosen, weights, strict=True):
            g, u = gate[e] @ x[t], up[e] @ x[t]
            out[t] += w * (down[e] @ (g / (1 + np.exp(-g)) * u))
    return out


def _dequantized(levels: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    if bits == 4:
        levels = np.stack([levels & 15, levels >> 4], axis=-1).reshape(*levels.shape[:2], -1)
    centred = levels.astype(np.float32) - 2 ** (bits - 1)
    if scales.ndim == 2:
        return centred * scales[..., None]
    return (centred.reshape(*scales.shape, -1) * scales[..., None]).reshape(centred.shape)


@pytest.mark.parametrize(("bits", "block"), [(8, 64), (4, 16), (4, 0)])
@pytest.mark.parametrize("normalize", [0, 1])
def test_qmoe_answers_as_its_rounded_experts(bits, block, normalize):
    rng = np.random.default_rng(bits + block + normalize)
    gate, up = rng.standard_normal((2, E, F, D)).astype(np.float32) * 0.2
    down = rng.standard_normal((E, D, F)).astype(np.float32) * 0.2
    x, router = rng.standard_normal((T, D)).astype(np.float32), rng.standard_normal((T, E)).astype(np.float32)
    fc1 = np.stack([gate, up], axis=2).reshape(E, 2 * F, D)  # gate and up interleaved, as MoE's SwiGLU reads
    float_model = _graph(fc1, down, normalize)
    want = _reference(x, router, gate, up, down, normalize)
    assert np.abs(_run(float_model, x, router) - want).max() < 1e-4  # the float operator is Qwen3-MoE's block

    model = _graph(fc1, down, normalize)
    assert quantize_experts(model, bits, block) == ["moe"]
    node = model.graph.node[0]
    assert node.op_type == "QMoE"
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["expert_weight_bits"] == bits and attrs.get("block_size", 0) == (block if bits == 4 else 0)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    rounded1 = _dequantized(inits["fc1.levels"], inits["fc1.scales"], bits).reshape(E, F, 2, D)
    rounded2 = _dequantized(inits["fc2.levels"], inits["fc2.scales"], bits)
    got = _run(model, x, router)
    assert np.abs(got - _reference(x, router, rounded1[:, :, 0], rounded1[:, :, 1], rounded2, normalize)).max() < 1e-4
    error = np.abs(got - want).max() / np.abs(want).max()
    assert error < (0.02 if bits == 8 else 0.25), error
    assert error > 0  # rounded, not copied


def test_levels_and_scales_round_trip_within_half_a_step():
    weight = np.random.default_rng(0).standard_normal((3, 8, 64)).astype(np.float32)
    for bits, block in ((8, 0), (4, 32)):
        levels, scales = _quantized(weight, bits, block)
        back = _dequantized(levels, scales, bits)
        step = scales[..., None] if scales.ndim == 2 else np.repeat(scales, block, axis=-1)
        assert np.all(np.abs(back - weight) <= step / 2 + 1e-6)
