"""Latency floors: what one encoder forward costs in its kernels alone, measured in-run.

Every encoder layer's projections (packed QKV, output, feed-forward; each layer with weights of
its own) run as one ONNX graph of those products alone, at the benchmark's own row count, on
ONNX Runtime with the same threads and spinning as the variants, with the kernels each
precision's graphs run: float32 ``MatMul``; the ``DynamicQuantizeMatMul`` of dynamic int8; for
static int8 and int4, the float32 layers put through the export's own converter (quantise +
``MatMulIntegerToFloat``; ``MatMulNBits``). Every layer's attention core (scores, softmax,
weighted values) runs, chained in one graph, on ONNX Runtime's kernels too: its fused
``MultiHeadAttention`` with the benchmark's padding mask, and plain ``MatMul -> Softmax ->
MatMul`` without one; the floor takes the faster (the arithmetic alone at the float32 GEMM
ceiling, the floors' attention before, is kept beside it as ``attention_ceiling_ms``). These
runs are timed in the variants' own interleaving and with their statistic (the median), so a
floor and the variants held to it see the same moment of the machine, and each is one run as a
variant's forward is. No variant of that precision can run faster than its floor with these
kernels on this machine, so a floor's ratio to eager PyTorch bounds what any graph rewrite can
reach, and a variant's ratio to its own floor is what graph rewrites and session settings can
still win.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.config import ModelConfig
from edgeattn.host import dynamic_int8_weights
from edgeattn.runtime.precisions import FLOAT_FLOOR, INT8_FLOOR, PRECISIONS

#: One run of a floor graph (timed by the caller).
Runner = Callable[[], object]

#: Opsets and IR version of the floor graphs: those of edgeattn's exports (opset 17, IR 8), which
#: every supported onnxruntime loads; onnx's own default IR version can be newer than an older
#: onnxruntime reads (onnx 1.21 writes IR 14, onnxruntime 1.24 reads up to 13).
FLOOR_IR_VERSION = 8
FLOOR_OPSETS = (("", 17), ("com.microsoft", 1))


def _floor_model(graph: Any) -> Any:
    """A model of ``graph`` at the floors' opsets and IR version."""
    from onnx import helper

    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in FLOOR_OPSETS], ir_version=FLOOR_IR_VERSION
    )


#: The floor each exported precision is held to (the kernels its graphs run on ONNX Runtime's CPU
#: provider): its record's ``floor``.
PRECISION_FLOORS = {p.name: p.floor for p in PRECISIONS.values() if p.floor is not None}


@dataclass
class Floor:
    """Matrix-product floors of one encoder forward at one shape, in milliseconds."""

    batch: int
    seq: int
    fp32_ms: float
    int8_ms: float
    #: the attention core of every layer at ONNX Runtime's faster attention kernel (see the module)
    attention_ms: float
    fp32_ratio: float = 0.0
    int8_ratio: float = 0.0
    #: every kind timed (fp32, int8, and int8-static / int4 where those variants ran), in ms
    kinds: dict[str, float] = field(default_factory=dict)
    #: each kind's ratio to the benchmark's baseline
    kind_ratios: dict[str, float] = field(default_factory=dict)
    #: the attention core's arithmetic alone at the float32 GEMM ceiling, every layer
    attention_ceiling_ms: float = 0.0
    #: the attention core per forward by kernel: {"fused": MultiHeadAttention, "unfused": MatMul/Softmax/MatMul}
    attention_kernels_ms: dict[str, float] = field(default_factory=dict)


def projection_shapes(config: ModelConfig) -> list[tuple[int, int]]:
    """(in, out) of every weight matrix in one encoder layer."""
    d, f, inner = config.d_model, config.d_ff, config.n_heads * config.head_dim
    ff_in = [(d, f), (d, f)] if config.gated else [(d, f)]
    return [(d, 3 * inner), (inner, d), *ff_in, (f, d)]


def _layer_graph(config: ModelConfig, int8: bool, seed: int = 0, weights: str | None = None, layers: int = 1) -> bytes:
    """``layers`` layers' projections side by side, each layer with weights of its own (``w<j>``,
    output ``y<j>``, j counting on over the layers), reading inputs ``x_<in>`` of shape (rows, in);
    int8 weights of the type int8 graphs get on this CPU (``weights``: ``int8`` or ``uint8``,
    default :func:`edgeattn.host.dynamic_int8_weights`), full range, per column."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = weights or dynamic_int8_weights()  # the type int8 graphs are quantised to on this CPU
    nodes, inits, outputs = [], [], []
    inputs = {k for k, _ in projection_shapes(config)}
    for i, (k, n) in enumerate(projection_shapes(config) * layers):
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
    model = _floor_model(graph)
    return onnx.shape_inference.infer_shapes(model).SerializeToString()


def _converted_layer(config: ModelConfig, kind: str, folder: Path, layers: int = 1) -> Path:
    """The float32 layers' graph through the export's converter for ``kind`` (int8-static, int4)."""
    from edgeattn.exporters.quantize import ConversionJob, converter

    src, dst = folder / "layer.fp32.onnx", folder / f"layer.{kind}.onnx"
    src.write_bytes(_layer_graph(config, False, layers=layers))
    rng = np.random.default_rng(2)
    calibration = [
        {f"x_{k}": rng.standard_normal((16, k)).astype(np.float32) for k, _ in projection_shapes(config)}
        for _ in range(4)
    ]  # fmt: skip
    converter(kind)(src, dst, ConversionJob(calibration=lambda: calibration))
    return dst


def _projections_session(config: ModelConfig, kind: str, threads: int) -> Any:
    """A session of every encoder layer's projections with ``kind``'s kernels."""
    from edgeattn.runtime.session import create_session

    layers = config.n_encoder_layers
    with tempfile.TemporaryDirectory(prefix="edgeattn-floor-") as tmp:
        if kind in (FLOAT_FLOOR, INT8_FLOOR):
            path = Path(tmp) / "layer.onnx"
            path.write_bytes(_layer_graph(config, kind == INT8_FLOOR, layers=layers))
        else:
            path = _converted_layer(config, kind, Path(tmp), layers)
        return create_session(path, threads=threads, spinning="run")


def _attention_graph(config: ModelConfig, fused: bool, layers: int = 1) -> bytes:
    """``layers`` attention cores in a chain (each one's output the next one's queries), softmax(q
    k^T) v unscaled: ``MultiHeadAttention`` over q, k, v ``(B, S, H*D)`` with a ``(B, S)`` key
    padding mask (``fused``), else ``MatMul -> Softmax -> MatMul`` over q, v ``(B, H, S, D)`` and k
    transposed, unmasked."""
    from onnx import TensorProto, helper

    inner, heads = config.n_heads * config.head_dim, config.n_heads
    out = helper.make_tensor_value_info(f"o{layers - 1}", TensorProto.FLOAT, None)
    nodes = []
    if fused:
        inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", inner]) for n in "qkv"]
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, ["b", "s"]))
        for i in range(layers):
            nodes.append(helper.make_node("MultiHeadAttention", [f"o{i - 1}" if i else "q", "k", "v", "", "mask"],
                                          [f"o{i}"], domain="com.microsoft", num_heads=heads, scale=1.0))  # fmt: skip
    else:
        inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims)
                  for n, dims in (("q", ["b", heads, "s", "d"]), ("kt", ["b", heads, "d", "s"]),
                                  ("v", ["b", heads, "s", "d"]))]  # fmt: skip
        for i in range(layers):
            nodes += [helper.make_node("MatMul", [f"o{i - 1}" if i else "q", "kt"], [f"scores{i}"]),
                      helper.make_node("Softmax", [f"scores{i}"], [f"p{i}"], axis=-1),
                      helper.make_node("MatMul", [f"p{i}", "v"], [f"o{i}"])]  # fmt: skip
    graph = helper.make_graph(nodes, "attention", inputs, [out])
    model = _floor_model(graph)
    return model.SerializeToString()


def _attention_feeds(config: ModelConfig, batch: int, seq: int) -> dict[str, dict[str, np.ndarray]]:
    """Inputs of the fused attention graph (with the benchmark's padding mask) and of the unfused
    one at (batch, seq), by kernel."""
    from edgeattn.benchmark.memory import bench_inputs

    rng = np.random.default_rng(3)
    heads, dim = config.n_heads, config.head_dim
    _, mask = bench_inputs(config.vocab_size, batch, seq)
    q, k, v = (rng.standard_normal((batch, heads, seq, dim)).astype(np.float32) for _ in range(3))
    return {
        "fused": {**{n: np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(batch, seq, heads * dim))
                     for n, x in zip("qkv", (q, k, v), strict=True)}, "mask": mask.astype(np.int32)},
        "unfused": {"q": q, "kt": np.ascontiguousarray(k.transpose(0, 1, 3, 2)), "v": v},
    }  # fmt: skip


def attention_flops(config: ModelConfig, batch: int, seq: int) -> float:
    """FLOPs of attention scores and weighted values over all layers."""
    return float(batch * config.n_encoder_layers * 2 * seq * seq * config.d_model * 2)


#: Prefixes of the floor runs' names in a shape's timings (see :func:`floor_runners`).
PROJECTIONS, ATTENTION = "floor projections ", "floor attention "


def floor_sessions(config: ModelConfig, threads: int, kinds: tuple[str, ...] = (FLOAT_FLOOR, INT8_FLOOR)
                   ) -> dict[str, Any]:  # fmt: skip
    """The sessions floors are timed with, by run name, built once for every shape (their row and
    sequence axes are free): every encoder layer's projections in one graph with each kind's
    kernels (fp32 and int8 always, the other ``kinds`` as asked), and every layer's attention
    core in one graph with each attention kernel."""
    from edgeattn.runtime.session import create_session

    sessions = {PROJECTIONS + kind: _projections_session(config, kind, threads)
                for kind in dict.fromkeys((FLOAT_FLOOR, INT8_FLOOR, *kinds))}  # fmt: skip
    for kind in ("fused", "unfused"):
        graph = _attention_graph(config, kind == "fused", config.n_encoder_layers)
        sessions[ATTENTION + kind] = create_session(graph, threads=threads, spinning="run")
    return sessions


def floor_runners(sessions: dict[str, Any], config: ModelConfig, batch: int, seq: int) -> dict[str, Runner]:
    """One run of each of :func:`floor_sessions`' sessions at (batch, seq), by name, to time beside
    the variants (same moment, same statistic)."""
    rng = np.random.default_rng(1)
    projections = {f"x_{k}": rng.standard_normal((batch * seq, k)).astype(np.float32)
                   for k, _ in projection_shapes(config)}  # fmt: skip
    attention = _attention_feeds(config, batch, seq)
    feeds = {name: projections if name.startswith(PROJECTIONS) else attention[name[len(ATTENTION) :]]
             for name in sessions}  # fmt: skip
    return {name: (lambda s=session, f=feeds[name]: s.run(None, f)) for name, session in sessions.items()}


def floor_of(config: ModelConfig, batch: int, seq: int, ms: dict[str, float], fp32_ceiling_gflops: float) -> Floor:
    """The floor at (batch, seq) from the floor runs' times ``ms`` (by :func:`floor_runners`' names):
    per kind, its projections plus the attention cores at the faster kernel.
    ``fp32_ceiling_gflops`` gives the attention arithmetic's time at the ceiling, reported beside it."""
    kernels = {name[len(ATTENTION) :]: t for name, t in ms.items() if name.startswith(ATTENTION)}
    attention_ms = min(kernels.values())
    timed = {name[len(PROJECTIONS) :]: t + attention_ms for name, t in ms.items() if name.startswith(PROJECTIONS)}
    ceiling_ms = attention_flops(config, batch, seq) / (fp32_ceiling_gflops * 1e9) * 1e3
    return Floor(batch, seq, timed[FLOAT_FLOOR], timed[INT8_FLOOR], attention_ms, kinds=timed,
                 attention_ceiling_ms=ceiling_ms, attention_kernels_ms=kernels)  # fmt: skip
