"""Continuous batching of a language model's generations: concurrent requests share one batch of
the runtime's in-place cache. A request's prompt runs alone, then the request joins the batch at
the next step and leaves it when it ends (or its client goes); each step feeds every row one
token. Greedy answers equal what each request gets alone."""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.families.causal.runtime import CausalState
from edgeattn.runtime.generate import filter_logits, log_softmax
from edgeattn.runtime.text_generation import AnswerText

log = logging.getLogger(__name__)

#: free slots a merged batch keeps after its longest row, so that steps seldom grow the cache
ROOM = 64
#: steps a freed row waits for a newcomer before the batch is compacted without it (each step
#: feeds every row, free or not)
IDLE_STEPS = 8


@dataclass
class Piece:
    """What one step of a request added: its text (may be empty while a stop string could
    start), the token, its log-probability and the most likely alternatives'."""

    text: str
    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Finished:
    """A request's end: why ("stop", "length", "cancelled" or "error"), and token counts."""

    reason: str
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None
    #: text held back in case a stop string began, given at the end
    tail: str = ""


@dataclass
class Generation:
    """One generation a client asked for, and where its pieces go (``emit``, called from the
    batching thread)."""

    ids: list[int]
    max_tokens: int
    emit: Callable[[Piece | Finished], None]
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    #: how many alternatives each piece reports (0: none)
    top_logprobs: int = 0
    #: the grammar the answer keeps to (:class:`edgeattn.runtime.constrained.Constraint`), if any
    constraint: Any = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: the answer so far: its tokens, and the text shown of it
    answer: AnswerText | None = None
    done: bool = False

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    @property
    def tokens(self) -> list[int]:
        """The answer's tokens so far."""
        return [] if self.answer is None else self.answer.tokens


class Batcher:
    """Runs the generations given to :meth:`submit` in one batch of at most ``max_rows`` rows, in
    its own thread, until :meth:`close`.

    A row whose generation ends stays in the batch, free, fed a placeholder token, until a new
    generation takes it over (its prompt's cache copied into that row alone) or the batch is
    compacted: when its free rows outnumber the busy ones, when a row has stayed free for
    :data:`IDLE_STEPS` steps with nobody waiting, or when its cache runs out of slots (the busy
    rows' filled slots copied into a new batch with room after the longest). A batch of
    clients that come and go thus copies one row's cache per arrival, not the whole batch's."""

    def __init__(self, model: Any, max_rows: int = 8) -> None:
        if max_rows < 1:
            raise EdgeattnError(f"a batch needs at least one row, not {max_rows}")
        self.model, self.max_rows = model, max_rows
        self.tokenizer = model._tokenizer()
        self.waiting: queue.Queue[Generation | None] = queue.Queue()
        #: the generation each row of the batch's state holds (None: a free row)
        self.slots: list[Generation | None] = []
        #: the step at which each free row was freed
        self.freed_at: dict[int, int] = {}
        self.state: CausalState | None = None
        self.steps = 0
        #: the most rows one step has fed, and how generations ended, by reason (tests, figures)
        self.widest = 0
        self.ended: Counter[str] = Counter()
        #: how rows joined the batch: "placed" into a free row, or "merged" into a new batch
        self.joins: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._run, name="edgeattn-batcher", daemon=True)
        self._thread.start()

    def submit(self, generation: Generation) -> None:
        self.waiting.put(generation)

    def close(self) -> None:
        self.waiting.put(None)
        self._thread.join(timeout=30)

    @property
    def active(self) -> list[Generation]:
        """The generations the batch decodes now."""
        return [g for g in self.slots if g is not None]

    @property
    def rows(self) -> int:
        """Generations in the batch now."""
        return len(self.active)

    # ------------------------------------------------------------------ loop
    def _run(self) -> None:
        while True:
            joined, closing = self._admit()
            if closing:
                for g in self.active:
                    self._finish(g, "cancelled")
                return
            try:
                self._regroup(joined)
                if self.state is None:
                    continue
                if self.state.position >= self.state.capacity:  # out of slots: compact rather than grow
                    self._compact()
                tokens = np.array([[g.tokens[-1] if g is not None else 0] for g in self.slots], dtype=np.int64)
                logits = self.state.feed(tokens)
                self.steps += 1
                self.widest = max(self.widest, self.rows)
                for g, row in zip(self.slots, logits, strict=True):
                    if g is not None and not g.cancelled.is_set():
                        self._advance(g, row)
            except Exception as exc:  # a broken step ends every request in it, with the reason
                log.exception("batch step failed")
                for g in self.active:
                    self._finish(g, "error", str(exc))
                self.slots, self.state, self.freed_at = [], None, {}
            self._leave()

    def _admit(self) -> tuple[list[tuple[Generation, CausalState]], bool]:
        """Waiting generations, their prompts run alone (blocking while the batch is empty)."""
        joined: list[tuple[Generation, CausalState]] = []
        while self.rows + len(joined) < self.max_rows:
            try:
                g = self.waiting.get(block=not self.rows and not joined)
            except queue.Empty:
                break
            if g is None:
                for waiting, _ in joined:
                    self._finish(waiting, "cancelled")
                return joined, True
            if g.cancelled.is_set():
                self._finish(g, "cancelled")
                continue
            try:
                alone = self.model.state(np.array([g.ids]), np.ones((1, len(g.ids)), np.int64))
                self._advance(g, alone.step(np.zeros(1, np.int64))[0])
            except Exception as exc:
                log.exception("prompt failed")
                self._finish(g, "error", str(exc))
                continue
            if not g.done:
                joined.append((g, alone))
        return joined, False

    def _regroup(self, joined: list[tuple[Generation, CausalState]]) -> None:
        """The new rows into free rows of the batch where they fit, else a new batch of the busy
        rows and the new ones."""
        rest = []
        for g, alone in joined:
            free = next((i for i, held in enumerate(self.slots) if held is None), None)
            if self.state is not None and free is not None and self.state.place(free, alone, 0):
                self.slots[free] = g
                self.freed_at.pop(free, None)
                self.joins["placed"] += 1
            else:
                rest.append((g, alone))
        if not rest:
            return
        busy = [i for i, g in enumerate(self.slots) if g is not None]
        rows = [(self.state, i) for i in busy] if self.state is not None else []
        self.state = CausalState.merged(self.model, rows + [(alone, 0) for _, alone in rest], room=ROOM)
        self.slots = [self.slots[i] for i in busy] + [g for g, _ in rest]
        self.freed_at = {}
        self.joins["merged"] += len(rest)

    def _compact(self) -> None:
        """A new batch of the busy rows alone, their filled slots at the front, room after them."""
        assert self.state is not None
        busy = [i for i, g in enumerate(self.slots) if g is not None]
        self.state = CausalState.merged(self.model, [(self.state, i) for i in busy], room=ROOM) if busy else None
        self.slots = [self.slots[i] for i in busy]
        self.freed_at = {}

    def _leave(self) -> None:
        """Rows whose generation ended (or whose client went) are freed; the batch is compacted
        when its free rows outnumber its busy ones, or when a row has stayed free for
        :data:`IDLE_STEPS` steps with nobody waiting (each step feeds every row)."""
        for i, g in enumerate(self.slots):
            if g is None:
                continue
            if g.cancelled.is_set() and not g.done:
                self._finish(g, "cancelled")
            if g.done:
                self.slots[i] = None
                self.freed_at[i] = self.steps
        free = len(self.freed_at)
        idle = free and self.waiting.empty() and self.steps - min(self.freed_at.values()) >= IDLE_STEPS
        if free and (free > self.rows or self.rows == 0 or idle):
            self._compact()

    # ------------------------------------------------------------- one token
    def _advance(self, g: Generation, logits: np.ndarray) -> None:
        """Choose ``g``'s next token from its row's logits, emit what it adds, end it when due."""
        scores = logits.astype(np.float32)
        if g.tokens and (g.presence_penalty or g.frequency_penalty):
            seen, counts = np.unique(np.array(g.tokens), return_counts=True)
            scores = scores.copy()
            scores[seen] -= g.presence_penalty + g.frequency_penalty * counts
        if g.constraint is not None:  # only the tokens that keep the answer on its grammar
            scores = g.constraint.mask(scores)
        logp = log_softmax(scores[None])[0]
        if g.temperature == 0:
            token = int(scores.argmax())
        else:
            filtered = log_softmax(filter_logits(scores[None], g.temperature, 0, g.top_p))[0]
            probs = np.exp(filtered)
            token = int(g.rng.choice(len(probs), p=probs / probs.sum()))
        top = []
        if g.top_logprobs:
            best = np.argsort(-logp, kind="stable")[: g.top_logprobs]
            top = [(int(t), float(logp[t])) for t in best]
        if token in self.model.stop_ids:
            self._finish(g, "stop")
            return
        if g.constraint is not None:
            g.constraint.consume(token)
        if g.answer is None:
            g.answer = AnswerText(self.tokenizer, g.stop)
        # the answer is whole at its length limit, or when its grammar allows nothing more
        complete = g.constraint is not None and g.constraint.finished
        whole = complete or len(g.tokens) + 1 >= g.max_tokens
        piece = g.answer.add(token, whole)
        g.emit(Piece(piece, token, float(logp[token]), top))
        if g.answer.stopped or whole:
            self._finish(g, "stop" if g.answer.stopped or complete else "length")

    def _finish(self, g: Generation, reason: str, error: str | None = None) -> None:
        if g.done:
            return
        g.done = True
        self.ended[reason] += 1
        # a stop token: what was held back in case a stop string began
        tail = g.answer.finish() if reason == "stop" and g.answer is not None else ""
        g.emit(Finished(reason, len(g.ids), len(g.tokens), error, tail))
