"""Mixture-of-experts layers at reduced precision: ONNX Runtime's ``MoE`` nodes (float experts)
rewritten as ``QMoE`` nodes (symmetric 8- or 4-bit expert weights, float scales), which run on
the CPU provider. ``MatMulNBits``' quantiser leaves a ``MoE`` alone: its experts are one stacked
(E, out, in) weight, not a product of one matrix.

QMoE's CPU kernel (onnxruntime 1.32) normalises the chosen experts' weights to sum to 1 whatever
its ``normalize_routing_weights`` says; a model that does not normalise them (their sum is the
top k's share of the router's softmax) gets its output times that share."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: the smallest block QMoE's CPU kernel takes (onnxruntime 1.32); below it, a scale per row
SMALLEST_BLOCK = 16


def _quantized(weight: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(levels as QMoE reads them, scales) of ``weight`` (E, out, in): symmetric, offset by
    2 ** (bits - 1), two 4-bit levels a byte (the even one low); a scale per ``block`` inputs of a
    row (E, out, in / block), or per row (E, out) when ``block`` is 0."""
    experts, rows, width = weight.shape
    groups = weight.reshape(experts, rows, width // block if block else 1, -1).astype(np.float64)
    top = 2 ** (bits - 1) - 1
    scales = np.abs(groups).max(axis=-1, keepdims=True) / top
    scales[scales == 0] = 1.0
    levels = np.clip(np.rint(groups / scales), -top - 1, top).astype(np.int16) + top + 1
    levels = levels.reshape(experts, rows, width).astype(np.uint8)
    if bits == 4:
        levels = levels[..., 0::2] | (levels[..., 1::2] << 4)
    scales = scales.astype(np.float32).reshape(experts, rows, -1)
    return np.ascontiguousarray(levels), scales if block else scales[..., 0]


def quantize_experts(model: onnx.ModelProto, bits: int, block_size: int) -> list[str]:
    """Each ``MoE`` node of ``model`` (its weights loaded) whose expert weights are constants made a
    ``QMoE`` of ``bits``-bit experts, in place: in blocks of ``block_size`` inputs at 4 bits where
    the block divides every expert's input width, else a scale per row. Returns the nodes rewritten."""
    inits = {t.name: t for t in model.graph.initializer}
    done = []
    for node in list(model.graph.node):
        if node.op_type != "MoE" or node.domain != "com.microsoft":
            continue
        names = list(node.input) + [""] * (8 - len(node.input))
        weights = [names[2], names[4]] + ([names[6]] if names[6] else [])
        if not all(w in inits for w in weights):
            continue
        arrays = [numpy_helper.to_array(inits[w]) for w in weights]
        block = block_size if bits == 4 and block_size >= SMALLEST_BLOCK and all(
            a.shape[2] % block_size == 0 for a in arrays) else 0  # fmt: skip
        inputs = names[:2]
        for name, array, bias in zip(weights, arrays, (names[3], names[5], names[7]), strict=False):
            levels, scales = _quantized(array, bits, block)
            model.graph.initializer.remove(inits.pop(name))
            for suffix, value in (("levels", levels), ("scales", scales)):
                model.graph.initializer.append(numpy_helper.from_array(value, f"{name}.{suffix}"))
            inputs += [f"{name}.levels", f"{name}.scales", bias]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
        attrs["expert_weight_bits"] = bits
        if block:
            attrs["block_size"] = block
        outputs, after = list(node.output), []
        if not attrs.get("normalize_routing_weights", 0):
            attrs["normalize_routing_weights"] = 1
            outputs, after = _times_top_share(model, node, names[1], int(attrs["k"]))
        replacement = helper.make_node("QMoE", inputs, outputs, name=node.name, domain="com.microsoft", **attrs)
        index = next(i for i, n in enumerate(model.graph.node) if n.output[:1] == node.output[:1])
        model.graph.node.remove(node)
        for offset, new in enumerate([replacement, *after]):
            model.graph.node.insert(index + offset, new)
        done.append(node.name)
    return done


def _times_top_share(model: onnx.ModelProto, node: onnx.NodeProto, router: str, k: int
                     ) -> tuple[list[str], list[onnx.NodeProto]]:  # fmt: skip
    """(QMoE's outputs, the nodes after it) that scale ``node``'s output by the share of the
    router's softmax its top ``k`` experts hold (N, 1)."""
    base = node.name or node.output[0]
    k_name = f"{base}.k"
    model.graph.initializer.append(numpy_helper.from_array(np.array([k], dtype=np.int64), k_name))
    axes = f"{base}.axes"
    model.graph.initializer.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), axes))
    normalised = f"{node.output[0]}.normalised"
    nodes = [
        helper.make_node("Softmax", [router], [f"{base}.probs"], name=f"{base}.softmax", axis=-1),
        helper.make_node("TopK", [f"{base}.probs", k_name], [f"{base}.top", f"{base}.chosen"], name=f"{base}.topk",
                         axis=-1),  # fmt: skip
        helper.make_node("ReduceSum", [f"{base}.top", axes], [f"{base}.share"], name=f"{base}.share", keepdims=1),
        helper.make_node("Mul", [normalised, f"{base}.share"], [node.output[0]], name=f"{base}.scaled"),
    ]
    return [normalised], nodes
