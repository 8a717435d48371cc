"""The record type of a model family: its graph roles and what every layer does with them.

A family (an encoder, an encoder-decoder, ...) is its graph roles, each with its spec, the PyTorch
module it is exported from, the sizes verification runs it at, how calibration and gate inputs are
made, whether it runs once per source and which engines may run it; the family's tasks and the
graphs each needs; its eager stepper; and the runtime class :func:`edgeattn.runtime.load` returns
for it. Export, verify, gate, calibration, fusion, engine choice, precisions, memory policy,
Triton and the command line iterate over a family's roles instead of naming graphs.

Torch-free: the parts that need PyTorch (modules, gate and calibration inputs, the eager stepper)
are named as ``"module:attribute"`` and imported by the exporter
(:func:`edgeattn.runtime.families.resolve`). Each family's record is ``FAMILY`` in
``edgeattn.runtime.families.<family>.record``; the registry is :mod:`edgeattn.runtime.families`.
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

#: verification sizes: a middle length never traced (batch 1 and > 1 alike)
MID = 37


def long_length(max_len: int) -> int:
    """A long verification length, well past the traced one, within ``max_len``."""
    return min(max_len, max(64, 4 * specs.EXPORT_SIZES["src_len"]))


def blocks_one(config: ModelConfig) -> int:
    """One attention block (a graph of a single block)."""
    return 1


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
    #: projections; packed stays the default because dynamic int8 turns packed Attention into one
    #: QAttention kernel (docs/precisions.md: why the roles' defaults)
    separate_projections: bool = False
    #: its cache inputs are written in place (checked at export: nothing reads one after it is written)
    in_place: bool = False
    #: its int4 products quantise their activations to int8 on the fly (MatMulNBits accuracy_level 4):
    #: on this project's CPUs faster for a language model's decoding steps, with the gate to judge it
    int8_activations: bool = False
    #: the weights per scale of its int4 products (MatMulNBits block_size); the gate judges what a
    #: larger block costs
    int4_block_size: int = 32
    #: the bits of its output layer (and an embedding tied to it) under int4 (llama.cpp keeps its
    #: output layer at 6 bits for the same reason)
    int4_head_bits: int = 4
    #: the bits of its products under int4: 8 for a graph whose products 4 bits lose even fitted
    int4_bits: int = 4
    #: products (by a part of their weight's name) int4 keeps at ``int4_head_bits`` too, as
    #: llama.cpp's Q4_K_M keeps some at 6: a language model's packed q/k/v projection
    int4_wide_products: tuple[str, ...] = ()
    #: how its int4 blocks are fitted: "rtn" (symmetric, rounded to the nearest level), "hqq"
    #: (ONNX Runtime's half-quadratic fit of a scale and zero point per block) or "gptq" (the
    #: role's ``fitter`` on calibration text, symmetric levels: the same operators and speed as
    #: "rtn"; rounded to nearest where there is no text)
    int4_method: str = "rtn"
    #: ``"module:function"`` fitting its int4 products by GPTQ, ``(model, data, bits_of, block,
    #: progress, source) -> {graph weight name: FittedWeight}`` (``int4_method`` "gptq"; ``data``:
    #: calibration rows of token ids, or what its family's ``fit_source`` gives; ``source``: the
    #: graph being quantised, whose weights the fitter may match against its products)
    fitter: str | None = None
    #: how its int8 variant is made: "dynamic" (MatMulInteger, activations quantised per tensor: the
    #: fastest for encoders) or "blockwise" (8-bit weights in blocks of 32, MatMulNBits, as llama.cpp's
    #: Q8_0): a real language model's large activations ruin per-tensor activations
    int8_form: str = "dynamic"
    #: its reduced-precision variants keep their weights in a data file beside the graph, whatever
    #: their size: ONNX Runtime maps that file instead of parsing the weights out of the protobuf
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
    #: whether a model of this config has the graph (None: every model of the family has it), such as
    #: a text tower only some image models have
    applies: Callable[[ModelConfig], bool] | None = None

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
    #: ``"package:file"`` of the further ES modules its own imports, copied beside it
    bundle_assets: tuple[str, ...] = ()
    #: whether its bundles take text through the export's Hugging Face ``tokenizer.json`` (False: a
    #: family whose inputs are not text; a tokenizer it has is carried all the same)
    bundle_text: bool = True
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
    #: ``"module:Class"`` of its own section of the model config (``ModelConfig.section``, written
    #: under the family's name): a frozen dataclass with ``to_dict``, ``from_dict`` and ``check(config)``
    #: (and ``parameter_count()`` where it knows the model's size better); None: its models have none
    config_section: str | None = None
    #: the ModelConfig fields only its models set (another family's configs keep their defaults)
    config_fields: tuple[str, ...] = ()
    #: its models are an encoder with a decoder over it (the decoder attends to the encoder's states)
    encoder_decoder: bool = False
    #: ``"module:attribute"`` of its part of ``edgeattn run``, a :class:`edgeattn.run_options.RunHook`
    #: (the options its answers take and how it prints them; None: ``run`` does not take its exports)
    run_hook: str | None = None
    #: what the OpenAI-compatible API serves its exports as: "generate" (chat and completions,
    #: continuously batched), "embed" (embeddings) or "transcribe" (audio transcriptions and
    #: translations); empty: the API does not serve them
    api: str = ""
    #: ``"module:function"`` embedding the OpenAI API's input strings, ``(model, inputs) -> (N, d)``, for
    #: a family whose inputs are not only texts (a vision model's images arrive as data URLs or base64);
    #: None: the runtime's ``embed`` of the strings
    api_embed: str | None = None
    #: whether ``edgeattn bench`` times its exports (the engine feeds token ids of a grid of shapes)
    benched: bool = True
    #: ``"module:function"`` listing the Hugging Face architectures it imports, ``() ->
    #: [edgeattn.hf.Importer]`` (gathered into ``edgeattn.hf.IMPORTERS``; None: it imports none)
    importers: str | None = None
    #: ``"module:function"`` timing an export of it its own way for ``edgeattn bench``, ``(export_dir,
    #: seqs, batches, threads, precisions) -> result`` with ``table()`` and ``to_dict()`` (None: the
    #: engine's grid of shapes)
    bencher: str | None = None
    #: ``"module:function"`` timing its decoding step after ``edgeattn bench``'s grid, ``(export_dir,
    #: positions, threads, repeats, src_len) -> result`` with ``table()`` and ``to_dict()`` (None: none)
    generation_bench: str | None = None
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

    def section_class(self) -> type | None:
        """The class of its own config section, or None."""
        return None if self.config_section is None else resolve(self.config_section)

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


def resolve(reference: str) -> Any:
    """The object a ``"module:attribute"`` reference names (importing its module)."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)
