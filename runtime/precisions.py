"""Every precision an export can hold, one record each: the one place their facts live.

A record says what the precision is (for the CLI's help and the manual's table), how its graphs
are made (the fp32 export itself, the fused graph, or a converter run on a fused source form),
how it is judged (float32 parity, or the accuracy gate's thresholds) and which provider it is
for. The CLI, the exporters, the gate, the runtime and the benchmark read these records; a new
precision is one record here (naming its converter, for those made by converting a fused graph).

Torch-free and onnx-free: the CLI reads it at import time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

from edgeattn.errors import ExportError

#: The precision every export holds: the graphs as torch.onnx wrote them.
FP32 = "fp32"
#: The kernel floors every benchmark run times (``edgeattn.benchmark.floors``): float32 matrix
#: products and dynamic int8 ones; a precision's record names the floor it is held to
FLOAT_FLOOR, INT8_FLOOR = "fp32", "int8"
#: How static int8 calibration ranges are found.
CALIBRATION_METHODS = ("minmax", "entropy", "percentile")

Provider = Literal["any", "cpu", "gpu"]
Build = Literal["export", "fused", "convert", "engine"]


class PrecisionError(ExportError, ValueError):
    """A precision name that is not in the registry (given to an export, quantize or a benchmark)."""


@dataclass(frozen=True)
class FusedForm:
    """Which fused float32 graph a precision is made from.

    ``packed``: plain self-attention becomes ``Attention`` with one packed QKV weight (which
    dynamic int8 turns into QAttention); otherwise ``MultiHeadAttention`` after separate Q/K/V
    MatMuls (which static and weight-only quantisers reach).
    ``skip_layer_norm``: residual Add + LayerNormalization fused into SkipLayerNormalization. Off
    for CPU graphs: with onnxruntime 1.32 its CPU kernel took 200 us for a 128 x 512 block and
    1.6 ms for 1024 x 512, against 35 / 320 us for LayerNormalization plus Add (measured here);
    on for fp16, a GPU precision, where it saves a kernel launch per norm.
    """

    packed: bool = True
    skip_layer_norm: bool = False

    @property
    def tag(self) -> str:
        return ("packed" if self.packed else "mha") + ("-sln" if self.skip_layer_norm else "")

    def describe(self) -> str:
        """How the form differs from plain fused float32, in words (for the manifest)."""
        parts = ["packed QKV" if self.packed else "separate Q/K/V projections"]
        if self.skip_layer_norm:
            parts.append("SkipLayerNormalization")
        return ", ".join(parts)


#: How the manifest's ``source`` names a fused float32 graph a variant was made from.
FUSED_SOURCE = "fp32-opt"


def source_name(form: FusedForm | None) -> str:
    """The manifest's ``source`` of a variant made from ``form``'s fused graph (None: the fp32 graph)."""
    return FP32 if form is None else f"{FUSED_SOURCE} ({form.describe()})"


@dataclass(frozen=True)
class Verdict:
    """One metric of one graph below its limit."""

    graph: str
    metric: str
    measured: float
    limit: float

    def __str__(self) -> str:
        return f"{self.graph} {self.metric} {self.measured:.5f} < {self.limit}"


@dataclass(frozen=True)
class Thresholds:
    """The accuracy gate's minimum metric values for one precision (see ``edgeattn.exporters.gate``)."""

    cosine_mean: float
    cosine_min: float
    top1: float
    teacher_top1: float
    exact_match: float
    #: a language model's perplexity on held-out text, float32's over this precision's (1: none lost)
    perplexity_kept: float = 1.0
    #: the share of held-out greedy continuations that do not fall into a loop float32's does not
    loop_free: float = 1.0
    #: the share of float32's greedy tokens a speech model's decoding keeps (one minus their edit
    #: distance over float32's tokens)
    tokens_kept: float = 1.0
    #: the share of float32's transcript's words a speech model's transcript keeps (one minus its
    #: word error rate against float32's)
    words_kept: float = 1.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def limit(self, metric: str) -> float | None:
        """The limit of ``metric``, or None for a metric reported but not judged."""
        return self.to_dict().get(metric)

    def verdicts(self, metrics: dict[str, dict[str, float]]) -> list[Verdict]:
        """Every graph metric below its limit."""
        limits = self.to_dict()
        return [
            Verdict(graph, name, value, limits[name])
            for graph, values in metrics.items()
            for name, value in values.items()
            if name in limits and value < limits[name]
        ]


@dataclass(frozen=True)
class Precision:
    """Everything edgeattn knows about one precision."""

    name: str
    #: what the graphs are, in a line (help text, the manual)
    summary: str
    #: the tools that make them (the manual)
    made_with: str
    #: "export": the fp32 graphs themselves; "fused": the fused float32 graph of ``form``;
    #: "convert": a converter run on ``form``'s fused graph (on the plain fp32 graph for
    #: the graphs that do not decode when ``plain_form`` and asked, or where a model cannot fuse);
    #: "engine": the fp32 graphs,
    #: which ``engine`` runs at a lower precision of its own
    build: Build
    #: the fused float32 graph it is made from (None for fp32)
    form: FusedForm | None = None
    #: held to float32 parity (1e-4) by the verifier; else judged by the gate alone
    float32_parity: bool = False
    #: the accuracy gate's limits (None: not gated, fp32 is the reference)
    thresholds: Thresholds | None = None
    #: the execution provider the graphs are made for ("gpu" graphs are not timed on the CPU)
    provider: Provider = "cpu"
    #: when the gate fails, the most sensitive quantised nodes are kept in float32
    sensitive_search: bool = False
    #: quantisation ranges are calibrated on representative inputs (``--calibration``)
    calibrated: bool = False
    #: its weights are fitted on representative inputs where a graph's family role has a
    #: ``fitter`` (GPTQ: ``--calibration``, else the held-out text the gate does not measure)
    fitted: bool = False
    #: the graphs that are not decoding steps (a family role's ``decodes``: an encoder, attention,
    #: cross_kv) are made from the plain fp32 graph instead of ``form``'s fused one when the export
    #: asks for standard operators (``--static-form plain``, or ``auto`` for the graphs the runtime
    #: runs on OpenVINO)
    plain_form: bool = False
    #: the execution provider that runs the graphs ("engine" builds), and its options
    engine: str | None = None
    engine_options: tuple[tuple[str, str], ...] = ()
    #: the element type of the in-place caches of a graph whose family role can keep them so
    #: (``GraphRole.cache_types``; float32 elsewhere)
    cache_dtype: str = "float32"
    #: its file in a transformers.js folder (under ``onnx/``) and the ``dtype`` transformers.js
    #: loads it with, where transformers.js has one
    transformers_js: tuple[str, str] | None = None
    #: the kernels' floor its graphs are timed against on the CPU (``edgeattn.benchmark.floors``),
    #: if any
    floor: str | None = None
    #: its fused attention can take the padding as key lengths instead of a mask matrix
    #: (``edgeattn.exporters.mask_forms``; timed so by the latency benchmark)
    key_lengths: bool = False
    #: ``"module:function"`` converting a fused float32 graph into it ("convert" builds):
    #: ``(src, dst, ConversionJob) -> quantization info``
    converter: str | None = None

    @property
    def gated(self) -> bool:
        return self.thresholds is not None

    @property
    def engine_provider(self) -> tuple[str, dict[str, str]] | None:
        """``engine`` with its options, as ONNX Runtime takes a provider (None: any provider)."""
        return None if self.engine is None else (self.engine, dict(self.engine_options))


_FUSED_CPU = FusedForm()
_QUANTIZE = "edgeattn.exporters.quantize"
PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision(
            FP32,
            "the graphs as exported, float32",
            "`torch.onnx` (TorchScript exporter up to opset 20, dynamo above)",
            "export",
            float32_parity=True,
            provider="any",
            transformers_js=("model.onnx", "fp32"),
            floor=FLOAT_FLOOR,
        ),
        Precision(
            "fp32-opt",
            "every attention block fused, plus BiasGelu / FastGelu; layer norms stay LayerNormalization + Add",
            "edgeattn's fused export + `onnxruntime.transformers` optimizer",
            "fused",
            _FUSED_CPU,
            float32_parity=True,
            thresholds=Thresholds(0.99999, 0.9999, 1.0, 0.999, 0.99, 0.999, 1.0),
            floor=FLOAT_FLOOR,
            key_lengths=True,
        ),
        Precision(
            "int8",
            "dynamic int8, per-channel weights, embeddings too (a language model: 8-bit weights in blocks of 32, "
            "its key/value cache int8; a speech model: 8-bit weights in blocks of 32)",
            "`onnxruntime.quantization.quantize_dynamic`",
            "convert",
            _FUSED_CPU,
            thresholds=Thresholds(0.999, 0.98, 0.95, 0.95, 0.90, 0.95, 0.95),
            sensitive_search=True,
            cache_dtype="int8",
            transformers_js=("model_quantized.onnx", "q8"),
            floor=INT8_FLOOR,
            converter=f"{_QUANTIZE}:quantize_int8_dynamic",
        ),
        Precision(
            "int8-static",
            "QDQ int8, calibrated (" + ", ".join(f"`{m}`" for m in CALIBRATION_METHODS) + "); "
            "matrix products' outputs stay float32, float operators read float activations",
            "`quantize_static`",
            "convert",
            FusedForm(packed=False),
            thresholds=Thresholds(0.995, 0.95, 0.93, 0.93, 0.85, 0.93, 0.95),
            sensitive_search=True,
            calibrated=True,
            # with --static-form plain, standard operators only, so that other engines (OpenVINO) run
            # the whole graph (docs/precisions.md: the plain form); the decoders' cached step stays fused
            plain_form=True,
            floor="int8-static",
            converter=f"{_QUANTIZE}:quantize_int8_static",
        ),
        Precision(
            "fp16",
            "float16 weights and compute, norms and attention included (their kernels accumulate in float32), "
            "float32 I/O (a language model's in-place caches float16); SkipLayerNormalization",
            "`onnxruntime.transformers` float16 conversion",
            "convert",
            FusedForm(skip_layer_norm=True),
            thresholds=Thresholds(0.9999, 0.999, 0.99, 0.99, 0.95, 0.99, 1.0),
            provider="gpu",
            cache_dtype="float16",
            key_lengths=True,
            converter=f"{_QUANTIZE}:convert_fp16",
        ),
        Precision(
            "bf16",
            "the fp32 graphs run by OpenVINO in bfloat16 (CPUs with AVX-512 BF16 or AMX); near-lossless",
            "OpenVINO's `INFERENCE_PRECISION_HINT` (onnxruntime-openvino)",
            "engine",
            thresholds=Thresholds(0.99999, 0.9999, 0.99, 0.99, 0.95, 0.99, 1.0),
            engine="OpenVINOExecutionProvider",
            # without the CPU plugin's snippets, which fail to compile the decoders' cached attention
            # in bf16 ("BrgemmCPU node has incompatible input element types: f32 and bf16",
            # onnxruntime-openvino 1.24.1)
            engine_options=(("precision_hint", "bf16"), ("load_config", '{"CPU": {"SNIPPETS_MODE": "DISABLE"}}')),
        ),
        Precision(
            "int4",
            "block-wise 4-bit weights (block 32; a language model's decoder: block 64, fitted by GPTQ on real text, "
            "its output layer and q/k/v projections 8-bit, its key/value cache int8; a speech model's decoders "
            "fitted by GPTQ on held-out speech, their output layer, the audio encoder and cross keys/values 8-bit), "
            "4-bit embeddings when large",
            "`MatMulNBitsQuantizer` (MatMulNBits, GatherBlockQuantized); GPTQ fitted from the PyTorch model",
            "convert",
            FusedForm(packed=False),
            fitted=True,
            thresholds=Thresholds(0.99, 0.90, 0.90, 0.85, 0.70, 0.85, 0.95),
            cache_dtype="int8",
            transformers_js=("model_q4.onnx", "q4"),
            floor="int4",
            converter=f"{_QUANTIZE}:quantize_int4",
        ),
    )
}


def get_precision(name: str) -> Precision:
    """The record of ``name``, or a PrecisionError listing the known precisions."""
    try:
        return PRECISIONS[name]
    except KeyError:
        raise PrecisionError(f"unknown precision {name!r}; choose from {', '.join(PRECISIONS)}") from None


def reduced_precisions() -> list[str]:
    """Every precision an export may add beside fp32."""
    return [name for name in PRECISIONS if name != FP32]


def graph_precisions() -> list[str]:
    """Every precision whose graphs are its own: all but those an engine brings to the fp32 graphs
    (bf16), which a benchmark times as fp32 on that engine."""
    return [p.name for p in PRECISIONS.values() if p.engine is None]


def standard_operator_precisions() -> list[str]:
    """The precisions whose graphs can be of standard ONNX operators only, which another engine
    (OpenVINO) runs whole: fp32, and those made from the plain graph (``plain_form``)."""
    return [p.name for p in PRECISIONS.values() if p.build == "export" or p.plain_form]


def key_length_precisions() -> list[str]:
    """The precisions whose fused attention can take key lengths (``Precision.key_lengths``)."""
    return [p.name for p in PRECISIONS.values() if p.key_lengths]


def float32_precisions() -> list[str]:
    """The precisions held to float32 parity."""
    return [p.name for p in PRECISIONS.values() if p.float32_parity]


def parse_precisions(value: Iterable[str] | None) -> list[str]:
    """Requested precisions in registry order, fp32 always first; an unknown one is a PrecisionError."""
    requested = {get_precision(p.strip()).name for p in (value or []) if p.strip()}
    return [name for name in PRECISIONS if name == FP32 or name in requested]


def markdown_table() -> str:
    """The manual's (docs/precisions.md) table of precisions."""
    rows = ["| precision | what | made with |", "|---|---|---|"]
    rows += [f"| `{p.name}` | {p.summary} | {p.made_with} |" for p in PRECISIONS.values() if p.name != FP32]
    return "\n".join(rows)


def thresholds_table() -> str:
    """The manual's (docs/precisions.md) table of the accuracy gate's thresholds."""
    rows = [
        "| precision | cosine mean | cosine worst | top-1 | teacher-forced top-1 | generation exact match "
        "| perplexity kept | loop-free | tokens kept | words kept |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in PRECISIONS.values():
        if p.thresholds is not None:
            cells = [p.name, *(str(v) for v in p.thresholds.to_dict().values())]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
