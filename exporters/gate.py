"""The accuracy gate: every reduced-precision graph against eager PyTorch float32 on held-out data.

Task-level metrics, per graph:
- attention, encoder, cross_kv: cosine similarity of the output vectors (mean and worst row;
  a row is one token's vector), and top-1 agreement of classification logits;
- decoder: next-token top-1 agreement under teacher forcing (the eager model's own greedy
  continuation as targets, the eager cross-attention keys/values as the source);
- generation: exact-match rate of greedy sequences through the reduced-precision encoder,
  cross_kv and decoder against the eager float32 model.
The thresholds per precision live in the precision registry (``edgeattn.runtime.precisions``).
Eager PyTorch's side of every measurement is computed once per held-out set (:class:`Reference`)
and reused for every candidate graph the gate measures.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import torch

from edgeattn.config import ModelConfig
from edgeattn.errors import ExportError
from edgeattn.exporters.graphs import graph_module
from edgeattn.exporters.sampling import sample_inputs
from edgeattn.model import TransformerModel
from edgeattn.runtime.exported_model import ExportedModel
from edgeattn.runtime.families import FAMILIES, Family, family_of, resolve
from edgeattn.runtime.manifest import GateRecord
from edgeattn.runtime.precisions import Thresholds, Verdict, get_precision

log = logging.getLogger(__name__)


@dataclass
class GateResult:
    """Metrics of one precision, per graph, and the verdicts of those below their limits."""

    precision: str
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    failures: list[Verdict] = field(default_factory=list)
    #: what the held-out data were, in words
    heldout: str = ""
    #: the held-out data were drawn at random from the vocabulary
    heldout_random: bool = False

    #: the family whose limits apply (``Family.thresholds``); empty: the precision's own
    family: str = ""

    @property
    def thresholds(self) -> Thresholds:
        thresholds = FAMILIES[self.family].thresholds(self.precision) if self.family else \
            get_precision(self.precision).thresholds  # fmt: skip
        if thresholds is None:
            raise ExportError(f"precision {self.precision!r} is not gated")
        return thresholds

    @property
    def passed(self) -> bool:
        return not self.failures

    def check(self) -> None:
        """Compare every metric with the precision's thresholds."""
        self.failures = self.thresholds.verdicts(self.metrics)

    def failing_graphs(self, graphs: list[str], family: Family) -> list[str]:
        """Those of ``graphs`` with a failing metric; a failed generation counts against every
        graph it runs through (``family``'s generation graphs and decoding steps)."""
        failing = {v.graph for v in self.failures}
        if GENERATION in failing:
            failing |= set(family.generation) | {r.name for r in family.roles if r.decodes}
        return [g for g in graphs if g in failing]

    def to_record(self, degraded: bool) -> GateRecord:
        return GateRecord(metrics=self.metrics, thresholds=self.thresholds.to_dict(), passed=self.passed,
                          failures=list(self.failures), degraded=degraded, heldout=self.heldout)  # fmt: skip

    def table(self) -> str:
        thresholds = self.thresholds
        lines = [f"precision {self.precision}: " + ("ok" if self.passed else "FAILED")
                 + (f" (held out: {self.heldout})" if self.heldout else "")]  # fmt: skip
        width = max([10, *(len(g) for g in self.metrics)])
        for graph, values in self.metrics.items():
            cells = []
            for name, value in values.items():
                limit = thresholds.limit(name)
                mark = "" if limit is None or value >= limit else " FAIL"
                shown = f" (>= {limit})" if limit else " (reported, not judged)" if limit == 0 else ""
                cells.append(f"{name} {value:.5f}{shown}{mark}")
            lines.append(f"  {graph:<{width}} " + ", ".join(cells))
        if self.heldout_random:
            caveat = (FAMILIES[self.family].random_caveat if self.family else "") or RANDOM_CAVEAT
            lines.append(f"  note: {caveat}")
        return "\n".join(lines)


@dataclass
class HeldOut:
    """Held-out sources (B, S), padded on the right, with their mask, for the gate and for calibration."""

    ids: np.ndarray
    mask: np.ndarray
    #: what the sequences are, in words (recorded with the gate's figures)
    source: str = ""
    #: drawn at random from the vocabulary (not the user's data: the gate's table says what that cannot show)
    random: bool = False
    #: a speech model's held-out windows of log-mel features (W, n_mels, frames), one a row of ``ids``
    features: np.ndarray | None = None


#: what a gate measured on random token ids cannot show (its table says so)
RANDOM_CAVEAT = (
    "held-out sequences drawn at random from the vocabulary: they cannot show what real inputs do "
    "(real models' large activations, real next-token distributions); give --heldout with real data"
)
#: the most held-out tokens the gate measures by default (a larger file is sampled evenly, rows
#: spread over it). The comparison is paired (the same tokens through float32 and the candidate),
#: so it needs few (docs/precisions.md: how many held-out tokens the gate needs)
GATE_TOKENS = 8192


def spread_rows(lengths: list[int], max_tokens: int) -> list[int]:
    """Indices of rows spread evenly over ``lengths`` whose tokens add up to at most ``max_tokens``
    (every row when they all fit, or ``max_tokens`` is 0)."""
    total = sum(lengths)
    if not max_tokens or total <= max_tokens:
        return list(range(len(lengths)))
    k = max(1, int(len(lengths) * max_tokens / total))
    while k > 1:
        rows = sorted(set(np.linspace(0, len(lengths) - 1, k).round().astype(int).tolist()))
        if sum(lengths[r] for r in rows) <= max_tokens:
            return rows
        k -= 1
    return [int(np.argmin(lengths))]


def heldout_sources(
    config: ModelConfig, n: int = 48, seed: int = 99, texts: list[list[int]] | None = None, source: str = "",
    max_tokens: int = 0,
) -> HeldOut:
    """``texts`` (token id lists; ``source`` says what they are) padded into a batch, or ``n``
    random sequences drawn from the model's vocabulary (specials excluded) with lengths spread
    over 1..min(max_len, 48). ``max_tokens`` (0: no limit) keeps rows spread evenly over a larger
    set, the description saying how many of it."""
    rng = np.random.default_rng(seed)
    random = texts is None
    if texts is None:
        low = min(3, config.vocab_size - 1)
        lengths = rng.integers(1, min(config.max_len, 48) + 1, size=n)
        texts = [rng.integers(low, config.vocab_size, size=int(k)).tolist() for k in lengths]
        source = "drawn from the model's vocabulary"
    described = f"{source or 'given sequences'} ({len(texts)} sequences)"
    rows = spread_rows([len(t) for t in texts], max_tokens)
    if len(rows) < len(texts):
        total = sum(len(t) for t in texts)
        described = f"{described[:-1]}, {total:,} tokens)"
        texts = [texts[r] for r in rows]
        described += f"; measured on {len(texts)} spread over it, {sum(len(t) for t in texts):,} tokens"
    width = max(len(t) for t in texts)
    ids = np.full((len(texts), width), config.pad_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, t in enumerate(texts):
        ids[i, : len(t)] = t
        mask[i, : len(t)] = 1
    return HeldOut(ids, mask, described, random)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.reshape(-1, a.shape[-1]).astype(np.float64)
    b = b.reshape(-1, b.shape[-1]).astype(np.float64)
    denom = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(denom, 1e-30)


def cosine_metrics(got: np.ndarray, want: np.ndarray, rows: np.ndarray | None = None) -> dict[str, float]:
    cos = _cosines(got, want)
    if rows is not None:
        cos = cos[rows.reshape(-1)]
    cos = np.nan_to_num(cos, nan=-1.0)
    return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min())}


class Reference:
    """Eager float32 PyTorch's side of the gate for one held-out set, each part computed on first
    use and kept: the gate measures many candidate graphs against the same answers."""

    def __init__(self, model: TransformerModel, heldout: HeldOut, new_tokens: int = 16, progress: bool = False
                 ) -> None:  # fmt: skip
        self.model = model.eval()
        #: show progress bars on the measurements that take seconds
        self.progress = progress
        self.heldout = heldout
        self.new_tokens = new_tokens
        self.ids, self.mask = heldout.ids, heldout.mask
        self.valid = heldout.mask.astype(bool)
        self._blocks: dict[str, tuple[dict[str, np.ndarray], np.ndarray]] = {}
        #: the latest runtime's continuations, by a weak reference to it: its sessions are not kept
        self._generated: dict[int, tuple[weakref.ref[ExportedModel], np.ndarray]] = {}

    @cached_property
    def hidden(self) -> torch.Tensor:
        with torch.no_grad():
            return self.model.encode(torch.from_numpy(self.ids), torch.from_numpy(self.mask))

    @cached_property
    def logits(self) -> np.ndarray:
        """Classification logits of an encoder model with a head."""
        with torch.no_grad():
            return self.model(torch.from_numpy(self.ids), torch.from_numpy(self.mask))[1].numpy()

    def block(self, graph: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Random hidden-state feeds for a graph of one attention block, and eager PyTorch's output
        on them (kept per graph)."""
        if graph not in self._blocks:
            module, spec = graph_module(graph, self.model)
            feeds = sample_inputs(spec, self.model.config, {"batch": 4, "tgt_len": 24, "src_len": 31},
                                  np.random.default_rng(5))  # fmt: skip
            with torch.no_grad():
                out = module(*(torch.from_numpy(feeds[n]) for n in spec.input_names)).numpy()
            self._blocks[graph] = feeds, out
        return self._blocks[graph]

    @cached_property
    def generation_rows(self) -> np.ndarray:
        """The held-out rows whose greedy continuations are compared: all of them, or, past
        :data:`GENERATION_TOKENS` prompt tokens, as many rows spread evenly over the set as fit."""
        lengths = self.mask.sum(axis=1)
        rows = len(lengths)
        if lengths.sum() <= GENERATION_TOKENS:
            return np.arange(rows)
        k = max(min(rows, 8), int(rows * GENERATION_TOKENS / lengths.sum()))
        return np.unique(np.linspace(0, rows - 1, k).round().astype(np.int64))

    @cached_property
    def generation_inputs(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, mask) of :attr:`generation_rows`, as wide as their longest."""
        return trimmed_rows(self.ids[self.generation_rows], self.mask[self.generation_rows])

    def _by_length(self, continue_rows: Any, steps: int, rows_per_call: int, desc: str) -> np.ndarray:
        """``continue_rows(ids, mask) -> (b, <= steps)`` over :attr:`generation_inputs` in groups of
        at most ``rows_per_call`` rows of like length (each as wide as its longest: prompts padded to
        the longest of all would run every row at that width), put back in order and padded to ``steps``."""
        from tqdm import tqdm

        ids, mask = self.generation_inputs
        out = np.full((len(ids), steps), self.model.config.pad_id, dtype=np.int64)
        groups = length_groups(mask.sum(axis=1), rows_per_call)
        for rows in tqdm(groups, desc=desc, unit="batch", leave=False, disable=not self.progress or len(groups) < 2):
            tokens = continue_rows(*trimmed_rows(ids[rows], mask[rows]))
            out[rows, : tokens.shape[1]] = tokens
        return out

    def _greedy(self, steps: int) -> np.ndarray:
        def eager(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return self.model.greedy(torch.from_numpy(ids), torch.from_numpy(mask), steps).numpy()

        return self._by_length(eager, steps, EAGER_GREEDY_ROWS, f"gate: eager greedy x{steps}")

    def generated(self, runtime: ExportedModel, steps: int) -> np.ndarray:
        """``runtime``'s greedy continuations of :attr:`generation_rows`, ``steps`` long: made once
        per runtime at the longest length asked (a shorter one is its first steps)."""
        key = id(runtime)
        kept = self._generated.get(key)
        if kept is None or kept[0]() is not runtime or kept[1].shape[1] < steps:
            steps_made = self._steps_made(steps)
            tokens = self._by_length(lambda ids, mask: runtime.generate(ids, mask, steps_made).tokens, steps_made,
                                     RUNTIME_GREEDY_ROWS, f"gate: {runtime.precision} greedy x{steps_made}")
            kept = (weakref.ref(runtime), tokens)
            self._generated = {key: kept}  # one runtime at a time: the gate measures candidates in turn
        return kept[1][:, :steps]

    def _steps_made(self, steps: int) -> int:
        """How long a runtime's continuations are made when ``steps`` are asked (a family's reference
        may make them longer at once, to serve a longer check from the same run)."""
        return steps

    @cached_property
    def greedy(self) -> np.ndarray:
        """Eager greedy continuations of :attr:`generation_rows`, ``new_tokens`` long."""
        return self._greedy(self.new_tokens)


def evaluate(
    model: TransformerModel,
    runtime: ExportedModel,
    precision: str,
    heldout: HeldOut,
    new_tokens: int = 16,
    graphs: list[str] | None = None,
    reference: Reference | None = None,
) -> GateResult:
    """Measure ``runtime``'s graphs (``graphs``, default all it has) at ``precision`` against eager
    float32 ``model`` on ``heldout``, each as its family role says, then generation where the graphs
    hold a decoding step and the rest of what generation runs through; ``reference`` reuses eager
    answers computed before."""
    family = family_of(model.config)
    ref = reference or resolve(family.gate_reference)(model, heldout, new_tokens)
    result = GateResult(precision, heldout=ref.heldout.source, heldout_random=ref.heldout.random, family=family.name)
    graphs = graphs or runtime.graphs
    for role in family.roles:
        if role.name in graphs:
            result.metrics[role.name] = resolve(role.gate)(ref, runtime, role.name)
    decoding = [g for g in graphs if g in family.graphs and family.graphs[g].decodes]
    source = [g for g in family.generation if not family.graphs[g].decodes]
    if decoding and set(source) <= set(graphs):  # through decoder_fixed where the runtime has it
        result.metrics[GENERATION] = resolve(family.generation_gate)(ref, runtime)
    result.check()
    return result


#: the gate's metric over whole generations (not a graph's)
GENERATION = "generation"


def generation_metrics(ref: Reference, runtime: ExportedModel) -> dict[str, float]:
    """The share of held-out sources whose greedy generation equals eager float32's exactly."""
    pad = ref.model.config.pad_id
    eager = ref.greedy
    got = ref.generated(runtime, ref.new_tokens)
    width = max(eager.shape[1], got.shape[1])
    eager = np.pad(eager, ((0, 0), (0, width - eager.shape[1])), constant_values=pad)
    got = np.pad(got, ((0, 0), (0, width - got.shape[1])), constant_values=pad)
    return {"exact_match": float((eager == got).all(axis=1).mean())}


#: the most logits (batch x positions x vocabulary, float32) one teacher-forced call may return
LOGITS_BYTES = 128 * 2**20
#: prompt tokens whose greedy continuations the generation and loop checks compare at most
GENERATION_TOKENS = 4096
#: the most rows a greedy check continues at once, eager PyTorch's and a runtime's (rows of like
#: length go together; the fastest of those measured on a real gate, docs/precisions.md)
EAGER_GREEDY_ROWS, RUNTIME_GREEDY_ROWS = 32, 16


def length_groups(lengths: np.ndarray, rows: int) -> list[np.ndarray]:
    """Indices of ``lengths`` sorted by length, in groups of at most ``rows``."""
    order = np.argsort(lengths, kind="stable")
    return [order[i : i + rows] for i in range(0, len(order), rows)]


def trimmed_rows(ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows padded on the right cut to the longest of them (rows padded otherwise keep their width)."""
    width = max(1, int(mask.sum(axis=1).max()))
    if mask[:, width:].any():  # not padded on the right: the rows keep their whole width
        width = mask.shape[1]
    return ids[:, :width], mask[:, :width]


@dataclass
class NextTokens:
    """Per held-out position (B, T - 1), the argmax next token and the log-probability of the true
    next token, valid only where both tokens are real."""

    top1: np.ndarray
    logp: np.ndarray
    valid: np.ndarray


def next_tokens(logits_of: Any, ids: np.ndarray, mask: np.ndarray, vocab_size: int, desc: str = "",
                progress: bool = False) -> NextTokens:  # fmt: skip
    """``logits_of(ids, mask) -> (b, t, vocab)`` reduced to what the gate compares. Rows of similar
    length go together, each call cut to its rows' longest and holding at most
    :data:`LOGITS_BYTES` of logits; only the true token's log-probability is kept of each position."""
    from tqdm import tqdm

    rows, width = ids.shape
    top1 = np.zeros((rows, max(width - 1, 0)), np.int64)
    logp = np.zeros((rows, max(width - 1, 0)), np.float64)
    lengths = mask.sum(axis=1)
    order = np.argsort(-lengths, kind="stable")
    start = 0
    bar = tqdm(total=int(lengths.sum()), desc=desc, unit="token", leave=False, disable=not progress)
    while start < rows:
        t = max(int(lengths[order[start]]), 1)
        count = max(1, LOGITS_BYTES // (4 * vocab_size * t))
        chosen = order[start : start + count]
        start += count
        bar.update(int(lengths[chosen].sum()))
        if t < 2:
            continue
        if mask[chosen, t:].any():  # not padded on the right: the rows keep their whole width
            t = width
        logits = logits_of(ids[chosen, :t], mask[chosen, :t])[:, :-1]  # (b, t - 1, vocab)
        best, chosen_logp = scored(logits.reshape(-1, logits.shape[-1]), ids[chosen, 1:t].reshape(-1))
        top1[chosen, : t - 1] = best.reshape(len(chosen), t - 1)
        logp[chosen, : t - 1] = chosen_logp.reshape(len(chosen), t - 1)
    bar.close()
    valid = (mask[:, :-1] * mask[:, 1:]).astype(bool)
    return NextTokens(top1, logp, valid)


def scored(logits: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of ``logits`` (N, vocab): each row's argmax and the log-probability (float64) of its ``truth``
    token, reduced on every core (the first of equal maxima, as numpy's argmax)."""
    x = torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32))
    chosen = x.gather(1, torch.from_numpy(truth.astype(np.int64))[:, None])[:, 0]
    return x.argmax(-1).numpy(), (chosen - torch.logsumexp(x, -1)).double().numpy()
