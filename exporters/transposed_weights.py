"""Matrix products whose weight a graph reads through a Transpose of a checkpoint tensor (a
Linear's ``[out, in]`` weight, as the checkpoint stores it), and their block-wise quantisation
straight from that tensor: ``[out, in]`` is MatMulNBits' own layout, so no transposed float copy
of the model is ever made. The levels and scales are those of ONNX Runtime's weight-only quantiser
(its own kernels, a band of output rows at a time), and the nodes are named as it names them.
Torch-free.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from edgeattn.errors import ExportError
from edgeattn.exporters.constant_weights import ConstantWeight, constant_weights
from edgeattn.exporters.external_data import external_view
from edgeattn.exporters.fitted_weights import FittedWeight, packed_codes

#: float32 bytes of a weight quantised at once (a band of its output rows)
BAND_BYTES = 64 * 2**20


def transposed_products(model: onnx.ModelProto) -> dict[str, tuple[onnx.NodeProto, ConstantWeight]]:
    """{weight name: (MatMul, its weight)} for the MatMul nodes whose weight is a Transpose of a
    float32 initializer kept outside the graph."""
    weights = constant_weights(model)
    found = {}
    for node in model.graph.node:
        weight = weights.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) > 1 else None
        if (weight is not None and weight.transpose is not None
                and weight.tensor.data_type == onnx.TensorProto.FLOAT
                and weight.tensor.data_location == onnx.TensorProto.EXTERNAL):  # fmt: skip
            found[node.input[1]] = (node, weight)
    return found


def _rows(tensor: onnx.TensorProto, folder: Path) -> np.ndarray:
    """An external float32 [N, K] initializer (in ``folder``, or at an absolute location) mapped read-only."""
    n, k = (int(d) for d in tensor.dims)
    data = external_view(tensor, folder)
    if len(data) != n * k * 4:
        raise ValueError(f"{tensor.name}: {len(data)} bytes for a float32 [{n}, {k}]")
    return np.frombuffer(data, dtype=np.float32).reshape(n, k)


def quantize_rows(rows: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric block-wise levels of a float32 [N, K] weight as MatMulNBits holds them: B
    [N, K / block, block * bits / 8] and scales [N, K / block] (ONNX Runtime's kernels, a band of
    rows at a time)."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    kernel = {4: quantize_matmul_4bits, 8: quantize_matmul_8bits}.get(bits)
    if kernel is None:
        raise ValueError(f"MatMulNBits takes 4 or 8 bits here, not {bits}")
    n, k = rows.shape
    blocks = -(-k // block)
    blob = block * bits // 8
    packed = np.empty((n, blocks, blob), np.uint8)
    scales = np.empty((n, blocks), np.float32)
    band = max(1, BAND_BYTES // max(4 * k, 1))
    for start in range(0, n, band):
        stop = min(n, start + band)
        weight = np.zeros((blocks * block, stop - start), np.float32)  # [K, n] as the kernel takes it, padded
        weight[:k] = rows[start:stop].T
        part = np.zeros((stop - start, blocks, blob), np.uint8)
        part_scales = np.zeros((stop - start, blocks), np.float32)
        zero_points = np.zeros((stop - start, -(-blocks * bits // 8)), np.uint8)
        kernel(part, weight, part_scales, zero_points, block, stop - start, k, True)
        packed[start:stop], scales[start:stop] = part, part_scales
    return packed, scales


def quantize_transposed(model: onnx.ModelProto, folder: Path, bits_of: dict[str, int], block: int,
                        accuracy_level: int, fitted: dict[str, FittedWeight] | None = None,
                        exclude: frozenset[str] | set[str] = frozenset()) -> list[str]:  # fmt: skip
    """Replace each MatMul whose weight is a Transpose of an external float32 [N, K] initializer
    (in ``folder``), and whose weight ``bits_of`` names, by a symmetric MatMulNBits of that many
    bits: round to nearest, or the levels of ``fitted`` where it holds that weight. The
    Transposes and initializers nothing else reads are removed. Returns the weights quantised."""
    fitted = fitted or {}
    done, replaced = [], []
    from tqdm import tqdm

    chosen = {w: found for w, found in transposed_products(model).items()
              if w in bits_of and found[0].name not in exclude}  # fmt: skip
    for weight, (node, source) in tqdm(chosen.items(), desc="block-wise levels from the checkpoint", unit="weight",
                                       disable=None, leave=False):  # fmt: skip
        bits = bits_of[weight]
        n, k = (int(d) for d in source.tensor.dims)
        fit = fitted.get(weight)
        if fit is not None:
            if (fit.bits, fit.block, *fit.codes.shape) != (bits, block, n, k):
                raise ExportError(f"{weight}: fitted as {fit.bits}-bit blocks of {fit.block} {fit.codes.shape}, "
                                  f"asked for {bits}-bit blocks of {block} [{n}, {k}]")  # fmt: skip
            packed = packed_codes(fit).reshape(n, -(-k // block), block * bits // 8)
            scales = fit.scales.astype(np.float32).reshape(n, -1)
        else:
            packed, scales = quantize_rows(_rows(source.tensor, folder), bits, block)
        model.graph.initializer.extend([onnx.numpy_helper.from_array(packed, f"{weight}_Q{bits}"),
                                        onnx.numpy_helper.from_array(scales, f"{weight}_scales")])  # fmt: skip
        attrs = {"K": k, "N": n, "bits": bits, "block_size": block}
        if accuracy_level:
            attrs["accuracy_level"] = accuracy_level
        replacement = helper.make_node("MatMulNBits", [node.input[0], f"{weight}_Q{bits}", f"{weight}_scales"],
                                       list(node.output), name=f"{node.name}_Q{bits}" if node.name else "",
                                       domain="com.microsoft", **attrs)  # fmt: skip
        index = list(model.graph.node).index(node)
        model.graph.node.remove(node)
        model.graph.node.insert(index, replacement)
        done.append(weight)
        replaced.append((weight, source))
    if done:
        if not any(o.domain == "com.microsoft" for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        drop_unread(model, [source for _, source in replaced])
    return done


def _read_names(graph: onnx.GraphProto) -> set[str]:
    """Every value a node of ``graph`` or of its subgraphs reads, and its outputs."""
    read = {o.name for o in graph.output}
    for node in graph.node:
        read.update(node.input)
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                read |= _read_names(sub)
    return read


def drop_unread(model: onnx.ModelProto, weights: list[ConstantWeight]) -> None:
    """Remove ``weights``' Transpose nodes whose output nothing reads any more, then their
    initializers where nothing reads them either."""
    read = _read_names(model.graph)
    for weight in weights:
        if weight.transpose is not None and weight.transpose.output[0] not in read \
                and weight.transpose in model.graph.node:  # fmt: skip
            model.graph.node.remove(weight.transpose)
    read = _read_names(model.graph)
    names = {w.tensor.name for w in weights} - read
    for tensor in [t for t in model.graph.initializer if t.name in names]:
        model.graph.initializer.remove(tensor)
