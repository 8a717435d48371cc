"""Eager PyTorch against ONNX Runtime on shapes never used at export, and a greedy decode.

Every graph of an export runs on fresh random inputs at sequence lengths 1, 37 and several
times the traced length, at batch 1 and at batch 3 with different padding per row; the decoder
also at past lengths 0, 1 and many. Float32 must agree elementwise within ``atol + rtol·|ref|``
(what random weights are held to). Where it does not, the same model in float64 is the truth:
the graph passes when it is within that tolerance of float64, or when its distance to float64 is
at most :data:`FLOAT64_MULTIPLE` times eager float32's own (real weights, whose large activations
put two correct float32 computations further apart than 1e-4).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgeattn.config import ModelConfig
from edgeattn.errors import VerificationError
from edgeattn.exporters.graphs import graph_module
from edgeattn.exporters.sampling import padding, sample_inputs
from edgeattn.model import TransformerModel
from edgeattn.runtime.exported_model import ExportedModel
from edgeattn.runtime.families import family_of, resolve
from edgeattn.runtime.layout import WEIGHTS
from edgeattn.runtime.precisions import FP32, float32_precisions
from edgeattn.runtime.session import CPU
from edgeattn.tables import table_lines
from edgeattn.widening import module_at_a_time

log = logging.getLogger(__name__)

ATOL = 1e-4
RTOL = 1e-5
GREEDY_TOKENS = 24
#: how much further from float64 than eager float32 a graph's float32 may be
FLOAT64_MULTIPLE = 4.0


@dataclass
class CaseResult:
    """One graph run on one set of input sizes."""

    graph: str
    sizes: dict[str, int]
    max_abs: float
    max_rel: float
    passed: bool
    against: str = "float32"  # "float64" when float32 eager itself strayed and float64 eager settled it
    #: eager float32's own max distance to float64 (measured when the graph missed float32's tolerance)
    eager_float64: float | None = None

    @property
    def float64_ratio(self) -> float | None:
        """The graph's distance to float64 over eager float32's, when judged so."""
        if self.against != "float64" or not self.eager_float64:
            return None
        return self.max_abs / self.eager_float64


@dataclass
class GreedyResult:
    """Greedy tokens from eager PyTorch and from the exported graphs."""

    rows: int
    tokens: int
    mismatched_rows: list[int]

    @property
    def passed(self) -> bool:
        return not self.mismatched_rows


@dataclass
class VerifyReport:
    """All cases of one verification; ``passed`` only if every case and the greedy check pass."""

    atol: float
    rtol: float
    cases: list[CaseResult] = field(default_factory=list)
    greedy: GreedyResult | None = None

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases) and (self.greedy is None or self.greedy.passed)

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per graph: number of cases, worst absolute and relative error, pass/fail, and how many
        cases were settled against float64 eager."""
        out: dict[str, dict[str, Any]] = {}
        for c in self.cases:
            s = out.setdefault(
                c.graph, {"cases": 0, "max_abs": 0.0, "max_rel": 0.0, "passed": True, "float64_cases": 0}
            )
            s["cases"] += 1
            s["max_abs"] = max(s["max_abs"], c.max_abs)
            s["max_rel"] = max(s["max_rel"], c.max_rel)
            s["passed"] = s["passed"] and c.passed
            s["float64_cases"] += c.against == "float64"
        for s in out.values():
            s.update(atol=self.atol, rtol=self.rtol)
        return out

    def float64_ratios(self) -> dict[str, float]:
        """Per graph: the largest ratio of its distance to float64 over eager float32's own."""
        out: dict[str, float] = {}
        for c in self.cases:
            if c.float64_ratio is not None:
                out[c.graph] = max(out.get(c.graph, 0.0), c.float64_ratio)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "atol": self.atol,
            "rtol": self.rtol,
            "graphs": self.summary(),
            "greedy": None if self.greedy is None else {**asdict(self.greedy), "passed": self.greedy.passed},
            "float64_ratios": self.float64_ratios(),
            "float64_multiple": FLOAT64_MULTIPLE,
            "cases": [asdict(c) for c in self.cases],
            "passed": self.passed,
        }

    def table(self) -> str:
        """A plain-text table of the per-graph results."""
        rows = [("graph", "cases", "max abs err", "max rel err", "result")]
        ratios = self.float64_ratios()
        for graph, s in self.summary().items():
            verdict = "ok" if s["passed"] else "FAIL"
            if s["float64_cases"]:
                verdict += f" ({s['float64_cases']} vs float64"
                verdict += f", {ratios[graph]:.2f}x eager's own error)" if graph in ratios else ")"
            rows.append((graph, str(s["cases"]), f"{s['max_abs']:.2e}", f"{s['max_rel']:.2e}", verdict))
        if self.greedy is not None:
            g = self.greedy
            verdict = "tokens identical" if g.passed else f"FAIL rows {g.mismatched_rows}"
            rows.append(("greedy decode", f"{g.rows}x{g.tokens}", "-", "-", verdict))
        lines = table_lines(rows)
        lines.append(f"tolerance: |onnx - eager| <= {self.atol:g} + {self.rtol:g}·|eager|")
        if any(c.against == "float64" for c in self.cases):
            lines.append(
                "vs float64: cases outside that tolerance of float32 eager, judged against the same model in "
                f"float64 (errors shown are against it): within the tolerance, or at most {FLOAT64_MULTIPLE:g}x "
                "eager float32's own distance to float64"
            )
        return "\n".join(lines)


def verification_sizes(graph: str, config: ModelConfig) -> list[dict[str, int]]:
    """Input sizes for one graph, none of them the traced sizes (its family role's)."""
    return family_of(config).role(graph).sizes(config)


def compare(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> tuple[float, float, bool]:
    """(max abs error, max abs error / max |expected|, allclose) of two arrays."""
    if actual.shape != expected.shape:
        return float("inf"), float("inf"), False
    diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    if diff.size == 0:
        return 0.0, 0.0, True
    scale = float(np.abs(expected).max())
    ok = bool(np.all(diff <= atol + rtol * np.abs(expected))) and bool(np.isfinite(actual).all())
    return float(diff.max()), float(diff.max() / scale) if scale > 0 else float(diff.max()), ok


def _distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) if a.size else 0.0


def _eager(module: torch.nn.Module, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with torch.no_grad():
        out = module(*(torch.from_numpy(feeds[n]) for n in names))
    out = out if isinstance(out, tuple) else (out,)
    return [t.numpy() for t in out]


class _Float64Reference:
    """The model in float64: the truth when float32 eager itself strays (two float32 computations
    can differ by more than the tolerance while each is within it of the exact result, e.g. eager
    on a CPU whose kernels accumulate in another order). The model computes in float64 a module at
    a time (:func:`~edgeattn.widening.module_at_a_time`: a module's weights widened while it runs),
    so a large model never sits in memory twice; a model whose forward reads weights outside their
    own module is widened whole in place for the cases that need it and narrowed back after (exact:
    every float32 is a float64)."""

    def __init__(self, model: TransformerModel) -> None:
        self._model = model
        self._whole = False

    @contextlib.contextmanager
    def widened(self) -> Iterator[None]:
        with module_at_a_time(self._model, torch.float64):
            yield

    @contextlib.contextmanager
    def _widened_whole(self) -> Iterator[None]:
        floats = [t.dtype for t in self._tensors() if t.is_floating_point()]
        if any(d != torch.float32 for d in floats):  # a model not all float32: a widened copy instead
            original, self._model = self._model, copy.deepcopy(self._model).double()
            try:
                yield
            finally:
                self._model = original
            return
        self._model.double()
        try:
            yield
        finally:
            self._model.float()

    def _tensors(self) -> Iterator[torch.Tensor]:
        yield from self._model.parameters()
        yield from self._model.buffers()

    def outputs(self, graph: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """``graph``'s outputs on ``feeds`` in float64 (call within :meth:`widened`)."""
        wide = {n: a.astype(np.float64) if a.dtype == np.float32 else a for n, a in feeds.items()}
        if not self._whole:
            module, spec = graph_module(graph, self._model)
            try:
                return _eager(module, spec.input_names, wide)
            except RuntimeError as exc:  # weights read outside their module: widen the whole model
                log.debug("%s: float64 a module at a time failed (%s); widening the whole model", graph, exc)
                self._whole = True
        with self._widened_whole():
            module, spec = graph_module(graph, self._model)
            return _eager(module, spec.input_names, wide)


def _judge(
    got: dict[str, np.ndarray], names: list[str], want: list[np.ndarray], atol: float, rtol: float
) -> tuple[float, float, bool]:
    worst_abs, worst_rel, ok = 0.0, 0.0, True
    for name, ref in zip(names, want, strict=True):
        a, r, passed = compare(got[name], ref, atol, rtol)
        worst_abs, worst_rel, ok = max(worst_abs, a), max(worst_rel, r), ok and passed
    return worst_abs, worst_rel, ok


def _judge_float64(
    got: dict[str, np.ndarray], names: list[str], eager: list[np.ndarray], exact: list[np.ndarray], atol: float,
    rtol: float,
) -> tuple[float, float, bool, float]:
    """(worst abs, worst rel, passed, eager float32's worst distance) of a graph's outputs against
    float64 eager: each output within the tolerance of it, or no further from it than
    :data:`FLOAT64_MULTIPLE` times eager float32's own distance to it."""
    worst_abs, worst_rel, ok, eager_worst = 0.0, 0.0, True, 0.0
    for name, want, truth in zip(names, eager, exact, strict=True):
        a, r, passed = compare(got[name], truth, atol, rtol)
        own = _distance(want, truth)
        if not passed and np.isfinite(got[name]).all() and got[name].shape == truth.shape:
            passed = a <= FLOAT64_MULTIPLE * own
        worst_abs, worst_rel, ok = max(worst_abs, a), max(worst_rel, r), ok and passed
        eager_worst = max(eager_worst, own)
    return worst_abs, worst_rel, ok, eager_worst


def verify_graphs(
    model: TransformerModel,
    runtime: ExportedModel,
    seed: int = 1234,
    atol: float = ATOL,
    rtol: float = RTOL,
    greedy_tokens: int = GREEDY_TOKENS,
    progress: bool = False,
) -> VerifyReport:
    """Compare every graph of ``runtime`` with ``model`` run eagerly; then a greedy decode."""
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    report = VerifyReport(atol=atol, rtol=rtol)
    model = model.eval()
    jobs = [(g, s) for g in runtime.graphs for s in verification_sizes(g, model.config)]
    strayed = []  # the cases float32 eager does not settle, judged against float64 together after
    for graph, sizes in tqdm(jobs, desc="verify", unit="case", disable=not progress, leave=False):
        module, spec = graph_module(graph, model)
        feeds = sample_inputs(spec, model.config, sizes, rng)
        got = runtime.run(graph, feeds)
        want = _eager(module, spec.input_names, feeds)
        worst_abs, worst_rel, ok = _judge(got, spec.output_names, want, atol, rtol)
        report.cases.append(CaseResult(graph, sizes, worst_abs, worst_rel, ok))
        if not ok:
            strayed.append((len(report.cases) - 1, spec.output_names, feeds, got, want))
        log.debug("%s %s: max abs %.2e", graph, sizes, worst_abs)
    if strayed:
        truth = _Float64Reference(model)
        with truth.widened():
            for index, names, feeds, got, want in strayed:
                case = report.cases[index]
                worst_abs, worst_rel, ok, eager_error = _judge_float64(
                    got, names, want, truth.outputs(case.graph, feeds), atol, rtol
                )
                report.cases[index] = CaseResult(case.graph, case.sizes, worst_abs, worst_rel, ok, "float64",
                                                 eager_error)  # fmt: skip
                log.info("%s %s: %.2e from float64 eager (eager float32: %.2e)", case.graph, case.sizes, worst_abs,
                         eager_error)  # fmt: skip
    if runtime.family.generates_with(runtime.graphs):
        report.greedy = resolve(runtime.family.greedy_check)(model, runtime, rng, greedy_tokens)
    return report


def verify_greedy(
    model: TransformerModel, runtime: ExportedModel, rng: np.random.Generator, tokens: int = GREEDY_TOKENS
) -> GreedyResult:
    """Greedy decode of ``tokens`` steps (no early stop) through eager PyTorch and the export."""
    cfg = model.config
    src_len = min(cfg.max_len, 23)
    ids = rng.integers(0, cfg.vocab_size, size=(3, src_len), dtype=np.int64)
    mask = padding(3, src_len)
    eager = model.greedy(torch.from_numpy(ids), torch.from_numpy(mask), tokens, stop_at_eos=False).numpy()
    onnx_tokens = runtime.greedy(ids, mask, tokens, stop_at_eos=False)
    bad = [i for i in range(3) if not np.array_equal(eager[i], onnx_tokens[i])]
    return GreedyResult(rows=3, tokens=int(eager.shape[1]), mismatched_rows=bad)


def verify_export(
    export_dir: str | Path,
    model: TransformerModel | None = None,
    providers: tuple[str, ...] = (CPU,),
    progress: bool = False,
    precision: str = FP32,
    **kwargs: Any,
) -> VerifyReport:
    """Verify an export directory's float32 graphs (a precision held to float32 parity: fp32, or
    the fused fp32-opt) against eager PyTorch, with the weights the export holds unless a model
    is given. Reduced precisions are judged by the accuracy gate instead."""
    from edgeattn.runtime.manifest import check_file
    from edgeattn.weights import load_model

    if precision not in float32_precisions():
        raise VerificationError(
            f"float32 parity applies to {', '.join(float32_precisions())}; {precision!r} is judged by the accuracy gate"
        )
    export_dir = Path(export_dir)
    runtime = ExportedModel(export_dir, providers=providers, precision=precision)
    if model is None:
        assert runtime.manifest is not None
        if runtime.manifest.weights is None:
            raise VerificationError(f"{export_dir} holds no {WEIGHTS} to compare the graphs with")
        model = load_model(check_file(export_dir, runtime.manifest.weights), runtime.config)
    return verify_graphs(model, runtime, progress=progress, **kwargs)
