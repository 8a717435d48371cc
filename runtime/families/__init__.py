"""Model families: one record each, saying what a family exports and how every layer treats it.

A family (an encoder, an encoder-decoder, ...) is its graph roles, each with its spec, the PyTorch
module it is exported from, the sizes verification runs it at, how calibration and gate inputs are
made, whether it runs once per source and which engines may run it; the family's tasks and the
graphs each needs; its eager stepper; and the runtime class :func:`edgeattn.runtime.load` returns
for it. Export, verify, gate, calibration, fusion, engine choice, precisions, memory policy,
Triton and the command line iterate over a family's roles instead of naming graphs.

Torch-free: the parts that need PyTorch (modules, gate and calibration inputs, the eager stepper)
are named as ``"module:attribute"`` and imported by the exporter (:func:`resolve`). Adding a
family is its own files (model, graph modules, runtime class), its importer, and one record here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from edgeattn.config import ModelConfig
from edgeattn.errors import ConfigError
from edgeattn.runtime import specs
from edgeattn.runtime.precisions import Precision, Thresholds, get_precision
from edgeattn.runtime.specs import GraphSpec

#: verification sizes: lengths never traced, batch 1 and > 1
_MID = 37


def _long(max_len: int) -> int:
    return min(max_len, max(64, 4 * specs.EXPORT_SIZES["src_len"]))


def attention_sizes(config: ModelConfig) -> list[dict[str, int]]:
    """A block's query and key lengths apart."""
    max_len = config.max_len
    mid, long = min(_MID, max_len), _long(max_len)
    shapes = [(1, 1, 1), (3, 1, mid), (3, mid, long), (1, long, 1)]
    return [{"batch": b, "tgt_len": t, "src_len": s} for b, t, s in shapes]


def source_sizes(config: ModelConfig) -> list[dict[str, int]]:
    """A source of length 1, 37 and long, batch 1 and 3."""
    max_len = config.max_len
    mid, long = min(_MID, max_len), _long(max_len)
    shapes = [(1, 1), (3, 1), (1, mid), (3, mid), (3, long)]
    return [{"batch": b, "src_len": s} for b, s in shapes]


def step_sizes(config: ModelConfig) -> list[dict[str, int]]:
    """Decoder steps after 0, 1 and many cached positions, one token and several."""
    max_len = config.max_len
    mid, long = min(_MID, max_len), _long(max_len)
    many = max(0, min(60, max_len - 6))
    shapes = [(1, mid, 1, 0), (3, mid, 1, 0), (3, mid, 1, 1), (3, mid, 1, many), (3, 1, 6, 0), (1, long, 6, many)]
    return [{"batch": b, "src_len": s, "tgt_len": t, "past_len": p} for b, s, t, p in shapes]


def slot_sizes(config: ModelConfig) -> list[dict[str, int]]:
    """:func:`step_sizes` over a cache of fixed capacity: room to spare after the new tokens, and a
    cache filled to the last slot."""
    sizes = step_sizes(config)
    return [{**z, "capacity": z["past_len"] + z["tgt_len"] + (0 if i % 2 else 7)} for i, z in enumerate(sizes)]


def causal_sizes(config: ModelConfig) -> list[dict[str, int]]:
    """A decoder-only model's prompt (all its logits, or the last token's) and its steps, over
    caches with slots to spare and filled to the last one."""
    max_len = config.max_len
    mid, long = min(_MID, max_len - 8), _long(max_len) - 8
    many = max(0, min(60, max_len - 8))
    shapes = [(1, mid, 0, 1, 5), (3, mid, 0, mid, 7), (3, 1, 1, 1, 0), (3, 1, many, 1, 3), (1, 6, many, 2, 0),
              (3, long, 0, 1, 2)]  # fmt: skip
    return [{"batch": b, "tgt_len": t, "past_len": p, "picked": k, "capacity": p + t + spare}
            for b, t, p, k, spare in shapes]  # fmt: skip


@dataclass(frozen=True)
class GraphRole:
    """One graph a family exports."""

    name: str
    spec: Callable[[ModelConfig], GraphSpec]
    #: the PyTorch module it is exported from, ``"module:class"`` (built from the whole model)
    module: str
    #: input sizes verification runs it at, none of them traced: ``sizes(config)``
    sizes: Callable[[ModelConfig], list[dict[str, int]]]
    #: ``"module:function"`` making calibration feeds: ``(model, spec, ids, mask, rng, new_tokens)``
    #: (None: the role has none yet, and its family's reduced precisions are refused)
    calibration: str | None
    #: ``"module:function"`` measuring it for the gate: ``(reference, runtime, name) -> metrics``
    #: (None: as ``calibration``)
    gate: str | None
    #: attention blocks a fused export of it holds: ``attention_blocks(config)``
    attention_blocks: Callable[[ModelConfig], int]
    #: run once per source rather than once per token (no memory arena by default: it would keep
    #: the largest batch's activations for good)
    once_per_source: bool = False
    #: OpenVINO may run it when the runtime chooses, in an export that does not generate (its
    #: operators permitting)
    openvino: bool = False
    #: the graphs an export of it brings along
    needs: tuple[str, ...] = ()
    #: whether ``--graphs`` offers it (a graph that is only ever brought along is not offered)
    requestable: bool = True
    #: a decoding step (a failed generation counts against it; a ``plain_form`` precision keeps its
    #: fused form)
    decodes: bool = False
    #: its self-attention keeps separate q/k/v projections in every fused form (MultiHeadAttention
    #: rather than packed Attention): ONNX Runtime's CPU kernel runs flash attention over unmasked
    #: inputs, with no (heads, T, T) scores to allocate, and block-wise quantisers reach the
    #: projections. Measured on the real Whisper tiny.en's audio encoder (1,500 frames, 2 cores of
    #: an AVX-512 EPYC, onnxruntime 1.32): int8 0.27-0.41 s a window (52,700 page faults a run
    #: for its 54 MB score buffers) against 0.19-0.20 s (none); packed stays the default because
    #: dynamic int8 turns packed Attention into one QAttention kernel
    separate_projections: bool = False
    #: its cache inputs are written in place (checked at export: nothing reads one after it is written)
    in_place: bool = False
    #: its int4 products quantise their activations to int8 on the fly (MatMulNBits accuracy_level 4):
    #: on this project's CPUs faster for a language model's decoding steps, with the gate to judge it
    int8_activations: bool = False
    #: the weights per scale of its int4 products (MatMulNBits block_size): 64 for a language
    #: model's decoder, measured here (2 cores of an AVX-512 EPYC, onnxruntime 1.32, a
    #: SmolLM2-360M-shaped decoder, accuracy_level 4): 62 tokens/s against 51 at 32, and 4.5 bits a
    #: weight against 5.0 (llama.cpp's Q4_0 is 4.5); the gate judges what it costs
    int4_block_size: int = 32
    #: the bits of its output layer (and an embedding tied to it) under int4: 8 for a language
    #: model's decoder, measured on the real SmolLM2-135M-Instruct (2026-12-03, 2 cores of an
    #: AVX-512 EPYC, standard-library prose, benchmarks/results/real-quality-smollm2-135m.json):
    #: perplexity +26.5% against +49.6% with a 4-bit head at block 64, for 90 MB against 76
    #: (llama.cpp keeps its output layer at 6 bits for the same reason)
    int4_head_bits: int = 4
    #: the bits of its products under int4: 8 for a graph whose products 4 bits lose even fitted
    #: (Whisper's audio encoder: one position's state of the real tiny.en turned to cosine -0.12 at
    #: 4 bits fitted by GPTQ on held-out speech, and its cross keys and values with it)
    int4_bits: int = 4
    #: products (by a part of their weight's name) int4 keeps at ``int4_head_bits`` too, as
    #: llama.cpp's Q4_K_M keeps some at 6: a language model's packed q/k/v projection. Measured on
    #: the real SmolLM2-135M-Instruct (2026-12-03, block 64, 8-bit head, GPTQ on 4,096 held-out
    #: tokens, perplexity on the evaluation split): q/k/v at 8 bits +4.7% at 98.3 MB; q/k/v and
    #: down +2.8% at 111.6 MB; down alone +13.7% at 103.3 MB; none +15.2% at 90.1 MB (llama.cpp:
    #: Q4_0 +24.1% at 92 MB, Q4_K_M +6.7% at 105.5 MB)
    int4_wide_products: tuple[str, ...] = ()
    #: how its int4 blocks are fitted: "rtn" (symmetric, rounded to the nearest level), "hqq"
    #: (ONNX Runtime's half-quadratic fit of a scale and zero point per block) or "gptq" (the
    #: role's ``fitter`` on calibration text, symmetric levels: the same operators and speed as
    #: "rtn"; rounded to nearest where there is no text). Measured on the real SmolLM2-135M-Instruct
    #: at block 64 with an 8-bit head and q/k/v: GPTQ +4.7%, RTN +18.9%; with q/k/v and down at 8
    #: bits GPTQ +2.8%, RTN +10.7%, HQQ +18.9% with down 4-bit too but its float zero points take
    #: ONNX Runtime 1.32's slow path (6.8 tokens/s decoding against RTN's 90)
    int4_method: str = "rtn"
    #: ``"module:function"`` fitting its int4 products by GPTQ, ``(model, data, bits_of, block,
    #: progress, source) -> {graph weight name: FittedWeight}`` (``int4_method`` "gptq"; ``data``:
    #: calibration rows of token ids, or what its family's ``fit_source`` gives; ``source``: the
    #: graph being quantised, whose weights the fitter may match against its products)
    fitter: str | None = None
    #: how its int8 variant is made: "dynamic" (MatMulInteger, activations quantised per tensor: the
    #: fastest for encoders) or "blockwise" (8-bit weights in blocks of 32, MatMulNBits, as llama.cpp's
    #: Q8_0): a real language model's large activations ruin per-tensor activations (SmolLM2-135M:
    #: perplexity +77% dynamic on a first sample of the text, +0.7% block-wise; llama.cpp Q8_0 +1.0%)
    int8_form: str = "dynamic"
    #: its reduced-precision variants keep their weights in a data file beside the graph, whatever
    #: their size: ONNX Runtime maps that file instead of parsing the weights out of the protobuf,
    #: and a SmolLM2-360M-shaped int4 decoder (204 MB) loaded with a peak of 363 MB instead of 431
    external_weights: bool = False
    #: the element types besides float32 its in-place caches take where a precision record's
    #: ``cache_dtype`` asks for one: "float16" (under fp16 a float32 cache around float16 attention
    #: would be a cast copy, not written in place, and GroupQueryAttention takes one element type
    #: for its query and its past), "int8" (GroupQueryAttention's int8 cache, scales per channel
    #: measured on the calibration text: :mod:`edgeattn.exporters.kv_cache`)
    cache_types: tuple[str, ...] = ()
    #: ``"module:function"`` writing its ONNX graph from the model, ``(model, spec) -> ModelProto``,
    #: instead of tracing ``module`` (which stays the eager reference it is verified against)
    builder: str | None = None
    #: the precisions a web or node bundle holds when none is named, by target, the first the
    #: export has (and the gate passed) chosen; none: fp32 (``edgeattn.exporters.web``). Keyed by
    #: the last graph of the family's bundle
    bundle_precisions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: (target, precision) -> why it runs far below the others there: packaged when asked, with a warning
    bundle_slow: dict[tuple[str, str], str] = field(default_factory=dict)

    def searches(self, precision: Precision) -> bool:
        """Whether a failing gate at ``precision`` searches this graph's sensitive nodes: where the
        precision's record says so, and for a fitted precision (int4) the role keeps at 8 bits, whose
        products are the int8 ones (searched as int8's are)."""
        return precision.sensitive_search or (precision.fitted and self.int4_bits == 8)

    def cache_dtype(self, precision: Precision) -> str:
        """The element type of its in-place caches at ``precision``."""
        return precision.cache_dtype if precision.cache_dtype in self.cache_types else "float32"


@dataclass(frozen=True)
class Family:
    """A model family: its graphs, its tasks, and the runtime class that runs its exports."""

    name: str
    #: ``ModelConfig.architecture`` of its models
    architecture: str
    roles: tuple[GraphRole, ...]
    #: task -> the graphs it runs
    tasks: dict[str, tuple[str, ...]]
    #: ``"module:class"`` of its PyTorch model (built from a config by ``edgeattn.model.build_model``)
    model: str
    #: ``"module:class"`` of the runtime :func:`edgeattn.runtime.load` returns
    runtime: str
    #: the graphs generation runs through (empty: the family does not generate)
    generation: tuple[str, ...] = ()
    #: ``"module:class"`` of the eager PyTorch stepper generation is checked against
    #: (``edgeattn.exporters.reference.eager_generate``)
    stepper: str | None = None
    #: what a family's exports are for, in a line
    summary: str = ""
    #: precision -> {metric: limit} replacing the precision's own thresholds for this family's
    #: graphs (a limit of 0 reports the metric without judging it)
    limits: dict[str, dict[str, float]] = field(default_factory=dict)
    #: the graphs a web or node bundle of it carries (empty: the targets do not run it)
    bundle_graphs: tuple[str, ...] = ()
    #: ``"module:function"`` describing its bundle for the JavaScript module,
    #: ``(manifest, described, folder) -> bundle.json's fields``
    bundle_describer: str | None = None
    #: ``"package:file"`` of its own ES module, copied beside ``edgeattn.mjs`` (whose ``load`` opens
    #: the module ``bundle.json`` names), for a family whose JavaScript is not in ``edgeattn.mjs``
    bundle_module: str | None = None
    #: whether its bundle carries transformers.js's files too (``config.json`` and the graph where
    #: transformers.js looks for it): its decoders take ``past_key_values``, which edgeattn's
    #: generating graphs do not
    transformers_js: bool = False
    #: ``"module:function"`` checking a bundle of it under Node.js against the Python runtime, for a
    #: family whose answers are not text: ``(bundle_dir, export_dir, node_modules, runtime, node,
    #: timeout, inputs) -> [BundleCheck]`` (None: the text families' check in ``exporters.web``)
    bundle_check: str | None = None
    #: ``"module:class"`` of the gate's eager float32 reference, ``(model, heldout, new_tokens,
    #: progress)``, and ``"module:function"`` measuring whole generation, ``(reference, runtime)``
    gate_reference: str = "edgeattn.exporters.gate:Reference"
    generation_gate: str = "edgeattn.exporters.gate:generation_metrics"
    #: ``"module:function"`` giving what its roles' ``fitter`` fits on, for a family whose
    #: calibration is not text: ``(gate reference) -> (data, what it is in words)``, or None where
    #: there is nothing real to fit on (None: text, ``--calibration`` else the held-out sequences)
    fit_source: str | None = None
    #: ``"module:function"`` reading ``--heldout`` for a family whose held-out inputs are not text,
    #: ``(path, settings) -> (features, prompt)`` (None: token sequences, one a line)
    heldout_reader: str | None = None
    #: what a gate on random held-out inputs cannot show, for its table (empty: the token families' words)
    random_caveat: str = ""
    #: ``"module:attribute"`` of the served task a family answers itself (its inputs, outputs and
    #: answers, for Triton and ``edgeattn serve``; None: the text tasks of :mod:`edgeattn.serving.tasks`)
    served: str | None = None
    #: whether ``edgeattn bench`` times its exports (the engine feeds token ids of a grid of shapes)
    benched: bool = True
    #: ``"module:function"`` listing the Hugging Face architectures it imports, ``() ->
    #: [edgeattn.hf.Importer]`` (gathered into ``edgeattn.hf.IMPORTERS``; None: it imports none)
    importers: str | None = None
    #: ``"module:function"`` timing an export of it its own way for ``edgeattn bench``, ``(export_dir,
    #: seqs, batches, threads, precisions) -> result`` with ``table()`` and ``to_dict()`` (None: the
    #: engine's grid of shapes)
    bencher: str | None = None
    #: ``"module:function"`` checking a greedy decode of its export against eager PyTorch,
    #: ``(model, runtime, rng, tokens) -> GreedyResult`` (``edgeattn.exporters.verify``)
    greedy_check: str = "edgeattn.exporters.verify:verify_greedy"
    graphs: dict[str, GraphRole] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "graphs", {r.name: r for r in self.roles})

    @property
    def graph_names(self) -> list[str]:
        return [r.name for r in self.roles]

    def caches(self, precision: str, dtype: str) -> bool:
        """Whether a graph of it keeps its in-place caches in ``dtype`` at ``precision``."""
        return any(role.cache_dtype(get_precision(precision)) == dtype for role in self.roles)

    @property
    def primary_graph(self) -> str:
        """The graph the family's first task runs first (whose session says what a model runs on)."""
        return next(iter(self.tasks.values()))[0]

    def role(self, name: str) -> GraphRole:
        """The role of graph ``name``, or a ConfigError naming the family's graphs."""
        if name not in self.graphs:
            raise ConfigError(f"a {self.name} model has no {name!r} graph; its graphs are {', '.join(self.graphs)}")
        return self.graphs[name]

    def thresholds(self, precision: str) -> Thresholds | None:
        """The gate's limits of ``precision`` for this family: the precision's, with the family's
        :attr:`limits` in place of some (None: the precision is not gated)."""
        own = get_precision(precision).thresholds
        if own is None:
            return None
        return replace(own, **self.limits.get(precision, {}))

    @property
    def ungated(self) -> list[str]:
        """The graphs it has no gate (or calibration) for: while any is, its reduced precisions are refused."""
        return [r.name for r in self.roles if r.gate is None or r.calibration is None]

    def calibrated(self, precision: str) -> bool:
        """Whether ``precision``'s graphs of this family are calibrated or fitted on
        representative inputs (``--calibration``)."""
        record = get_precision(precision)
        return record.calibrated or (record.fitted and any(r.fitter is not None for r in self.roles))

    def generates_with(self, graphs: Any) -> bool:
        """Whether ``graphs`` hold everything generation runs through."""
        return bool(self.generation) and set(self.generation) <= set(graphs)

    def generation_path(self, graphs: Any) -> list[str]:
        """The graphs generation runs through in an export that holds ``graphs``: a decoding step
        whose in-place form the export also holds runs as that form."""
        path = []
        for name in self.generation:
            in_place = [r.name for r in self.roles if r.in_place and name in r.needs and r.name in graphs]
            path.append(in_place[0] if in_place else name)
        return path

    def task_graphs(self, task: str) -> tuple[str, ...]:
        """The graphs ``task`` runs, or a ConfigError naming the family's tasks."""
        if task not in self.tasks:
            raise ConfigError(f"a {self.name} model does not {task}; its tasks are {', '.join(self.tasks)}")
        return self.tasks[task]


_BLOCKS_ONE: Callable[[ModelConfig], int] = lambda c: 1  # noqa: E731
_GRAPHS, _GATE, _CALIB = "edgeattn.exporters.graphs", "edgeattn.exporters.gate", "edgeattn.exporters.calibration"

ATTENTION = GraphRole(
    "attention", specs.attention_spec, f"{_GRAPHS}:AttentionGraph", attention_sizes, f"{_CALIB}:attention_calibration",
    f"{_GATE}:attention_metrics", _BLOCKS_ONE, openvino=True,
)  # fmt: skip
#: measured for bundles (benchmarks/results/targets.json: BERT-base at 1x128 2.4x faster than fp32
#: in Chromium's wasm on 2 threads, 1.6x on 1, a quarter of the bytes): int8 for a page and for Node.js
ENCODER = GraphRole(
    "encoder", specs.encoder_spec, f"{_GRAPHS}:EncoderGraph", source_sizes, f"{_CALIB}:encoder_calibration",
    f"{_GATE}:encoder_metrics", lambda c: c.n_encoder_layers, openvino=True,
    bundle_precisions={"web": ("int8",), "node": ("int8",)},
)  # fmt: skip
_WEB = "edgeattn.exporters.web"

ENCODER_FAMILY = Family(
    "encoder",
    "encoder",
    (ATTENTION, ENCODER),
    tasks={task: ("encoder",) for task in ("encode", "embed", "classify", "tag")},
    model="edgeattn.model:EncoderModel",
    runtime="edgeattn.runtime.families.encoder.runtime:EncoderRuntime",
    summary="an encoder alone (BERT family): hidden states, pooled embeddings, sequence or token labels",
    bundle_graphs=("encoder",),
    bundle_describer=f"{_WEB}:describe_encoder",
    importers="edgeattn.hf:encoder_importers",
    transformers_js=True,
)


def _decoder_blocks(c: ModelConfig) -> int:
    return 2 * c.n_decoder_layers


_SEQ2SEQ_DECODER = GraphRole(
    "decoder", specs.decoder_spec, f"{_GRAPHS}:DecoderGraph", step_sizes, f"{_CALIB}:decoder_calibration",
    f"{_GATE}:decoder_metrics", _decoder_blocks, needs=("encoder", "cross_kv"), decodes=True,
)  # fmt: skip

SEQ2SEQ_FAMILY = Family(
    "seq2seq",
    "encoder-decoder",
    (
        replace(ATTENTION, once_per_source=True),
        replace(ENCODER, once_per_source=True),
        GraphRole("cross_kv", specs.cross_kv_spec, f"{_GRAPHS}:CrossKVGraph", source_sizes,
                  f"{_CALIB}:cross_kv_calibration", f"{_GATE}:cross_kv_metrics", lambda c: 0, once_per_source=True,
                  requestable=False),
        _SEQ2SEQ_DECODER,
        replace(_SEQ2SEQ_DECODER, name="decoder_fixed", spec=specs.decoder_fixed_spec,
                module=f"{_GRAPHS}:FixedDecoderGraph", sizes=slot_sizes, needs=("decoder",), in_place=True),
    ),
    tasks={"generate": ("encoder", "cross_kv", "decoder")},
    model="edgeattn.model:Seq2SeqTransformer",
    runtime="edgeattn.runtime.families.seq2seq.runtime:Seq2SeqRuntime",
    generation=("encoder", "cross_kv", "decoder"),
    stepper="edgeattn.exporters.reference:EagerStepper",
    summary="an encoder-decoder (T5 family): text in, text out, generated token by token",
    # its decoder over a cache of fixed capacity; fp32 until its reduced precisions are measured there
    bundle_graphs=("encoder", "cross_kv", "decoder_fixed"),
    bundle_describer=f"{_WEB}:describe_seq2seq",
    importers="edgeattn.families.seq2seq.hf:importers",
)  # fmt: skip

CAUSAL_FAMILY = Family(
    "causal",
    "decoder-only",
    (
        GraphRole("causal_decoder", specs.causal_decoder_spec, f"{_GRAPHS}:CausalDecoderGraph", causal_sizes,
                  f"{_CALIB}:causal_calibration", f"{_GATE}:causal_metrics", lambda c: c.n_decoder_layers,
                  decodes=True, in_place=True, int8_activations=True, int4_block_size=64, int4_head_bits=8,
                  int4_wide_products=("attn.qkv_proj",), int4_method="gptq",
                  fitter="edgeattn.families.causal.fit:fit_causal", int8_form="blockwise",
                  external_weights=True, cache_types=("float16", "int8"),
                  builder="edgeattn.families.causal.graph_builder:build_causal_decoder",
                  # benchmarks/results/targets-lm.json (SmolLM2-135M-shaped, 128-token prompt, greedy):
                  # on onnxruntime-node int4 decodes fastest (88 tokens/s against int8's 69 and fp32's
                  # 37) from the fewest bytes (76 MB, 164, 651); in wasm int4 decodes at 2.1 tokens/s
                  # (its MatMulNBits kernels have no fast path there) against int8's 27 and fp32's 33,
                  # and int8 reads its prompt 2.3x faster than fp32 from a quarter of the bytes
                  bundle_precisions={"web": ("int8",), "node": ("int4", "int8")},
                  bundle_slow={("web", "int4"): "onnxruntime-web's wasm kernels decode a language model's int4 "
                               "some 12x slower than its int8 (2.1 against 27 tokens/s, SmolLM2-135M-shaped)"}),
    ),
    tasks={"complete": ("causal_decoder",)},
    model="edgeattn.families.causal.model:CausalLM",
    runtime="edgeattn.runtime.families.causal.runtime:CausalRuntime",
    generation=("causal_decoder",),
    stepper="edgeattn.exporters.reference:CausalEagerStepper",
    summary="a decoder-only language model (GPT-2, Llama, Qwen, Phi-3): prompts and chats in, text out",
    # Measured on real text (the real SmolLM2-135M-Instruct, standard-library prose, the same token
    # ids through llama.cpp, 2026-12-03): a correct reduced model's greedy continuation leaves
    # float32's at a near tie within 16 tokens on about half the rows (edgeattn int8: 0.50 exact;
    # llama.cpp's Q8_0 agrees with its f32 on 95.4% of next tokens, Q4_K_M on 85.8%), so a language
    # model is judged per token (teacher-forced top-1, perplexity kept, loops) and its exact-match
    # rate is reported, not judged. int8 and int4 are held to what llama.cpp's Q8_0 and Q4_K_M keep,
    # with a margin: Q8_0 keeps 0.990 of f32's perplexity (top-1 0.954), Q4_K_M 0.937 (0.858),
    # Q4_0 0.806 (0.660: refused). int4's loop check at 0.90: on 76 greedy continuations of that
    # text it falls into 4 loops float32's does not (loop_free 0.947), where its per-token figures
    # clear Q4_K_M-level limits; a model that loops in one continuation of ten is still refused.
    limits={"int8": {"exact_match": 0.0, "teacher_top1": 0.93, "perplexity_kept": 0.98},
            "int4": {"exact_match": 0.0, "teacher_top1": 0.75, "perplexity_kept": 0.88, "loop_free": 0.90}},
    bundle_graphs=("causal_decoder",),
    bundle_describer=f"{_WEB}:describe_causal",
    importers="edgeattn.families.causal.hf:importers",
    bencher="edgeattn.families.causal.bench:bench_export",
)  # fmt: skip

from edgeattn.runtime.families.speech.record import SPEECH_FAMILY  # noqa: E402  (its record builds on the roles above)

#: Every family, by name.
FAMILIES: dict[str, Family] = {f.name: f for f in (ENCODER_FAMILY, SEQ2SEQ_FAMILY, CAUSAL_FAMILY, SPEECH_FAMILY)}


def family_of(config: ModelConfig) -> Family:
    """The family of a config's architecture."""
    for family in FAMILIES.values():
        if family.architecture == config.architecture:
            return family
    raise ConfigError(f"no model family has architecture {config.architecture!r}")  # pragma: no cover


def get_family(name: str) -> Family:
    """The family called ``name``, or a ConfigError listing them."""
    if name not in FAMILIES:
        raise ConfigError(f"unknown model family {name!r}; families are {', '.join(FAMILIES)}")
    return FAMILIES[name]


def all_graph_names() -> tuple[str, ...]:
    """Every graph name any family exports, each once, in the families' order."""
    return tuple(dict.fromkeys(r.name for f in FAMILIES.values() for r in f.roles))


def all_tasks() -> tuple[str, ...]:
    """Every task any family has, each once."""
    return tuple(dict.fromkeys(t for f in FAMILIES.values() for t in f.tasks))


def task_family(task: str) -> Family:
    """The family whose models do ``task``, or a ConfigError listing the tasks."""
    for family in FAMILIES.values():
        if task in family.tasks:
            return family
    raise ConfigError(f"unknown task {task!r}; tasks are {', '.join(all_tasks())}")


def graph_spec(name: str, config: ModelConfig) -> GraphSpec:
    """The spec of graph ``name`` for this config."""
    family = family_of(config)
    if name not in family.graphs:
        if name in all_graph_names():
            raise ConfigError(f"graph {name!r} is not one a {family.name} model exports ({', '.join(family.graphs)}); "
                              f"this config is architecture={config.architecture!r}")  # fmt: skip
        raise ConfigError(f"unknown graph {name!r}; graphs are {', '.join(all_graph_names())}")
    return family.graphs[name].spec(config)


def offered_graphs() -> list[str]:
    """The graphs ``--graphs`` offers: every family's, less those only ever brought along."""
    return [g for g in all_graph_names() if any(f.graphs[g].requestable for f in FAMILIES.values() if g in f.graphs)]


def resolve_graphs(requested: list[str] | tuple[str, ...] | None, config: ModelConfig) -> list[str]:
    """The graphs to export: ``requested`` (default: every graph of the config's family), each
    bringing the graphs it needs along; a graph of another family is refused."""
    family = family_of(config)
    if not requested:
        return family.graph_names
    names = [n.strip() for n in requested if n.strip()]
    everything = all_graph_names()
    for n in names:
        if n not in everything:
            raise ConfigError(f"unknown graph {n!r}; choose from {', '.join(offered_graphs())}")
        if n not in family.graphs:
            owners = [f for f in FAMILIES.values() if n in f.graphs]
            raise ConfigError(
                f"graph {n!r} needs an {owners[0].architecture} model; this config is "
                f"architecture={config.architecture!r}"
            )
    wanted: set[str] = set()
    todo = list(names)
    while todo:
        n = todo.pop()
        if n not in wanted:
            wanted.add(n)
            todo.extend(family.graphs[n].needs)
    return [g for g in family.graph_names if g in wanted]


def resolve(reference: str) -> Any:
    """The object a ``"module:attribute"`` reference names (importing its module)."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)
