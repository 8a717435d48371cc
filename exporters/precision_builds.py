"""Reduced-precision and optimised variants of an export's graphs, each gated against eager float32.

For every precision the builder makes one candidate graph per exported graph (the fused float32
graph, or a converter's output from the precision's source form, see
``edgeattn.runtime.precisions``), stamps it, and measures the candidates from ONNX Runtime
sessions built in memory: the accuracy gate for every gated precision, float32 parity as well for
those held to it. When a precision with a sensitive-node search misses its limits, the nodes
whose quantisation hurts most are kept in float32, as few as needed to pass. Nothing reaches the
export directory until :meth:`PrecisionBuilder.commit` writes the chosen candidates; the caller
records the entries it returns in the manifest.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgeattn.config import ModelConfig
from edgeattn.errors import ExportError, VerificationError
from edgeattn.exporters.calibration import calibration_feeds, describe_calibration
from edgeattn.exporters.compact import (
    CheckpointIndex,
    copy_regions,
    data_locations,
    fold_transposes,
    share_between,
    share_weights,
)
from edgeattn.exporters.fusion import can_fuse, fused_copy, optimize_fused
from edgeattn.exporters.gate import GATE_TOKENS, GateResult, HeldOut, Reference, evaluate, spread_rows
from edgeattn.exporters.gptq import ROW_TOKENS, calibration_rows
from edgeattn.exporters.kv_cache import (
    DRAWN_MARGIN,
    SCALE_ROW_TOKENS,
    SCALE_ROWS,
    SCALE_TOKENS,
    CacheScales,
    measure_scales,
    quantize_cache,
    why_not_supported,
)
from edgeattn.exporters.onnx_export import (
    ELEMENT_TYPES,
    PROTOBUF_LIMIT,
    export_graph,
    finalize,
    save_checked,
    written_graph,
)
from edgeattn.exporters.operators import fused_attention_count, operator_counts
from edgeattn.exporters.quantize import ConversionJob, converter, quantizable_weights
from edgeattn.exporters.sensitivity import SEARCH_SECONDS, SearchResult, Trial, group_nodes, search_sensitive
from edgeattn.exporters.verify import VerifyReport, verify_graphs
from edgeattn.host import release_freed_memory
from edgeattn.model import TransformerModel
from edgeattn.phases import phase
from edgeattn.runtime.engines import OPENVINO_AUTO, choose_engine, engine_emulated, engine_unavailable
from edgeattn.runtime.exported_model import ExportedModel
from edgeattn.runtime.families import family_of, resolve
from edgeattn.runtime.layout import WEIGHTS, external_data_file, graph_file, shared_data_file
from edgeattn.runtime.manifest import DataFile, GraphEntry, Parity, Variant, sha256_file
from edgeattn.runtime.precisions import FUSED_SOURCE, FusedForm, Precision, get_precision, source_name
from edgeattn.runtime.session import CPU
from edgeattn.runtime.specs import LOGITS_AT, graph_spec, is_in_place_cache

log = logging.getLogger(__name__)

#: the fewest held-out tokens the gate does not measure that GPTQ fits on (else it fits on all)
FIT_TOKENS = 1024

Model = TransformerModel


#: the source key of a graph its role's builder writes fused (one file for every form)
WRITTEN = "written"

#: What int8-static's attention, encoder and cross_kv graphs can be made from (see PrecisionOptions).
STATIC_FORMS = ("auto", "fused", "plain")
#: How a language model's int8 and int4 keep their key/value cache (see PrecisionOptions).
KV_CACHES = ("int8", "float32")


@dataclass
class PrecisionOptions:
    """How reduced precisions are made and judged."""

    calibration_method: str = "minmax"
    #: static int8 calibration sequences (token ids); None draws them from the model's vocabulary
    calibration_data: list[list[int]] | None = None
    #: where ``calibration_data`` came from, recorded in the manifest
    calibration_source: str = ""
    #: the gate's held-out sequences (token ids); None uses the task's own or draws them
    heldout_data: list[list[int]] | None = None
    #: where ``heldout_data`` came from, recorded in the manifest
    heldout_source: str = ""
    #: a speech model's held-out audio as windows of log-mel features (W, n_mels, frames), in place of
    #: ``heldout_data`` (``heldout_source`` says what they are)
    heldout_features: np.ndarray | None = None
    #: the prompt each held-out window is decoded after (a speech model's start, language, task)
    heldout_prompt: list[int] | None = None
    #: the export's tokenizer: the gate reads a transcript's words with it (None: measures that need
    #: words are not taken)
    tokenizer: Any = None
    #: the most held-out tokens the gate measures (rows spread evenly over a larger file; 0: all)
    gate_tokens: int = GATE_TOKENS
    allow_degraded: bool = False
    #: run the sensitive-node search when a precision that has one misses its limits
    sensitive_search: bool = True
    #: the search's time budget per graph, and the held-out tokens its trials are measured on
    search_seconds: float = SEARCH_SECONDS
    search_tokens: int = 2048
    new_tokens: int = 16
    external_threshold: int = PROTOBUF_LIMIT
    #: what a ``plain_form`` precision's graphs that do not decode (int8-static's attention, encoder
    #: and cross_kv) are made
    #: from: "fused", the precision's fused form (ONNX Runtime's own attention operators; the
    #: faster on ONNX Runtime), "plain", the fp32 graph (standard operators only, for any engine:
    #: OpenVINO runs it whole), or "auto": plain for each graph the runtime would run on OpenVINO
    #: on this machine (:func:`edgeattn.runtime.engines.choose_engine`), else fused
    static_form: str = "auto"
    #: a language model's int8 and int4 key/value cache: "int8" (where the graph and ONNX Runtime
    #: can: decoding reads half the bytes, prompts over ~1,000 tokens run slower) or "float32"
    kv_cache: str = "int8"

    def __post_init__(self) -> None:
        if self.static_form not in STATIC_FORMS:
            raise ExportError(f"static form {self.static_form!r} is not one of {', '.join(STATIC_FORMS)}")
        if self.kv_cache not in KV_CACHES:
            raise ExportError(f"key/value cache {self.kv_cache!r} is not one of {', '.join(KV_CACHES)}")


@dataclass
class Candidate:
    """One graph at one precision as its converter wrote it, not yet stamped or in the export."""

    graph: str
    precision: str
    #: the serialised graph, or its file where it keeps weights outside (over protobuf's 2 GiB)
    model: bytes | Path
    #: manifest fields of the variant besides its file (quantisation settings, source, fusion counts)
    fields: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, graph: str, precision: str, path: Path, fields: dict[str, Any], keep: bool) -> Candidate:
        """The candidate in ``path``: its bytes, or the file itself when it has external data (or
        ``keep``: a file that stays where it is)."""
        if keep or path.with_name(external_data_file(path.name)).exists():
            return cls(graph, precision, path, fields)
        return cls(graph, precision, path.read_bytes(), fields)

    def stamped(self, config: ModelConfig) -> onnx.ModelProto:
        """The graph with the spec's axis names and edgeattn's metadata, as the export holds it (a
        candidate in a file keeps its weights there: they are copied, never held whole)."""
        if isinstance(self.model, bytes):
            proto = onnx.load_from_string(self.model)
        else:
            proto = onnx.load(str(self.model), load_external_data=False)
        spec = graph_spec(self.graph, config)
        caches = [v.type.tensor_type.elem_type for v in proto.graph.input if is_in_place_cache(v.name)]
        if caches and caches[0] != onnx.TensorProto.FLOAT:  # as the converter wrote them (float16, int8)
            spec = spec.with_cache_dtype(ELEMENT_TYPES[caches[0]])
        finalize(proto, config, spec, self.precision)
        return proto


@dataclass
class PrecisionBuild:
    """The graphs chosen for one precision and how they measured."""

    precision: str
    candidates: dict[str, Candidate]
    gate: GateResult | None
    parity: VerifyReport | None = None

    @property
    def degraded(self) -> bool:
        return self.gate is not None and not self.gate.passed


def check_engine(precision: Precision) -> None:
    """ExportError unless ``precision``'s engine runs it here as asked (the gate would otherwise
    measure something else: float32, or nothing)."""
    problem = engine_unavailable(precision) or engine_emulated(precision)
    if problem is not None:
        raise ExportError(f"{precision.name} is {precision.summary}; it cannot be made and gated here: {problem}")


def fit_sequences(options: PrecisionOptions) -> tuple[list[list[int]], str] | None:
    """What GPTQ fits on, and in words: ``--calibration``'s sequences, else the held-out ones the
    gate does not measure (all of them, said so, when those hold fewer than :data:`FIT_TOKENS`);
    None where there is no real text (the gate's own random sequences fit nothing)."""
    if options.calibration_data:
        return options.calibration_data, describe_calibration(options.calibration_data, options.calibration_source)
    if not options.heldout_data:
        return None
    measured = set(spread_rows([len(s) for s in options.heldout_data], options.gate_tokens))
    rest = [s for i, s in enumerate(options.heldout_data) if i not in measured]
    tokens = sum(len(s) for s in rest)
    source = options.heldout_source or "held-out sequences"
    if tokens >= FIT_TOKENS:
        return rest, f"{source}: the {len(rest)} sequences the gate does not measure ({tokens:,} tokens)"
    log.warning("GPTQ fits on the held-out sequences the gate measures (those it does not hold %d tokens, "
                "fewer than %d): the gate is not blind to the fit; give --calibration", tokens, FIT_TOKENS)  # fmt: skip
    return options.heldout_data, f"{source}, which the gate measures too"


class PrecisionBuilder:
    """Makes and judges every precision of one model's export.

    ``graphs`` are the export's fp32 entries, whose files sit in ``fp32_dir``; ``heldout`` is what
    the gate measures on; ``progress`` shows the float32 parity check's bar. Scratch files (fused
    source forms, converter outputs) live in a temporary directory beside ``fp32_dir`` until
    :meth:`close`.
    """

    def __init__(self, model: Model, graphs: dict[str, GraphEntry], fp32_dir: Path, heldout: HeldOut,
                 options: PrecisionOptions, progress: bool = False) -> None:  # fmt: skip
        self.model = model.eval()
        self.family = family_of(model.config)
        self.progress = progress
        self.entries = graphs
        self.graphs = list(graphs)
        self.fp32_dir = fp32_dir
        self.options = options
        self.reference: Reference = resolve(self.family.gate_reference)(self.model, heldout, options.new_tokens,
                                                                        progress)
        self.fusable, self.not_fused_because = can_fuse(self.model)
        # named after the export being built (its partial folder): a killed export's scratch is
        # removed with its partial folder by the next writer (recover_interrupted)
        self._scratch = Path(tempfile.mkdtemp(prefix=f"{fp32_dir.resolve().name}.scratch-",
                                              dir=fp32_dir.resolve().parent))  # fmt: skip
        self._sources: dict[tuple[str, FusedForm | str | None], Path] = {}
        self._auto_plain: dict[str, bool] = {}
        self._made = 0
        self._index: CheckpointIndex | None = None
        #: scratch files written beside the checkpoint (a graph pointing at it), removed on close
        self._beside: list[Path] = []
        self._calibration: dict[str, list[dict[str, np.ndarray]]] = {}
        self._cache_scales: dict[str, CacheScales] = {}
        self._search_reference: Reference | None = None
        #: the latest sensitive-node search of each graph
        self.searches: dict[str, SearchResult[Candidate]] = {}

    def close(self) -> None:
        shutil.rmtree(self._scratch, ignore_errors=True)
        for path in self._beside:
            path.unlink(missing_ok=True)

    def __enter__(self) -> PrecisionBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- sources
    def source(self, graph: str, precision: Precision) -> Path:
        """The float32 graph ``precision`` is made from: the fused graph of its form when this model
        fuses (built once per form, in scratch), else the exported fp32 graph with its weights
        taken out of the checkpoint as plain initializers (the quantisers need them so)."""
        form = self._form(graph, precision)
        if not self.fusable or form is None:
            if (graph, None) not in self._sources:
                dst = self._scratch / f"{graph}.fp32-folded.onnx"
                proto = fold_transposes(onnx.load(str(self.fp32_dir / self.entries[graph].file)))
                save_checked(proto, dst, self.options.external_threshold)
                self._sources[(graph, None)] = dst
            return self._sources[(graph, None)]
        # a graph its role's builder writes is fused the same whatever the form: made once
        key = (graph, WRITTEN if self.family.role(graph).builder is not None else form)
        if key not in self._sources:
            self._sources[key] = self._fused(graph, form)
        return self._sources[key]

    def _form(self, graph: str, precision: Precision) -> FusedForm | None:
        role = self.family.role(graph)
        if precision.plain_form and not role.decodes and self._plain(graph):
            return None
        form = precision.form
        if form is not None and form.packed and role.separate_projections:
            form = replace(form, packed=False)
        return form

    def _plain(self, graph: str) -> bool:
        """Whether ``graph``'s ``plain_form`` variants are made from its plain fp32 graph."""
        if self.options.static_form != "auto":
            return self.options.static_form == "plain"
        if graph not in self._auto_plain:
            engine = choose_engine(self.family.role(graph), self.fp32_dir / self.entries[graph].file,
                                   self.family.generates_with(self.entries))  # fmt: skip
            self._auto_plain[graph] = engine.providers[0] == OPENVINO_AUTO
            if self._auto_plain[graph]:
                log.info("%s: static int8 made from the plain graph: the runtime runs it on OpenVINO here "
                         "(--static-form fused for ONNX Runtime's fused form)", graph)  # fmt: skip
        return self._auto_plain[graph]

    def _blocks(self, graph: str) -> int:
        """How many attention blocks ``graph`` holds (its family role says)."""
        return self.family.role(graph).attention_blocks(self.model.config)

    def _source_name(self, graph: str, precision: Precision) -> str:
        return source_name(self._form(graph, precision) if self.fusable else None)

    def _fused(self, graph: str, form: FusedForm) -> Path:
        raw = self._scratch / f"{graph}.fused-raw.onnx"
        dst = self._scratch / f"{graph}.fused-{form.tag}.onnx"
        if self.family.role(graph).builder is not None:  # written fused, whatever the form
            checkpoint = self._checkpoint(self.fp32_dir) if self.family.role(graph).external_weights else None
            if checkpoint is not None:  # beside the checkpoint, pointing at its tensors instead of copying them
                dst = self.fp32_dir / f".{dst.name}"
                self._beside.extend([dst, dst.with_name(external_data_file(dst.name))])
            data = dst.with_name(external_data_file(dst.name)) if self.family.role(graph).external_weights else None
            proto, _ = written_graph(self.model, graph, fused=True, data=data,
                                     checkpoint=checkpoint[1] if checkpoint is not None else None)  # fmt: skip
        else:
            export_graph(fused_copy(self.model, form.packed), graph, raw, opset=min(self.entries[graph].opset, 20),
                         external_threshold=self.options.external_threshold,
                         fused=self._blocks(graph) > 0)  # fmt: skip
            proto = optimize_fused(raw, self.model, form)
            finalize(proto, self.model.config, graph_spec(graph, self.model.config), FUSED_SOURCE)
        expected, fused = self._blocks(graph), fused_attention_count(operator_counts(proto))
        # weights outside the graph where its role keeps them so: checked without a copy in memory
        save_checked(proto, dst, 0 if self.family.role(graph).external_weights else self.options.external_threshold)
        del proto
        release_freed_memory()
        if fused != expected:
            raise ExportError(f"{graph}: {fused} of {expected} attention blocks fused; all must be")
        return dst

    # ------------------------------------------------------------- candidates
    def candidate(self, precision: Precision, graph: str, exclude: list[str] | None = None) -> Candidate:
        """``graph`` at ``precision``, with ``exclude`` nodes kept in float32 where the converter can."""
        src = self.source(graph, precision)
        source = {"source": self._source_name(graph, precision)}
        if precision.build == "fused":
            counts = operator_counts(onnx.load(str(src), load_external_data=False))
            fields: dict[str, Any] = {
                "fused_operators": counts,
                "attention_blocks": self._blocks(graph),
                "attention_fused": fused_attention_count(counts),
                **({} if self.fusable else {"not_fused_because": self.not_fused_because}),
            }
            return Candidate.read(graph, precision.name, src, {**fields, **source}, keep=False)
        if precision.build == "engine":  # the fp32 graph itself: its engine brings the precision
            return Candidate.read(graph, precision.name, src, source, keep=False)
        if precision.build != "convert":
            raise ExportError(f"precision {precision.name!r} is the export itself, not a variant of it")
        self._made += 1
        work = self._scratch / f"candidate-{self._made}"
        work.mkdir()
        dst = work / graph_file(graph, precision.name)
        job = ConversionJob(
            exclude=list(exclude or []), calibration=lambda: self._calibration_feeds(graph),
            calibration_method=self.options.calibration_method,
            calibration_source=describe_calibration(self.options.calibration_data, self.options.calibration_source),
            int8_activations=self.family.role(graph).int8_activations,
            block_size=self.family.role(graph).int4_block_size, head_bits=self.family.role(graph).int4_head_bits,
            int4_bits=self.family.role(graph).int4_bits,
            int8_form=self.family.role(graph).int8_form, int4_method=self.family.role(graph).int4_method,
            wide_products=self.family.role(graph).int4_wide_products,
            float16_cache=self.family.role(graph).cache_dtype(precision) == "float16",
        )  # fmt: skip
        if precision.fitted and self.family.role(graph).fitter is not None and self.fit_data is not None:
            job.fit = lambda bits_of, block: self._fit(graph, bits_of, block, src)
            job.fit_source = self.fit_data[1]
        info = converter(precision.name)(src, dst, job)
        release_freed_memory()
        fields = {"quantization": info, **source}
        if self.family.role(graph).cache_dtype(precision) == "int8":
            fields["kv_cache"] = self._int8_cache(graph, src, dst)
        candidate = Candidate.read(graph, precision.name, dst, fields, keep=False)
        if isinstance(candidate.model, bytes):
            shutil.rmtree(work)
        else:  # its files (weights a session maps) go with it: a search's rejected trials do not pile up
            weakref.finalize(candidate, shutil.rmtree, work, True)
        return candidate

    def _int8_cache(self, graph: str, src: Path, dst: Path) -> dict[str, Any]:
        """The converted graph in ``dst`` made to keep its cache in int8, scales measured on the
        float graph ``src``; the manifest's record of its cache either way."""
        why = "--kv-cache float32 was asked for" if self.options.kv_cache == "float32" else why_not_supported()
        if why is None:
            if graph not in self._cache_scales:
                self._cache_scales[graph] = self._measure_cache(graph, src)
            record = quantize_cache(dst, self._cache_scales[graph])
            if record is not None:
                return record
            why = "its graph has no GroupQueryAttention over its cache"
        if self.options.kv_cache != "float32":
            log.warning("%s: the key/value cache stays float32: %s", graph, why)
        return {"dtype": "float32", "not_int8_because": why}

    def _measure_cache(self, graph: str, src: Path) -> CacheScales:
        """The cache's largest magnitudes on the calibration text (:attr:`fit_text`), else on the
        calibration feeds drawn from the vocabulary, with room to spare."""
        if self.fit_text is None:
            return measure_scales(src, self._calibration_feeds(graph), self.model.config,
                                  "token ids drawn from the vocabulary", margin=DRAWN_MARGIN)  # fmt: skip
        width = min(SCALE_ROW_TOKENS, self.model.config.max_len)
        rows = calibration_rows(self.fit_text[0], tokens=SCALE_TOKENS, width=width)
        feeds = calibration_feeds(self.model, graph, rows.tolist(), batches=-(-len(rows) // SCALE_ROWS))
        for feed in feeds:  # one position's logits where the graph picks them: the cache is what counts
            if LOGITS_AT in feed:
                feed[LOGITS_AT] = feed[LOGITS_AT][:, -1:]
        scales = measure_scales(src, feeds, self.model.config, f"{self.fit_text[1]}, {rows.size:,} tokens")
        release_freed_memory()
        return scales

    def _calibration_feeds(self, graph: str) -> list[dict[str, np.ndarray]]:
        """Made once per graph: the sensitive-node search quantises again for every node."""
        if graph not in self._calibration:
            self._calibration[graph] = calibration_feeds(self.model, graph, self.options.calibration_data,
                                                         self.options.new_tokens)  # fmt: skip
        return self._calibration[graph]

    @cached_property
    def fit_text(self) -> tuple[list[list[int]], str] | None:
        """What GPTQ fits on, and in words (:func:`fit_sequences`)."""
        return fit_sequences(self.options)

    @cached_property
    def fit_data(self) -> tuple[Any, str] | None:
        """What the roles' fitters fit on, and in words: the family's own source where it names one
        (a speech model's held-out windows), else :attr:`fit_text` in calibration rows."""
        if self.family.fit_source is not None:
            return resolve(self.family.fit_source)(self.reference)
        if self.fit_text is None:
            return None
        rows = calibration_rows(self.fit_text[0], width=min(ROW_TOKENS, self.model.config.max_len))
        return rows, self.fit_text[1]

    def _fit(self, graph: str, bits_of: dict[str, int], block: int, source: Path) -> dict[str, Any]:
        """``graph``'s products (its graph at ``source``) fitted by its role's fitter on :attr:`fit_data`."""
        assert self.fit_data is not None
        fitter = resolve(self.family.role(graph).fitter or "")
        with phase(f"fitting the {graph} graph's products"):
            return fitter(self.model, self.fit_data[0], bits_of, block, self.progress, source)

    def runtime(self, candidates: dict[str, Candidate]) -> ExportedModel:
        """ONNX Runtime sessions over candidate graphs, built in memory (the CPU provider, or the
        precision's own engine in front of it)."""
        precision = next(iter(candidates.values())).precision
        graphs = {name: c.model for name, c in candidates.items()}
        engine = get_precision(precision).engine_provider
        providers = (CPU,) if engine is None else (engine, CPU)
        runtime = ExportedModel.from_graphs(self.model.config, graphs, precision=precision, providers=providers)
        runtime.tokenizer = self.options.tokenizer
        return runtime

    def gate(self, precision: str, candidates: dict[str, Candidate], runtime: ExportedModel | None = None
             ) -> GateResult:  # fmt: skip
        """The accuracy gate on ``candidates`` (the graphs they hold; ``runtime``: their sessions,
        when already built)."""
        return evaluate(self.model, runtime or self.runtime(candidates), precision, self.reference.heldout,
                        self.options.new_tokens, list(candidates), self.reference)  # fmt: skip

    # ------------------------------------------------------------------ build
    def build(self, name: str) -> PrecisionBuild:
        """Every graph at precision ``name``, gated (and for fp32-opt held to float32 parity);
        raises ExportError when the gate fails and degraded results are not allowed."""
        precision = get_precision(name)
        if precision.engine is not None:
            check_engine(precision)
        from tqdm import tqdm

        graphs = tqdm(self.graphs, desc=f"{name}: making", unit="graph", leave=False, disable=not self.progress)
        candidates = {}
        for g in graphs:
            with phase(f"{name}: making the {g} graph"):
                candidates[g] = self.candidate(precision, g)
        runtime = self.runtime(candidates)  # one set of sessions for the parity check and the gate
        parity = None
        if precision.float32_parity:
            with phase(f"{name}: float32 parity"):
                parity = verify_graphs(self.model, runtime, progress=self.progress)
            if not parity.passed:
                raise VerificationError(f"{name} graphs disagree with eager PyTorch:\n" + parity.table())
        result = None
        if precision.gated:
            with phase(f"{name}: the accuracy gate"):
                result = self.gate(name, candidates, runtime)
        if result is not None and not result.passed and self.options.sensitive_search:
            failing = [g for g in result.failing_graphs(self.graphs, self.family)
                       if self.family.role(g).searches(precision)]  # fmt: skip
            if failing:
                with phase(f"{name}: the sensitive-node search"):
                    candidates, result = self.exclude_sensitive(precision, candidates, failing)
        build = PrecisionBuild(name, candidates, result, parity)
        if build.degraded and not self.options.allow_degraded:
            assert result is not None
            raise ExportError(
                f"{name} graphs miss their accuracy thresholds ({'; '.join(map(str, result.failures))}); "
                "pass --allow-degraded to keep them marked degraded\n" + result.table()
            )
        return build

    def exclude_sensitive(
        self, precision: Precision, candidates: dict[str, Candidate], graphs: list[str]
    ) -> tuple[dict[str, Candidate], GateResult]:
        """``candidates`` with each of ``graphs`` remade with the fewest most sensitive nodes kept in
        float32 that make it pass (see :mod:`edgeattn.exporters.sensitivity`), and their gate."""
        from tqdm import tqdm

        candidates = dict(candidates)
        for graph in graphs:
            groups = group_nodes(quantizable_weights(self.source(graph, precision)))
            bar = tqdm(desc=f"{precision.name}: sensitive-node search", unit="trial", leave=False,
                       disable=not self.progress)  # fmt: skip

            def trial(exclude: list[str], graph: str = graph, bar: Any = bar) -> Trial[Candidate]:
                candidate = self.candidate(precision, graph, exclude)
                alone = evaluate(self.model, self.runtime({graph: candidate}), precision.name, self._search.heldout,
                                 self.options.new_tokens, [graph], self._search)  # fmt: skip
                bar.update()
                return Trial(candidate, alone.metrics.get(graph, {}), alone.passed)

            found = search_sensitive(groups, trial, self.options.search_seconds)
            bar.close()
            log.info("%s %s: kept %d node(s) in float32 after %d trials%s: %s", precision.name, graph,
                     len(found.excluded), found.trials, " (cut short by its time budget)" if found.cut_short else "",
                     found.excluded)  # fmt: skip
            candidates[graph] = found.trial.candidate
            self.searches[graph] = found
        return candidates, self.gate(precision.name, candidates)

    @property
    def _search(self) -> Reference:
        """The search's trials' reference: :attr:`PrecisionOptions.search_tokens` of the held-out
        rows, spread over them (the chosen candidate is gated on all of them)."""
        if self._search_reference is None:
            held = self.reference.heldout
            rows = spread_rows(held.mask.sum(axis=1).tolist(), self.options.search_tokens)
            subset = HeldOut(held.ids[rows], held.mask[rows], f"{held.source}; search trials on {len(rows)} of it",
                             held.random, None if held.features is None else held.features[rows])  # fmt: skip
            self._search_reference = resolve(self.family.gate_reference)(self.model, subset, self.options.new_tokens)
        return self._search_reference

    # ----------------------------------------------------------------- commit
    def _checkpoint(self, export_dir: Path) -> tuple[DataFile, CheckpointIndex] | None:
        """The checkpoint the fp32 graphs keep their weights in (their manifest entry for it, and
        its index, read once per builder), or None for an export whose graphs hold their own."""
        data = next((d for e in self.entries.values() for d in e.external_data if d.file == WEIGHTS), None)
        if data is None:
            return None
        if self._index is None:
            self._index = CheckpointIndex(export_dir / WEIGHTS)
        return data, self._index

    def commit(self, build: PrecisionBuild, export_dir: Path) -> dict[str, Variant]:
        """Write ``build``'s graphs into ``export_dir`` (checked) and return their manifest entries."""
        entries = {}
        checkpoint = self._checkpoint(export_dir)
        protos = {graph: c.stamped(self.model.config) for graph, c in build.candidates.items()}
        # a candidate in a file: its folder, and the data files its weights are in (copied, not loaded)
        folders = {graph: c.model.parent for graph, c in build.candidates.items() if isinstance(c.model, Path)}
        sources = {graph: [folders[graph] / name for name in data_locations(protos[graph])
                           if checkpoint is None or (folders[graph] / name).resolve() != checkpoint[1].path.resolve()]
                   for graph in folders}  # fmt: skip
        in_checkpoint = set()  # graphs that now read weights from the checkpoint
        if checkpoint is not None:
            in_checkpoint = {graph for graph, proto in protos.items()  # written pointing at it, or now
                             if share_weights(proto, checkpoint[1], folders.get(graph)) > 0
                             or checkpoint[1].path.name in data_locations(proto)}  # fmt: skip
        common = export_dir / shared_data_file(build.precision)
        common.unlink(missing_ok=True)
        among = share_between(protos, common, sources)  # what the checkpoint does not hold but several graphs do
        if among:
            log.info("%s: %.1f MB held by several graphs stored once in %s", build.precision,
                     common.stat().st_size / 1e6, common.name)  # fmt: skip
        for graph, proto in protos.items():
            path = export_dir / graph_file(graph, build.precision)
            data_file = path.with_name(external_data_file(path.name))
            for old in (path, data_file):
                old.unlink(missing_ok=True)
            if sources.get(graph):  # what neither the checkpoint nor the shared file holds, a region at a time
                copy_regions(proto, sources[graph], data_file)
            external = self.family.role(graph).external_weights
            save_checked(proto, path, 0 if external else self.options.external_threshold)
            parity = None
            if build.parity is not None and graph in build.parity.summary():
                parity = Parity(**build.parity.summary()[graph])
            data = [checkpoint[0]] if checkpoint is not None and graph in in_checkpoint else []
            if graph in among:
                data.append(DataFile(file=common.name, sha256=sha256_file(common), bytes=common.stat().st_size))
            entries[graph] = Variant.describe(path, data, precision=build.precision, degraded=build.degraded,
                                              parity=parity, **build.candidates[graph].fields)  # fmt: skip
        return entries
