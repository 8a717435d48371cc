"""Latency floors: what one encoder forward costs in matrix products alone, measured in-run.

A layer's projections (packed QKV, output, feed-forward) are timed as one small ONNX graph of
those products alone, at the benchmark's own row count, on ONNX Runtime with the same threads and
spinning as the variants, with the kernels each precision's graphs run: float32 ``MatMul``; the
``DynamicQuantizeMatMul`` of dynamic int8; for static int8 and int4, the float32 layer put
through the export's own converter (quantise + ``MatMulIntegerToFloat``; ``MatMulNBits``).
Attention scores and weighted values are added at the float32 GEMM ceiling. No variant of that
precision can run faster than its floor with these kernels on this machine, so a floor's ratio
to eager PyTorch bounds what any graph rewrite can reach, and a variant's ratio to its own floor
is what graph rewrites and session settings can still win.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeattn.benchmark.timing import best_seconds
from edgeattn.config import ModelConfig
from edgeattn.host import dynamic_int8_weights

#: The floor each exported precision is held to (the kernels its graphs run on ONNX Runtime's CPU provider).
PRECISION_FLOORS = {"fp32": "fp32", "fp32-opt": "fp32", "int8": "int8", "int8-static": "int8-static", "int4": "int4"}


@dataclass
class Floor:
    """Matrix-product floors of one encoder forward at one shape, in milliseconds."""

    batch: int
    seq: int
    fp32_ms: float
    int8_ms: float
    attention_ms: float
    fp32_ratio: float = 0.0
    int8_ratio: float = 0.0
    #: every kind timed (fp32, int8, and int8-static / int4 where those variants ran), in ms
    kinds: dict[str, float] = field(default_factory=dict)
    #: each kind's ratio to the benchmark's baseline
    kind_ratios: dict[str, float] = field(default_factory=dict)


def projection_shapes(config: ModelConfig) -> list[tuple[int, int]]:
    """(in, out) of every weight matrix in one encoder layer."""
    d, f, inner = config.d_model, config.d_ff, config.n_heads * config.head_dim
    ff_in = [(d, f), (d, f)] if config.gated else [(d, f)]
    return [(d, 3 * inner), (inner, d), *ff_in, (f, d)]


def _layer_graph(config: ModelConfig, int8: bool, seed: int = 0, weights: str | None = None) -> bytes:
    """One layer's projections side by side, reading inputs ``x_<in>`` of shape (rows, in); int8
    weights of the type int8 graphs get on this CPU (``weights``: ``int8`` or ``uint8``, default
    :func:`edgeattn.host.dynamic_int8_weights`), full range, per column."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = weights or dynamic_int8_weights()  # the type int8 graphs are quantised to on this CPU
    nodes, inits, outputs = [], [], []
    inputs = {k for k, _ in projection_shapes(config)}
    for i, (k, n) in enumerate(projection_shapes(config)):
        w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
        if int8:
            scale = (np.abs(w).max(axis=0) / 127).astype(np.float32)
            q = np.clip(np.round(w / scale), -127, 127)
            zero = np.zeros(n) if weights == "int8" else np.full(n, 128)
            dtype = np.int8 if weights == "int8" else np.uint8
            inits += [numpy_helper.from_array((q + zero).astype(dtype), f"w{i}"),
                      numpy_helper.from_array(scale, f"s{i}"),
                      numpy_helper.from_array(zero.astype(dtype), f"z{i}")]  # fmt: skip
            nodes.append(helper.make_node("DynamicQuantizeMatMul", [f"x_{k}", f"w{i}", f"s{i}", f"z{i}"], [f"y{i}"],
                                          domain="com.microsoft"))  # fmt: skip
        else:
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            nodes.append(helper.make_node("MatMul", [f"x_{k}", f"w{i}"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["rows", n]))
    graph = helper.make_graph(
        nodes, "projections", [helper.make_tensor_value_info(f"x_{k}", TensorProto.FLOAT, ["rows", k]) for k in inputs],
        outputs, inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=opsets)).SerializeToString()


def _converted_layer(config: ModelConfig, kind: str, folder: Path) -> Path:
    """The float32 layer graph through the export's converter for ``kind`` (int8-static, int4)."""
    from edgeattn.exporters.quantize import CONVERTERS, ConversionJob

    src, dst = folder / "layer.fp32.onnx", folder / f"layer.{kind}.onnx"
    src.write_bytes(_layer_graph(config, False))
    rng = np.random.default_rng(2)
    calibration = [
        {f"x_{k}": rng.standard_normal((16, k)).astype(np.float32) for k, _ in projection_shapes(config)}
        for _ in range(4)
    ]  # fmt: skip
    CONVERTERS[kind](src, dst, ConversionJob(calibration=lambda: calibration))
    return dst


def _time_layer(config: ModelConfig, rows: int, kind: str, threads: int, repeats: int) -> float:
    from edgeattn.runtime.session import create_session

    with tempfile.TemporaryDirectory(prefix="edgeattn-floor-") as tmp:
        if kind in ("fp32", "int8"):
            path = Path(tmp) / "layer.onnx"
            path.write_bytes(_layer_graph(config, kind == "int8"))
        else:
            path = _converted_layer(config, kind, Path(tmp))
        session = create_session(path, threads=threads, spinning="run")
    rng = np.random.default_rng(1)
    feeds = {f"x_{k}": rng.standard_normal((rows, k)).astype(np.float32) for k, _ in projection_shapes(config)}
    return best_seconds(lambda: session.run(None, feeds), repeats) * 1e3


def attention_flops(config: ModelConfig, batch: int, seq: int) -> float:
    """FLOPs of attention scores and weighted values over all layers."""
    return float(batch * config.n_encoder_layers * 2 * seq * seq * config.d_model * 2)


def measure_floor(
    config: ModelConfig,
    batch: int,
    seq: int,
    threads: int,
    fp32_ceiling_gflops: float,
    repeats: int = 10,
    kinds: tuple[str, ...] = ("fp32", "int8"),
) -> Floor:
    """Floors of one forward at (batch, seq): best-of-``repeats`` projection time per layer times the
    layer count, plus attention at ``fp32_ceiling_gflops``; fp32 and int8 always, the other
    ``kinds`` (int8-static, int4) as asked."""
    rows = batch * seq
    attention_ms = attention_flops(config, batch, seq) / (fp32_ceiling_gflops * 1e9) * 1e3
    layers = config.n_encoder_layers
    timed = {
        kind: _time_layer(config, rows, kind, threads, repeats) * layers + attention_ms
        for kind in dict.fromkeys(("fp32", "int8", *kinds))
    }  # fmt: skip
    return Floor(batch, seq, timed["fp32"], timed["int8"], attention_ms, kinds=timed)
