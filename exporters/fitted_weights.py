"""Weights on a low-bit grid that were fitted elsewhere (GPTQ: :mod:`edgeattn.exporters.gptq`),
written into the ``MatMulNBits`` nodes ONNX Runtime's quantiser made, and read back out of them.
Torch-free: packaging carries an export's fitted levels into a graph it remakes for a target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgeattn.errors import ExportError
from edgeattn.exporters.constant_weights import constant_weights


@dataclass
class FittedWeight:
    """A product's weight on its low-bit grid: ``codes`` (N, K) levels 0 .. 2^bits - 1 whose
    value is ``(code - 2^(bits-1)) * scale`` of their block, ``scales`` (N, ceil(K / block)) (a
    last block cut short is padded with zeros, as MatMulNBits pads it)."""

    codes: np.ndarray
    scales: np.ndarray
    bits: int
    block: int

    def on_disk(self) -> FittedWeight:
        """The same fit with its arrays in an unlinked temporary file (``TMPDIR``), mapped: a
        model's fits, made layer after layer and written into the graph at the end, cost the
        system's pages, not memory of the process's own."""
        return FittedWeight(_mapped(self.codes), _mapped(self.scales), self.bits, self.block)

    def dequantized(self) -> np.ndarray:
        """(N, K) float32: the values the graph computes with."""
        scales = np.repeat(self.scales, self.block, axis=1)[:, : self.codes.shape[1]]
        return ((self.codes.astype(np.float32) - 2 ** (self.bits - 1)) * scales).astype(np.float32)


def _mapped(array: np.ndarray) -> np.ndarray:
    import tempfile

    if array.nbytes == 0:
        return array
    with tempfile.TemporaryFile(prefix="edgeattn-fit-") as f:  # unlinked: the map keeps it until let go
        mapped = np.memmap(f, dtype=array.dtype, mode="w+", shape=array.shape)
    mapped[...] = array
    return mapped


def packed_codes(fitted: FittedWeight) -> np.ndarray:
    """MatMulNBits' B (N, K / block, block * bits / 8): each block's levels, two 4-bit levels a
    byte (the first in the low half)."""
    n, k = fitted.codes.shape
    blocks = -(-k // fitted.block)
    codes = np.pad(fitted.codes, ((0, 0), (0, blocks * fitted.block - k)), constant_values=2 ** (fitted.bits - 1))
    codes = codes.reshape(n, blocks, fitted.block)
    if fitted.bits == 8:
        return codes.astype(np.uint8)
    if fitted.bits != 4:
        raise ValueError(f"MatMulNBits takes 4 or 8 bits here, not {fitted.bits}")
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def weight_of(node: onnx.NodeProto) -> str:
    """The float weight a MatMulNBits node of ONNX Runtime's quantiser was made from (its B is
    named ``<weight>_Q<bits>``)."""
    return node.input[1].rsplit("_Q", 1)[0]


def apply_fitted(model: onnx.ModelProto, fitted: dict[str, FittedWeight]) -> list[str]:
    """Overwrite the levels and scales of each MatMulNBits node whose weight ``fitted`` holds
    (same bits and block, symmetric: no zero points); returns the weights written."""
    inits = {t.name: t for t in model.graph.initializer}
    written = []
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or weight_of(node) not in fitted:
            continue
        fit = fitted[weight_of(node)]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (attrs.get("bits", 4), attrs["block_size"], attrs["N"], attrs["K"]) != (fit.bits, fit.block,
                                                                                 *fit.codes.shape):  # fmt: skip
            raise ExportError(f"{weight_of(node)}: fitted as {fit.bits}-bit blocks of {fit.block} "
                             f"{fit.codes.shape}, the graph has {attrs}")  # fmt: skip
        if len(node.input) > 3 and node.input[3]:
            raise ExportError(f"{weight_of(node)} has zero points; GPTQ fits symmetric levels")
        levels, scales = inits[node.input[1]], inits[node.input[2]]
        levels.CopyFrom(numpy_helper.from_array(packed_codes(fit).reshape(tuple(levels.dims)), levels.name))
        scales.CopyFrom(numpy_helper.from_array(fit.scales.astype(np.float32).reshape(tuple(scales.dims)),
                                                scales.name))  # fmt: skip
        written.append(weight_of(node))
    return written


#: the largest relative error (Frobenius) a fitted weight may have against the float weight it
#: stands for: 4-bit levels leave about 0.1; more is a fit of some other weight
FITTED_ERROR = 0.3


def matching(model: onnx.ModelProto, fitted: dict[str, FittedWeight]) -> dict[str, FittedWeight]:
    """Those of ``fitted`` that are, on their grid, ``model``'s float weight of their name (a
    (K, N) MatMul weight, an initializer or a checkpoint tensor's transpose; the fit's (N, K)
    transposed)."""
    weights = constant_weights(model)
    found = {}
    for name, fit in fitted.items():
        if name not in weights or weights[name].shape[::-1] != fit.codes.shape:
            continue
        want = weights[name].array().T
        if want.shape != fit.codes.shape:
            continue
        error = np.linalg.norm(fit.dequantized() - want) / max(float(np.linalg.norm(want)), 1e-30)
        if error <= FITTED_ERROR:
            found[name] = fit
    return found


def check_fitted(model: onnx.ModelProto, fitted: dict[str, FittedWeight]) -> None:
    """ExportError unless each fitted weight is, on its grid, ``model``'s float weight of its name."""
    wrong = sorted(set(fitted) - set(matching(model, fitted)))
    if wrong:
        raise ExportError(f"GPTQ's fit of {', '.join(wrong[:3])} is not the graph's weight of that name "
                          f"({len(wrong)} in all): its fitter names the wrong products")  # fmt: skip


def fitted_from_graph(model: onnx.ModelProto) -> dict[str, FittedWeight]:
    """The levels and scales of ``model``'s symmetric MatMulNBits nodes, by the weight each was
    made from (what :func:`apply_fitted` writes, read back)."""
    inits = {t.name: t for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or len(node.input) > 3 and node.input[3]:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        bits, block, n, k = attrs.get("bits", 4), attrs["block_size"], attrs["N"], attrs["K"]
        if bits not in (4, 8) or node.input[1] not in inits:
            continue
        blocks = -(-k // block)
        packed = numpy_helper.to_array(inits[node.input[1]]).reshape(n, blocks, -1)
        if bits == 4:
            codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, blocks * block)
        else:
            codes = packed.reshape(n, blocks * block)
        scales = numpy_helper.to_array(inits[node.input[2]]).reshape(n, blocks).astype(np.float32)
        out[weight_of(node)] = FittedWeight(codes[:, :k].astype(np.uint8), scales, bits, block)
    return out


def _grid(node: onnx.NodeProto) -> tuple[int, int]:
    """(bits, block size) of a MatMulNBits node."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return attrs.get("bits", 4), attrs["block_size"]


def carry_fitted(remade: onnx.ModelProto, fitted_graph: onnx.ModelProto, float_graph: onnx.ModelProto) -> list[str]:
    """Write into ``remade`` (a graph quantised again from ``float_graph``) the fitted levels of
    ``fitted_graph`` (the export's) wherever they stand for the same float weight and the remade
    node has their bits and blocks; returns the weights carried over."""
    grids = {weight_of(n): _grid(n) for n in remade.graph.node if n.op_type == "MatMulNBits"}
    fits = {name: fit for name, fit in matching(float_graph, fitted_from_graph(fitted_graph)).items()
            if grids.get(name) == (fit.bits, fit.block)}  # fmt: skip
    return apply_fitted(remade, fits)
