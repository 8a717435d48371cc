"""Reduced-precision graphs with ONNX Runtime's own tools.

- ``int8``: ``quantize_dynamic``, per-channel full-range weights whose signedness comes from the
  CPU's instruction set (signed where it has VNNI/AMX, unsigned where it lacks them, to avoid the
  saturation of the u8×s8 AVX2/AVX-512 kernels).
- ``int8-static``: ``quantize_static`` in QDQ format, calibrated (MinMax, Entropy or Percentile)
  on representative inputs; signed weights, 7-bit where the CPU lacks VNNI/AMX.
- ``fp16``: weights and compute in float16, inputs and outputs float32, normalisation and
  softmax kept in float32.
- ``int4``: block-wise 4-bit weights (``MatMulNBits``).

Each converter takes a fused float32 graph of its precision's source form (see
``edgeattn.runtime.precisions``), writes the converted graph, and returns the settings it used
(recorded in the manifest). Each precision's record names its converter (:func:`converter`).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgeattn.errors import ExportError
from edgeattn.exporters.compact import fold_transposes
from edgeattn.exporters.constant_weights import constant_weights
from edgeattn.exporters.experts import quantize_experts
from edgeattn.exporters.external_data import (
    array_of,
    external_region,
    external_view,
    read_in_place,
    write_external_data,
)
from edgeattn.exporters.fitted_weights import FittedWeight, apply_fitted, check_fitted
from edgeattn.exporters.qdq_bypass import bypass_float_consumers
from edgeattn.exporters.transposed_weights import quantize_transposed, transposed_products
from edgeattn.host import cpu_flags, dynamic_int8_weights, has_vnni, quiet_quantization
from edgeattn.runtime.layout import external_data_file
from edgeattn.runtime.precisions import CALIBRATION_METHODS, PrecisionError, get_precision
from edgeattn.runtime.session import CPU
from edgeattn.runtime.specs import is_in_place_cache

log = logging.getLogger(__name__)

Feeds = dict[str, np.ndarray]
#: Embedding tables with at least this many elements are quantised to 4 bits in int4 graphs.
LARGE_EMBEDDING = 1 << 20


def int8_settings(dynamic: bool = True) -> dict[str, Any]:
    """Signedness and range of int8 weights from this CPU's instruction set (recorded in the
    manifest): dynamic int8 as :func:`edgeattn.host.dynamic_int8_weights` says; static (QDQ)
    int8 signed, 7-bit where the CPU lacks VNNI/AMX."""
    flags = cpu_flags()
    vnni = has_vnni(flags)
    if vnni:
        weights, reduce_range, reason = "int8", False, "VNNI/AMX present: signed weights, full 8-bit range"
    elif dynamic:
        weights, reduce_range = dynamic_int8_weights(flags), False
        reason = (
            "no VNNI/AMX: unsigned full-range weights (u8*u8 kernels do not saturate; 7-bit signed doubles the error)"
        )
    else:
        weights, reduce_range, reason = "int8", True, "no VNNI/AMX: 7-bit weights avoid u8*s8 accumulation saturation"
    return {"weight_type": weights, "activation_type": "uint8", "per_channel": True, "reduce_range": reduce_range,
            "instruction_sets": flags, "reason": reason}  # fmt: skip


#: Operators dynamic int8 quantises (those with a constant weight).
QUANTIZED_OPS = ("MatMul", "Gather", "Attention")


def _quantizable(model: onnx.ModelProto) -> list[str]:
    weights = constant_weights(model)
    return [n.name for n in model.graph.node if n.op_type in QUANTIZED_OPS and any(i in weights for i in n.input)]


def _activation_products(model: onnx.ModelProto) -> list[str]:
    """Names of the MatMul nodes with no constant weight: an unfused attention core's q·kᵀ and p·v.
    ``quantize_static`` in QDQ format quantises them too (it ignores ``MatMulConstBOnly``), which
    costs accuracy (reference encoder gate worst-token cosine 0.99987 -> 0.99984) and gains no speed."""
    weights = constant_weights(model)
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and not any(i in weights for i in n.input)]


def plain_weights(src: Path) -> Path:
    """``src``, or beside it (made once) the same graph with the weights it reads through a
    Transpose of a checkpoint tensor folded into plain initializers: for ONNX Runtime's quantisers
    and converters that take a weight only as an initializer."""
    proto = onnx.load(str(src), load_external_data=False)
    if not any(w.transpose is not None for w in constant_weights(proto).values()):
        return src
    dst = src.with_name(f"{src.stem}.plain-weights.onnx")
    if not dst.is_file():
        read_in_place(proto, src.parent, lazy=set())
        fold_transposes(proto)
        save_quantized(proto, dst)
    return dst


def save_quantized(proto: onnx.ModelProto, dst: Path) -> None:
    """Save a converted graph: its weights in a data file laid out to map when they are large."""
    if sum(len(t.raw_data) for t in proto.graph.initializer) > MAPPED_ABOVE:  # a tensor at a time, laid out to map
        write_external_data(proto, dst, external_data_file(dst.name))
    else:
        onnx.save(proto, str(dst))


@dataclass
class ConversionJob:
    """What a converter may need beyond its source and destination files."""

    #: node names to leave in float32 (the sensitive-node search)
    exclude: list[str] = field(default_factory=list)
    #: representative feeds for static calibration, made on first call
    calibration: Callable[[], list[Feeds]] | None = None
    calibration_method: str = "minmax"
    #: where the calibration data came from, in words (recorded in the manifest)
    calibration_source: str = ""
    #: int4 products quantise their activations to int8 (the family role's ``int8_activations``)
    int8_activations: bool = False
    #: weights per int4 scale (the family role's ``int4_block_size``)
    block_size: int = 32
    #: how int8 is made (the family role's ``int8_form``): "dynamic" (MatMulInteger, activations
    #: quantised per tensor) or "blockwise" (MatMulNBits 8-bit weights in blocks of 32)
    int8_form: str = "dynamic"
    #: the bits of a graph's output layer (and the embedding tied to it) under int4 (the family
    #: role's ``int4_head_bits``): 4, or 8
    head_bits: int = 4
    #: the bits of its products under int4 (the family role's ``int4_bits``): 4, or 8
    int4_bits: int = 4
    #: how its int4 blocks are fitted (the family role's ``int4_method``): "rtn", "hqq" or "gptq"
    int4_method: str = "rtn"
    #: GPTQ's fit, ``fit(bits_of, block) -> {weight name: FittedWeight}`` of the products whose
    #: graph weight ``bits_of`` maps to their bits (None: no text to fit on, levels rounded to nearest)
    fit: Callable[[dict[str, int], int], dict[str, FittedWeight]] | None = None
    #: what ``fit`` fits on, in words (recorded in the manifest)
    fit_source: str = ""
    #: products whose weight names hold one of these stay at ``head_bits`` under int4 (the family
    #: role's ``int4_wide_products``: the projections real models' quality hangs on)
    wide_products: tuple[str, ...] = ()
    #: fp16 makes the in-place caches (``cache_*`` in, ``updated_*`` out) float16 too (the family
    #: role's ``cache_dtype`` at the precision is float16)
    float16_cache: bool = False
    #: int4 products' accuracy level (MatMulNBits): None for the role's own (4 where
    #: ``int8_activations``, else 0); a bundle for a target may ask another
    accuracy_level: int | None = None


Converter = Callable[[Path, Path, ConversionJob], dict[str, Any]]


def _int8_blockwise(src: Path, dst: Path, job: ConversionJob) -> dict[str, Any]:
    """8-bit weights in blocks of :data:`INT8_BLOCK`, activations quantised per block (Q8_0's form)."""
    return quantize_blockwise(src, dst, job, bits=8, block_size=INT8_BLOCK, accuracy_level=INT8_BLOCKWISE_LEVEL,
                              head_bits=8)  # fmt: skip


def quantize_int8_dynamic(src: Path, dst: Path, job: ConversionJob) -> dict[str, Any]:
    """Dynamic int8 quantisation of ``src`` into ``dst``; returns the settings used. A graph whose
    role asks for the ``blockwise`` form gets 8-bit block-wise weights instead (see
    :func:`quantize_blockwise`)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if job.int8_form == "blockwise":
        return _int8_blockwise(src, dst, job)
    src = plain_weights(src)
    settings = int8_settings()
    with quiet_quantization():
        quantize_dynamic(
            str(src), str(dst), per_channel=True, reduce_range=settings["reduce_range"],
            weight_type=QuantType.QInt8 if settings["weight_type"] == "int8" else QuantType.QUInt8,
            op_types_to_quantize=list(QUANTIZED_OPS), nodes_to_exclude=job.exclude,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": True},
        )  # fmt: skip
    return {**settings, "excluded_nodes": list(job.exclude)}


class _Reader:
    """A CalibrationDataReader over a list of feed dictionaries."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it: Iterator[dict[str, np.ndarray]] = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


#: Operators whose outputs static int8 leaves in float32. A matrix product's output feeds float
#: operators (bias add, attention, activation), so quantising it only adds a quantise/dequantise
#: pass; left in float32, ONNX Runtime runs dequantise + MatMul as one ``MatMulIntegerToFloat``
#: instead of ``QLinearMatMul`` + dequantise, faster and no less close (docs/precisions.md).
UNQUANTIZED_OUTPUTS = ("MatMul",)


def quantize_int8_static(src: Path, dst: Path, job: ConversionJob) -> dict[str, Any]:
    """Static QDQ int8 quantisation calibrated on ``job``'s feeds; returns the settings."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}  # fmt: skip
    if job.calibration_method not in methods:
        raise ExportError(
            f"calibration method {job.calibration_method!r} is not one of {', '.join(CALIBRATION_METHODS)}"
        )
    calibration = job.calibration() if job.calibration is not None else []
    if not calibration:
        raise ExportError("static int8 quantisation needs calibration inputs")
    src = plain_weights(src)
    settings = int8_settings(dynamic=False)
    float_products = _activation_products(onnx.load(str(src), load_external_data=False))
    with quiet_quantization():
        quantize_static(
            str(src), str(dst), _Reader(calibration), quant_format=QuantFormat.QDQ, per_channel=True,
            reduce_range=settings["reduce_range"], activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Gather"], nodes_to_exclude=[*job.exclude, *float_products],
            calibrate_method=methods[job.calibration_method],
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": True,
                           "OpTypesToExcludeOutputQuantization": list(UNQUANTIZED_OUTPUTS)},
            calibration_providers=[CPU],
        )  # fmt: skip
    model = onnx.load(str(dst))
    bypassed = bypass_float_consumers(model)
    onnx.save(model, str(dst))
    return {**settings, "format": "QDQ", "float_outputs": list(UNQUANTIZED_OUTPUTS),
            "float_consumers_bypassed": bypassed, "calibration": job.calibration_method,
            "calibration_batches": len(calibration), "excluded_nodes": list(job.exclude),
            "calibration_data": job.calibration_source}  # fmt: skip


#: Largest float16 value.
FP16_MAX = 65504.0
#: Nodes whose float32 output reaches FP16_MAX / FP16_HEADROOM on the calibration inputs stay float32:
#: inputs the calibration did not see may be several times larger.
FP16_HEADROOM = 8.0


def activation_peaks(src: Path, feeds: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """The largest absolute value each float tensor of graph ``src`` takes over ``feeds`` (every node
    output made a graph output, run on ONNX Runtime's CPU provider)."""
    import onnxruntime as ort

    model = onnx.load(str(src))
    listed = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for name in node.output:
            if name and name not in listed:
                model.graph.output.append(onnx.ValueInfoProto(name=name))
                listed.add(name)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every tensor
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "peaks.onnx"
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="peaks.onnx.data", size_threshold=1 << 20)  # fmt: skip
        del model
        session = ort.InferenceSession(str(path), options, providers=[CPU])
        names = [o.name for o in session.get_outputs() if o.type == "tensor(float)"]
        peaks = dict.fromkeys(names, 0.0)
        for feed in feeds:
            for name, value in zip(names, session.run(names, feed), strict=True):
                if value.size:
                    peaks[name] = max(peaks[name], float(np.nanmax(np.abs(value))))
    return peaks


def fp16_overflow_nodes(src: Path, feeds: list[dict[str, np.ndarray]], headroom: float = FP16_HEADROOM) -> list[str]:
    """Names of the nodes of ``src`` with a float output that comes within ``headroom`` of float16's
    largest value on ``feeds`` (T5's feed-forward outputs and the residual sums and squares after
    them): the nodes to keep in float32."""
    peaks = activation_peaks(src, feeds)
    model = onnx.load(str(src), load_external_data=False)
    limit = FP16_MAX / headroom
    return [n.name for n in model.graph.node if any(peaks.get(o, 0.0) >= limit for o in n.output)]


def convert_fp16(src: Path, dst: Path, job: ConversionJob) -> dict[str, Any]:
    """Float16 weights and compute, norms and attention included; float32 inputs and outputs.

    A graph whose caches are written in place (``job.float16_cache``) takes and returns them in
    float16, so that they stay one buffer the attention writes into.
    Operators with no float16 kernel stay float32 (onnxruntime's default block list), and so does
    every node whose float32 output on the calibration inputs comes within a factor 8 of float16's
    range (65504): without that, a T5's feed-forward output and the residual stream after it turn
    into inf and NaN. ONNX Runtime's float16 (Skip)LayerNormalization and attention kernels keep
    their statistics and softmax in float32 inside; float32 norms would cost two Casts each (48
    more kernels in a BERT-base encoder, a launch each on the GPU) for little: that encoder against
    float32 gave cosine 0.9999992 at worst and 0.010 max abs (0.9999999 and 0.0015 with float32
    norms)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST
    from onnxruntime.transformers.onnx_model import OnnxModel

    src = plain_weights(src)
    calibration = job.calibration() if job.calibration is not None else []
    overflow = fp16_overflow_nodes(src, calibration) if calibration else []
    if overflow:
        log.info("fp16: %d node(s) come near float16's range and stay float32: %s", len(overflow), overflow[:8])
    model = OnnxModel(onnx.load(str(src)))
    kept = sorted({n.op_type for n in model.model.graph.node} & set(DEFAULT_OP_BLOCK_LIST))
    io = [t.name for t in [*model.model.graph.input, *model.model.graph.output]]
    caches = [n for n in io if is_in_place_cache(n)] if job.float16_cache else []
    model.convert_float_to_float16(keep_io_types=[n for n in io if n not in caches] if caches else True,
                                   node_block_list=overflow or None)  # fmt: skip
    model.topological_sort()
    onnx.save(model.model, str(dst))
    return {"kept_float32": kept, "io": "float32, the caches float16" if caches else "float32",
            "kept_float32_nodes": overflow, "overflow_limit": FP16_MAX / FP16_HEADROOM,
            "range_data": job.calibration_source}  # fmt: skip


#: MatMulNBits' accuracy_level with int8 activations (see :func:`quantize_int4`)
INT8_ACTIVATIONS_LEVEL = 4


#: weights per scale of the block-wise int8 form (llama.cpp's Q8_0 has 32)
INT8_BLOCK = 32
#: MatMulNBits' accuracy_level of the block-wise int8 form: 4, activations quantised to int8 per
#: block as llama.cpp's Q8_0 does (level 0's float activations keep a little more but decode some
#: 20x slower: docs/precisions.md)
INT8_BLOCKWISE_LEVEL = 4


def quantize_int4(src: Path, dst: Path, job: ConversionJob) -> dict[str, Any]:
    """Block-wise symmetric 4-bit weights for every MatMul with a constant weight (MatMulNBits)
    and for large embedding tables (GatherBlockQuantized); a table tied to an output layer reads
    that layer's weights instead of a copy of its own, and the output layer has ``job.head_bits``.

    ``job.accuracy_level`` (default: 4 where the graph's role asks for int8 activations, else 0): 0
    dequantises the weights and multiplies in float32; 4 quantises the activations to int8 on the
    fly. Measured here (2 cores of an AMD EPYC, AVX-512 VNNI, onnxruntime 1.32): a
    SmolLM2-135M-shaped decoder decoded 83-95 tokens/s at level 4 against 59-64 at level 0, its
    128-token prompt 0.17-0.24 s against 0.26-0.31 s; the reference encoder at 1 x 128 ran 34 ms
    at level 4 against 27 ms at 0.
    """
    if job.int4_bits == 8:  # a graph the role keeps at 8 bits: its block-wise int8
        return _int8_blockwise(src, dst, job)
    level = job.accuracy_level
    if level is None:
        level = INT8_ACTIVATIONS_LEVEL if job.int8_activations else 0
    return quantize_blockwise(src, dst, job, bits=4, block_size=job.block_size, accuracy_level=level,
                              head_bits=job.head_bits, method=job.int4_method)  # fmt: skip


def output_products(model: onnx.ModelProto) -> list[str]:
    """The MatMul nodes with a constant weight whose output is a graph output's only source: a
    language model's head (its logits)."""
    outputs = {o.name for o in model.graph.output}
    init = constant_weights(model)
    by_output = {o: n for n in model.graph.node for o in n.output}
    found = []
    for name in outputs:
        node = by_output.get(name)
        while node is not None and node.op_type in ("Reshape", "Identity", "Cast", "Squeeze", "Unsqueeze"):
            node = by_output.get(node.input[0])
        if node is not None and node.op_type == "MatMul" and node.input[1] in init:
            found.append(node.name)
    return found


def quantize_blockwise(src: Path, dst: Path, job: ConversionJob, bits: int, block_size: int, accuracy_level: int,
                       head_bits: int, symmetric: bool = True, method: str = "rtn") -> dict[str, Any]:  # fmt: skip
    """Block-wise ``bits``-bit weights (MatMulNBits) for every MatMul with a constant weight but
    those of ``job.exclude``, and for large embedding tables (GatherBlockQuantized); the output
    layer and the products ``job.wide_products`` names at ``head_bits`` (a second pass,
    symmetric), an embedding tied to the output layer reading its weights.
    ``symmetric`` False gives each block a zero point; ``method`` "rtn" rounds to the nearest
    level, "hqq" fits scales and zero points by half-quadratic optimisation (ONNX Runtime's HQQ,
    always with zero points), "gptq" writes ``job.fit``'s levels (symmetric) over the products it
    fits (:mod:`edgeattn.exporters.gptq`; round to nearest without a fit)."""
    with quiet_quantization():  # the module calls logging.basicConfig(level=INFO) on import
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            HQQWeightOnlyQuantConfig,
            MatMulNBitsQuantizer,
        )

    model = onnx.load(str(src), load_external_data=False)  # its weights once GPTQ's fit is made
    # the products made at head_bits in a second pass: the output layer and the role's wide ones
    weights = {n.name: n.input[1] for n in model.graph.node if n.op_type == "MatMul" and len(n.input) > 1}
    wide = [n for n, w in weights.items() if any(p in w for p in job.wide_products)]
    second = [] if head_bits == bits else [n for n in dict.fromkeys([*output_products(model), *wide])
                                           if n not in job.exclude]  # fmt: skip
    constant = constant_weights(model)
    products = {w: head_bits if n in second else bits for n, w in weights.items()
                if n not in job.exclude and w in constant}  # fmt: skip
    fitted = job.fit(products, block_size) if method == "gptq" and job.fit is not None else {}
    tied = tied_tables(model, src.parent)  # before the weights are read: a tied table is found by its region
    # products read through a Transpose of a checkpoint tensor are quantised from that tensor as
    # it lies ([out, in], MatMulNBits' layout) where the levels are symmetric; else folded first
    direct = method != "hqq" and symmetric
    transposed = transposed_products(model) if direct else {}
    sources = {w.tensor.name for _, w in transposed.values()}
    # the products' float weights are read one at a time as they are quantised, the rest now
    # (HQQ's quantiser reads weights with onnx.numpy_helper, which takes no absolute location: all now)
    read_in_place(model, src.parent, lazy=set() if method == "hqq" else set(products) | sources)
    if not direct:
        fold_transposes(model)
    check_fitted(model, fitted)
    direct_fits = {w: fit for w, fit in fitted.items() if w in transposed}
    taken = quantize_transposed(model, src.parent, products, block_size, accuracy_level, direct_fits,
                                set(job.exclude)) if direct else []  # fmt: skip
    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    small_tables = [  # embeddings too small to matter for the footprint keep their precision
        n.name for n in model.graph.node if n.op_type == "Gather" and sizes.get(n.input[0], 0) < LARGE_EMBEDDING
    ]  # fmt: skip
    tied = {gather: out for gather, out in tied.items() if gather not in small_tables}

    axes = (("MatMul", 0), ("Gather", 1))

    def run(proto: onnx.ModelProto, width: int, exclude: list[str], include: list[str] | None, sym: bool,
            how: str) -> onnx.ModelProto:  # fmt: skip
        # tables at 4 bits only (GatherBlockQuantized): asked at 8, ONNX Runtime logs an error per table and skips it
        ops = ("MatMul", "Gather") if width == 4 else ("MatMul",)
        if how == "hqq":
            config: Any = HQQWeightOnlyQuantConfig(block_size=block_size, bits=width, op_types_to_quantize=("MatMul",),
                                                   quant_axes=axes)  # fmt: skip
        else:
            config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=sym, bits=width,
                                                  accuracy_level=accuracy_level, op_types_to_quantize=ops,
                                                  quant_axes=axes)  # fmt: skip
        quantizer = MatMulNBitsQuantizer(
            proto, bits=width, block_size=block_size, is_symmetric=sym, accuracy_level=accuracy_level,
            op_types_to_quantize=ops, quant_axes=axes, nodes_to_exclude=exclude, nodes_to_include=include,
            algo_config=config,
        )  # fmt: skip
        with quiet_quantization():
            quantizer.process()
        return quantizer.model.model

    grid = "rtn" if method == "gptq" else method  # GPTQ's levels replace round-to-nearest's below
    proto = run(model, bits, [*small_tables, *tied, *job.exclude, *second], None, symmetric, grid)
    if second:
        proto = run(proto, head_bits, [], second, True, "rtn")
    written = [w for w in taken if w in direct_fits] + apply_fitted(proto, {w: fit for w, fit in fitted.items()
                                                                              if w not in taken})  # fmt: skip
    experts = quantize_experts(proto, bits, block_size)
    if method == "hqq":  # HQQ writes no accuracy_level: the level asked for is set on its products
        for node in proto.graph.node:
            if node.op_type == "MatMulNBits" and not any(a.name == "accuracy_level" for a in node.attribute):
                node.attribute.append(onnx.helper.make_attribute("accuracy_level", accuracy_level))
    shared = [name for name, output in tied.items() if share_tied_table(proto, name, output, block_size)]
    reduce_axes_as_inputs(proto)
    read_in_place(proto, src.parent, lazy=set())  # float weights no product took (kept by the quantiser)
    save_quantized(proto, dst)
    fitting: dict[str, Any] = {}
    if method == "gptq":
        method = "gptq" if written else "rtn"
        fitting = {"fitted_products": len(written), "fitted_on": job.fit_source} if written else \
            {"not_fitted_because": "no text to fit on: give --heldout or --calibration"}  # fmt: skip
    return {
        "bits": bits,
        "block_size": block_size,
        "symmetric": symmetric and method != "hqq",
        "method": method,
        **fitting,
        "operators": ["MatMulNBits", "GatherBlockQuantized"],
        "accuracy_level": accuracy_level,
        **({"output_layer_bits": head_bits, "at_output_layer_bits": second} if second else {}),
        **({"tied_tables": shared} if shared else {}),
        **({"excluded_nodes": list(job.exclude)} if job.exclude else {}),
        **({"experts": {"operator": "QMoE", "nodes": len(experts), "method": "rtn"}} if experts else {}),
    }


#: a graph whose weights pass this is saved with them in a data file laid out to map (protobuf's own
#: limit is 2 GiB): the gate's sessions map them instead of holding the serialised graph and a copy
MAPPED_ABOVE = 256 * 2**20


def tied_tables(model: onnx.ModelProto, folder: Path | None = None) -> dict[str, str]:
    """{Gather node: the output of the MatMul whose constant weight is that Gather's table transposed}
    (an embedding tied to the output layer: the same bytes of the same file, or equal values read
    from ``folder``, the graph's, where its weights are outside it)."""

    init = {t.name: t for t in model.graph.initializer}
    weights = constant_weights(model)
    tables = {n.name: n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in init
              and len(init[n.input[0]].dims) == 2}  # fmt: skip
    if not tables:
        return {}
    shapes = {tuple(init[n.input[0]].dims): name for name, n in tables.items()}
    out: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in weights:
            continue
        weight = weights[node.input[1]]
        gather = shapes.get(weight.shape[::-1])
        if gather is None or gather in out:
            continue
        table = init[tables[gather].input[0]]
        if weight.transpose is not None and _same_region(table, weight.tensor):
            out[gather] = node.output[0]
            continue
        values = _values(weight.tensor, folder)
        if np.array_equal(_values(table, folder), values if weight.transpose is not None else values.T):
            out[gather] = node.output[0]
    return out


def _values(tensor: onnx.TensorProto, folder: Path | None) -> np.ndarray:
    """An initializer's values: mapped from its file in ``folder`` where it is outside the graph."""
    if folder is None or tensor.data_location != onnx.TensorProto.EXTERNAL:
        return array_of(tensor)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    return np.frombuffer(external_view(tensor, folder), dtype=dtype).reshape(tuple(tensor.dims))


def _same_region(a: onnx.TensorProto, b: onnx.TensorProto) -> bool:
    """Whether two initializers are the same bytes of the same file (a tied checkpoint tensor)."""
    outside = onnx.TensorProto.EXTERNAL
    if a.data_location != outside or b.data_location != outside or a.data_type != b.data_type:
        return False
    return tuple(a.dims) == tuple(b.dims) and external_region(a) == external_region(b)


def share_tied_table(model: onnx.ModelProto, gather: str, output: str, block_size: int) -> bool:
    """Replace float Gather ``gather`` by a GatherBlockQuantized over the weights of the
    MatMulNBits that computes ``output`` (4 or 8 bits: uint8 data follow MatMulNBits' layout,
    zero point 8 or 128); False, and the graph unchanged, where that product was not quantised or
    its blocks are padded."""
    from onnx import helper, numpy_helper

    nodes = {n.name: n for n in model.graph.node}
    product = next((n for n in model.graph.node if n.op_type == "MatMulNBits" and output in n.output), None)
    if product is None or len(product.input) > 3 and product.input[3]:
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in product.attribute}
    k, n, bits = attrs["K"], attrs["N"], attrs.get("bits", 4)
    if k % block_size:
        return False
    node = nodes[gather]
    table = node.input[0]
    shape = f"{product.input[1]}_as_table_shape"
    model.graph.initializer.append(numpy_helper.from_array(np.array([n, k * bits // 8], np.int64), shape))
    reshaped = f"{product.input[1]}_as_table"
    replacement = [
        helper.make_node("Reshape", [product.input[1], shape], [reshaped], name=f"{gather}_table"),
        helper.make_node("GatherBlockQuantized", [reshaped, node.input[1], product.input[2]], list(node.output),
                         name=gather, domain="com.microsoft", gather_axis=0, quantize_axis=1, block_size=block_size,
                         bits=bits),  # fmt: skip
    ]
    index = list(model.graph.node).index(node)
    model.graph.node.remove(node)
    for offset, new in enumerate(replacement):
        model.graph.node.insert(index + offset, new)
    if not any(table in n.input for n in model.graph.node):
        model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == table))
    return True


#: Reduce operators whose ``axes`` moved from an attribute to an input in opset 18.
_REDUCE_OPS = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
               "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")  # fmt: skip


def reduce_axes_as_inputs(model: onnx.ModelProto) -> int:
    """Rewrite Reduce nodes that still carry ``axes`` as an attribute when the model's opset is 18 or
    later (the int4 quantiser raises the opset for GatherBlockQuantized and leaves the RMS norms'
    ReduceMean behind, which ONNX Runtime then refuses). Returns the number of nodes changed."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 18:
        return 0
    changed = 0
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in _REDUCE_OPS:
            continue
        axes = next((a for a in node.attribute if a.name == "axes"), None)
        if axes is None:
            continue
        name = f"{node.name or node.output[0]}_axes"
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(list(axes.ints), np.int64), name))
        node.attribute.remove(axes)
        while len(node.input) < 2:
            node.input.append("")
        node.input[1] = name
        changed += 1
    return changed


def quantizable_nodes(src: Path) -> list[str]:
    """Names of the nodes int8 quantisation would change (its operators with a constant weight)."""
    return _quantizable(onnx.load(str(src), load_external_data=False))


def quantizable_weights(src: Path) -> dict[str, str]:
    """{node int8 quantisation would change: the name of its constant weight} (the sensitive-node
    search groups nodes by the layer their weights belong to)."""
    model = onnx.load(str(src), load_external_data=False)
    weights = constant_weights(model)
    nodes = {n.name: n for n in model.graph.node}
    return {name: next(i for i in nodes[name].input if i in weights) for name in _quantizable(model)}


def converter(precision: str) -> Converter:
    """The converter its record names for ``precision`` (one made by converting a fused graph)."""
    from edgeattn.runtime.families import resolve

    named = get_precision(precision).converter
    if named is None:
        raise PrecisionError(f"precision {precision!r} is not made by a converter")
    found: Converter = resolve(named)
    return found
