"""Decoding strategies over any step function: greedy, beam search, and sampling (numpy only).

A :class:`Stepper` holds one decoding state (encoder output, caches) for N rows: ``step``
feeds one new token per row and returns the next-token logits, ``reorder`` makes row i
continue from row ``index[i]`` (beam search). The exported graphs and eager PyTorch both
provide one, so the same search runs over both and their outputs can be compared exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from edgeattn.errors import EdgeattnError

Strategy = Literal["greedy", "beam", "sample"]


class Stepper(Protocol):
    """One decoding state over N rows."""

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """(N,) int64 new tokens -> (N, vocab) float32 logits of the next token."""
        ...

    def reorder(self, index: np.ndarray) -> None:
        """Row i of the state becomes the old row ``index[i]``."""
        ...


#: Builds a stepper for a source batch, each row repeated ``repeat`` times (row-major).
StepperFactory = Callable[[int], Stepper]
#: The token (or tokens: a chat model may end a turn with any of several) that ends a row.
EosIds = int | Sequence[int]


def eos_array(eos_id: EosIds) -> np.ndarray:
    """The ids that end a row, as an int64 array."""
    return np.atleast_1d(np.asarray(eos_id, dtype=np.int64))


def prompt_seen(ids: np.ndarray, mask: np.ndarray, vocab: int) -> np.ndarray:
    """(rows, vocab) True for every real token of each row's prompt (where a repetition penalty
    starts for a decoder-only model)."""
    seen = np.zeros((ids.shape[0], vocab), dtype=bool)
    rows = np.repeat(np.arange(ids.shape[0]), ids.shape[1])
    real = mask.reshape(-1).astype(bool)
    seen[rows[real], ids.reshape(-1)[real]] = True
    return seen


class RepetitionPenalty:
    """A stepper whose logits of tokens seen before are made less likely: divided by ``penalty``
    where positive, multiplied where negative (as ``transformers``' repetition penalty). What was
    seen starts from the inner stepper's ``seen()`` (a decoder-only prompt's tokens) when it has
    one, and grows with every token fed after the first step (whose tokens start the decoding)."""

    def __init__(self, inner: Stepper, penalty: float) -> None:
        self.inner, self.penalty = inner, penalty
        self.seen: np.ndarray | None = inner.seen() if hasattr(inner, "seen") else None
        self.started = False

    def step(self, tokens: np.ndarray) -> np.ndarray:
        logits = self.inner.step(tokens)
        if self.seen is None:
            self.seen = np.zeros(logits.shape, dtype=bool)
        if self.started:
            self.seen[np.arange(len(tokens)), tokens] = True
        self.started = True
        penalised = np.where(logits > 0, logits / self.penalty, logits * self.penalty)
        return np.where(self.seen, penalised, logits).astype(logits.dtype, copy=False)

    def reorder(self, index: np.ndarray) -> None:
        self.inner.reorder(index)
        if self.seen is not None:
            self.seen = self.seen[index]


def _factory(make: StepperFactory, cfg: GenerationConfig) -> StepperFactory:
    if cfg.repetition_penalty == 1.0:
        return make
    return lambda n: RepetitionPenalty(make(n), cfg.repetition_penalty)


@dataclass(frozen=True)
class GenerationConfig:
    """How to decode. ``length_penalty`` divides a beam's log-probability by length**penalty."""

    max_new_tokens: int = 32
    strategy: Strategy = "greedy"
    num_beams: int = 4
    length_penalty: float = 1.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    #: > 1 makes tokens seen before less likely (1: off)
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "num_beams", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise EdgeattnError(f"{name} must be an integer, got {value!r}")
        for name in ("length_penalty", "temperature", "top_p", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float | np.number) or not np.isfinite(value):
                raise EdgeattnError(f"{name} must be a finite number, got {value!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer)):
            raise EdgeattnError(f"seed must be an integer or None, got {self.seed!r}")
        if self.strategy not in ("greedy", "beam", "sample"):
            raise EdgeattnError(f"strategy must be greedy, beam or sample, got {self.strategy!r}")
        if self.max_new_tokens < 1:
            raise EdgeattnError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.num_beams < 1:
            raise EdgeattnError(f"num_beams must be at least 1, got {self.num_beams}")
        if self.temperature <= 0:
            raise EdgeattnError(f"temperature must be positive, got {self.temperature}")
        if self.top_k < 0:
            raise EdgeattnError(f"top_k must be 0 (off) or positive, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise EdgeattnError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise EdgeattnError(f"repetition_penalty must be positive (1: off), got {self.repetition_penalty}")


@dataclass
class GenerationOutput:
    """Generated tokens (B, N), ``pad_id`` after each row's EOS; per-row scores (the sum of
    log-probabilities, length-normalised for beam search)."""

    tokens: np.ndarray
    scores: np.ndarray


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities (float64) along the last axis. The exponentials of float32 logits are taken
    in float32 and summed in float64: a 32k vocabulary at batch 8 costs 1 ms instead of 4.6."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    total = np.exp(shifted).sum(axis=-1, keepdims=True, dtype=np.float64)
    return shifted.astype(np.float64, copy=False) - np.log(total)


def chosen_log_probs(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``log_softmax(logits)[i, tokens[i]]`` without the whole log-softmax."""
    top = logits.max(axis=-1)
    total = np.exp(logits - top[:, None]).sum(axis=-1, dtype=np.float64)
    return (logits[np.arange(len(tokens)), tokens] - top).astype(np.float64) - np.log(total)


def top_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Per row, the indices of the ``k`` largest scores, largest first, equal scores by index."""
    if k >= scores.shape[1]:
        return np.argsort(-scores, axis=1, kind="stable")
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    kth = np.take_along_axis(scores, part, axis=1).min(axis=1, keepdims=True)  # each row's k-th largest
    above, tied = scores > kth, scores == kth
    # all scores above the k-th, then the lowest-indexed of those equal to it (a stable sort's pick)
    keep = above | (tied & (np.cumsum(tied, axis=1) <= k - above.sum(axis=1, keepdims=True)))
    picked = np.nonzero(keep)[1].reshape(len(scores), k)
    values = np.take_along_axis(scores, picked, axis=1)
    return np.take_along_axis(picked, np.lexsort((picked, -values), axis=1), axis=1)


def filter_logits(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Temperature, then keep the top-k tokens, then the smallest set whose probability reaches top_p."""
    x = logits.astype(np.float64) / temperature
    if top_k and top_k < x.shape[-1]:
        kth = np.sort(x, axis=-1)[:, -top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    if top_p < 1.0:
        order = np.argsort(-x, axis=-1, kind="stable")
        sorted_x = np.take_along_axis(x, order, axis=-1)
        probs = np.exp(log_softmax(sorted_x))
        before = np.cumsum(probs, axis=-1) - probs  # mass of the tokens ranked above
        drop_sorted = before >= top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        x = np.where(drop, -np.inf, x)
    return x


def choose(logits: np.ndarray, cfg: GenerationConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Each row's next token (greedy, or sampled from the filtered distribution) and its log-prob."""
    if cfg.strategy == "greedy":
        nxt = logits.argmax(-1).astype(np.int64)
        return nxt, chosen_log_probs(logits, nxt)
    filtered = filter_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p)
    logp = log_softmax(filtered)
    cdf = np.cumsum(np.exp(logp), axis=-1)
    u = rng.random(len(logits))[:, None] * cdf[:, -1:]
    nxt = np.minimum((cdf < u).sum(-1), logits.shape[-1] - 1).astype(np.int64)
    return nxt, logp[np.arange(len(logits)), nxt]


def stream_tokens(
    make: StepperFactory, batch: int, bos_id: int, eos_id: EosIds, pad_id: int, cfg: GenerationConfig,
    prompts: np.ndarray | None = None, processor: Processor | None = None, rng: np.random.Generator | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """Greedy or sampled decoding, one step at a time: yields (tokens (B,), their log-probs (B,)),
    ``pad_id`` for rows that already ended, until every row ended or ``max_new_tokens``.

    Each row starts from ``bos_id``, or from its row of ``prompts`` (B, T), fed in one step;
    ``processor(sequences, logits)`` edits each step's logits given the rows so far, prompts
    included (:func:`beam_steps` hands it log-probabilities: transformers' order); ``rng`` draws
    the samples (default: ``cfg.seed``'s)."""
    if cfg.strategy == "beam":
        raise EdgeattnError("beam search has no one token per step and row to stream: stream_positions streams it")
    stepper = _factory(make, cfg)(1)
    eos = eos_array(eos_id)
    rng = np.random.default_rng(cfg.seed) if rng is None else rng
    if prompts is None:
        tokens = np.full(batch, bos_id, dtype=np.int64)
        seen = tokens[:, None]
    else:
        tokens = seen = np.asarray(prompts, dtype=np.int64)
    done = np.zeros(batch, dtype=bool)
    for _ in range(cfg.max_new_tokens):
        logits = stepper.step(tokens)
        if processor is not None:  # on the logits, as transformers' greedy and sampling (beams: log-probabilities)
            logits = processor(seen, logits)
        nxt, chosen = choose(logits, cfg, rng)
        nxt = np.where(done, pad_id, nxt)
        chosen = np.where(done, 0.0, chosen)
        yield nxt, chosen
        done |= np.isin(nxt, eos)
        tokens = nxt
        if processor is not None:
            seen = np.concatenate([seen, nxt[:, None]], axis=1)
        if done.all():
            return


def generate(
    make: StepperFactory, batch: int, bos_id: int, eos_id: EosIds, pad_id: int, cfg: GenerationConfig
) -> GenerationOutput:
    """Decode with the configured strategy; see :class:`GenerationOutput`."""
    if cfg.strategy == "beam":
        return beam_search(make, batch, bos_id, eos_id, pad_id, cfg)
    steps = list(stream_tokens(make, batch, bos_id, eos_id, pad_id, cfg))
    tokens = np.stack([s[0] for s in steps], axis=1)
    scores = np.sum([s[1] for s in steps], axis=0)
    return GenerationOutput(tokens, np.asarray(scores, dtype=np.float64))


@dataclass
class BeamState:
    """Beam search after a step: each row's live beams (B, width, t) and their scores (a beam that
    cannot be extended scores -inf), its finished hypotheses (score, tokens ending in EOS), best
    first, and whether the row is done. The search's own objects: read them before its next step."""

    seqs: np.ndarray
    scores: np.ndarray
    finished: list[list[tuple[float, list[int]]]]
    done: np.ndarray

    def best_finished(self, row: int) -> list[int]:
        """A done row's answer: its best finished hypothesis."""
        return _best(self.finished[row])[1]

    def settled(self, row: int) -> list[int]:
        """The tokens that row's answer is sure to begin with: all of a done row's answer, else what
        every live beam and finished hypothesis has in common (every later candidate extends a
        live beam)."""
        if self.done[row]:
            return self.best_finished(row)
        candidates = [seq.tolist() for seq, score in zip(self.seqs[row], self.scores[row], strict=True)
                      if np.isfinite(score)] + [hyp for _, hyp in self.finished[row]]  # fmt: skip
        if not candidates:
            return []
        common = 0
        for column in zip(*candidates, strict=False):  # up to the shortest candidate
            if any(tok != column[0] for tok in column):
                break
            common += 1
        return candidates[0][:common]


#: Edits one step's log-probabilities (rows, vocab) given each row's whole sequence so far
#: (rows, length: its prompt, then what it generated), as a logits processor does.
Processor = Callable[[np.ndarray, np.ndarray], np.ndarray]


def beam_steps(
    make: StepperFactory, batch: int, bos_id: int, eos_id: EosIds, pad_id: int, cfg: GenerationConfig,
    prompts: np.ndarray | None = None, processor: Processor | None = None,
) -> Generator[BeamState, None, GenerationOutput]:  # fmt: skip
    """Beam search of width ``num_beams`` per row with a length penalty, yielding its state after
    every step and returning the output (what :func:`beam_search` runs to the end).

    Each row starts from ``bos_id``, or from its row of ``prompts`` (B, T), fed in one step. Each
    step takes the log-probabilities of the next token, lets ``processor`` edit them, and ranks,
    per row, the 2·width best continuations of all live beams; one ending in EOS (among the top
    width) becomes a finished hypothesis scored logp / length**penalty (length counts the
    generated tokens, EOS included); the best non-EOS ones stay live. A row stops once it holds
    ``width`` finished hypotheses and no live beam can beat the worst of them.
    """
    n, lp = cfg.num_beams, cfg.length_penalty
    stepper = _factory(make, cfg)(n)
    eos = set(eos_array(eos_id).tolist())
    beam_scores = np.zeros((batch, n))
    beam_scores[:, 1:] = -np.inf  # the first step expands beam 0 alone
    seqs = np.zeros((batch, n, 0), dtype=np.int64)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    done = np.zeros(batch, dtype=bool)
    if prompts is None:
        tokens = np.full(batch * n, bos_id, dtype=np.int64)
        begun = np.full((batch * n, 1), bos_id, dtype=np.int64)
    else:
        tokens = begun = np.repeat(np.asarray(prompts, dtype=np.int64), n, axis=0)
    for t in range(cfg.max_new_tokens):
        logp = log_softmax(stepper.step(tokens))
        if processor is not None:
            logp = processor(np.concatenate([begun, seqs.reshape(batch * n, -1)], axis=1), logp)
        logp = logp.reshape(batch, n, -1)
        vocab = logp.shape[-1]
        flat = (beam_scores[:, :, None] + logp).reshape(batch, n * vocab)
        order = top_indices(flat, 2 * n)
        new_beam = np.zeros((batch, n), dtype=np.int64)
        new_tok = np.full((batch, n), pad_id, dtype=np.int64)
        new_score = np.zeros((batch, n))
        for b in range(batch):
            if done[b]:
                new_beam[b] = np.arange(n)
                new_score[b] = beam_scores[b]
                continue
            live = 0
            for rank, idx in enumerate(order[b]):
                beam, tok = divmod(int(idx), vocab)
                score = float(flat[b, idx])
                if tok in eos:
                    if rank < n:
                        hyp = [*seqs[b, beam].tolist(), tok]
                        _add(finished[b], score / (len(hyp) ** lp), hyp, n)
                    continue
                new_beam[b, live], new_tok[b, live], new_score[b, live] = beam, tok, score
                live += 1
                if live == n:
                    break
            if len(finished[b]) == n:
                best_live = new_score[b].max() / ((t + 1) ** lp)
                done[b] = best_live <= min(s for s, _ in finished[b])
        rows = (np.arange(batch)[:, None] * n + new_beam).reshape(-1)
        stepper.reorder(rows)
        seqs = np.concatenate([np.take_along_axis(seqs, new_beam[:, :, None], axis=1), new_tok[:, :, None]], axis=2)
        beam_scores = new_score
        tokens = new_tok.reshape(-1)
        if done.all():
            break
        yield BeamState(seqs, beam_scores, finished, done)
    for b in range(batch):
        if not done[b]:
            for j in range(n):
                hyp = seqs[b, j].tolist()
                _add(finished[b], beam_scores[b, j] / (max(1, len(hyp)) ** lp), hyp, n)
    best = [_best(f) for f in finished]
    width = max(len(h[1]) for h in best)
    out = np.full((batch, width), pad_id, dtype=np.int64)
    for b, (_, hyp) in enumerate(best):
        out[b, : len(hyp)] = hyp
    return GenerationOutput(out, np.array([s for s, _ in best], dtype=np.float64))


def beam_search(
    make: StepperFactory, batch: int, bos_id: int, eos_id: EosIds, pad_id: int, cfg: GenerationConfig,
    prompts: np.ndarray | None = None, processor: Processor | None = None,
) -> GenerationOutput:  # fmt: skip
    """Beam search to the end; see :func:`beam_steps`."""
    steps = beam_steps(make, batch, bos_id, eos_id, pad_id, cfg, prompts, processor)
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


def stream_beam(
    make: StepperFactory, batch: int, bos_id: int, eos_id: EosIds, pad_id: int, cfg: GenerationConfig
) -> Iterator[np.ndarray]:
    """Beam search that yields its answer's tokens (B,) position by position as soon as every row's
    token there is settled (every beam and finished hypothesis that could still win has it; ``pad_id``
    after a row's EOS). The positions joined are :func:`beam_search`'s tokens."""
    steps = beam_steps(make, batch, bos_id, eos_id, pad_id, cfg)
    emitted = 0
    while True:
        try:
            state = next(steps)
        except StopIteration as stop:
            final = stop.value.tokens
            for position in range(emitted, final.shape[1]):
                yield final[:, position]
            return
        rows = [state.settled(b) for b in range(batch)]
        sure = min((len(r) for r, done in zip(rows, state.done, strict=True) if not done), default=0)
        for position in range(emitted, sure):
            yield np.array([r[position] if position < len(r) else pad_id for r in rows], dtype=np.int64)
        emitted = max(emitted, sure)


def stream_positions(
    make: StepperFactory, batch: int, bos_id: int, eos_id: EosIds, pad_id: int, cfg: GenerationConfig
) -> Iterator[np.ndarray]:
    """Any strategy's tokens (B,) position by position as they are settled: every step's for greedy
    and sampling, for beam search as :func:`stream_beam` settles them."""
    if cfg.strategy == "beam":
        yield from stream_beam(make, batch, bos_id, eos_id, pad_id, cfg)
        return
    for tokens, _ in stream_tokens(make, batch, bos_id, eos_id, pad_id, cfg):
        yield tokens


def _best(hyps: list[tuple[float, list[int]]]) -> tuple[float, list[int]]:
    """The winning hypothesis (the first of equal scores): one rule for the answer and for what
    streaming shows of a done row, so the two cannot disagree."""
    return max(hyps, key=lambda h: h[0])


def _add(hyps: list[tuple[float, list[int]]], score: float, seq: list[int], width: int) -> None:
    hyps.append((score, seq))
    hyps.sort(key=lambda h: -h[0])
    del hyps[width:]
