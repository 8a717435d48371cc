"""Generation and its text, written once for every family whose runtime continues tokens (the
encoder-decoder's and the decoder-only's; the speech family searches with the same core).

A runtime says how it decodes a batch (:meth:`TokenGeneration._decoding`: its decoding states,
start, stop and pad ids); :class:`TokenGeneration` gives it ``generate`` / ``stream`` / ``greedy``
over :mod:`edgeattn.runtime.generate`'s searches, and the answers' text: up to a stop token or the
first of the caller's stop strings, whole or streamed piece by piece (:class:`AnswerText`, which
the server's running batch uses too). Torch-free: numpy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from edgeattn.runtime.generate import GenerationOutput, eos_array, generate, stream_positions


class Detokenizer(Protocol):
    def decode(self, ids: Any) -> str: ...


def cut_at_stop(text: str, stop: Sequence[str]) -> str | None:
    """``text`` up to the first stop string in it, or None when it holds none."""
    found = [text.index(s) for s in stop if s and s in text]
    return text[: min(found)] if found else None


def held_back(text: str, stop: Sequence[str]) -> int:
    """How many characters at the end of ``text`` could begin a stop string (not shown yet)."""
    held = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                held = max(held, k)
                break
    return held


def until_stop(row: np.ndarray, stop_ids: Sequence[int]) -> np.ndarray:
    """A generated row up to (not including) its first stop token."""
    ends = np.flatnonzero(np.isin(row, eos_array(list(stop_ids))))
    return row[: ends[0]] if ends.size else row


class AnswerText:
    """One answer's text as its tokens arrive (the stop token not among them): :meth:`add` gives
    what each token adds to the text shown so far, holding back an end that could begin one of
    the ``stop`` strings; once a stop string appears the answer is cut before it
    (:attr:`stopped`). The pieces and :meth:`finish`'s tail join to :attr:`text`."""

    def __init__(self, tokenizer: Detokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.tokens: list[int] = []
        self.shown = ""
        #: the text before the first stop string, once one appeared
        self.cut: str | None = None

    @property
    def stopped(self) -> bool:
        """Whether a stop string ended the answer."""
        return self.cut is not None

    @property
    def text(self) -> str:
        """The answer: up to the first stop string, else all its tokens' text."""
        return self.cut if self.cut is not None else self.tokenizer.decode(self.tokens)

    def add(self, token: int, whole: bool = False) -> str:
        """The piece ``token`` adds to the shown text ("" while a word or a possible stop string is
        incomplete); ``whole``: no more tokens come, so nothing is held back."""
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens)
        self.cut = cut_at_stop(text, self.stop)
        if self.cut is not None:
            return self._show(self.cut)
        return self._show(text if whole else text[: len(text) - held_back(text, self.stop)])

    def finish(self) -> str:
        """What was held back in case a stop string began, once the answer ends without one."""
        return "" if self.stopped else self._show(self.tokenizer.decode(self.tokens))

    def _show(self, shown: str) -> str:
        if shown.startswith(self.shown) and len(shown) > len(self.shown):
            piece, self.shown = shown[len(self.shown) :], shown
            return piece
        return ""


class TokenGeneration:
    """``generate`` / ``stream`` / ``greedy`` and the answers' text, for a runtime that gives
    :meth:`_decoding` and :attr:`stop_ids`."""

    #: the tokens that end a row (a chat model may have several: end of text, end of turn)
    stop_ids: list[int]

    def _decoding(self, input_ids: Any, attention_mask: Any, max_new_tokens: int, strategy: str,
                  eos_id: int | Sequence[int] | None, options: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        """Checked settings and inputs as the keyword arguments of the search functions."""
        raise NotImplementedError

    def generate(self, input_ids: Any, attention_mask: Any = None, max_new_tokens: int = 32,
                 strategy: str = "greedy", eos_id: int | Sequence[int] | None = None,
                 **options: Any) -> GenerationOutput:  # fmt: skip
        """Generate for a batch of inputs of different lengths (padding marked by the mask).
        ``strategy``: ``greedy``, ``beam`` (``num_beams``, ``length_penalty``) or ``sample``
        (``temperature``, ``top_k``, ``top_p``, ``seed``); ``repetition_penalty`` with any; a
        decoder-only model also takes ``json_schema`` (a dict) or ``regex``, decoding each answer
        under that grammar (greedy or sampled; llguidance), and ``prompt_logits(column, logits)``,
        given the prompt's logits after every token as it is read (teacher forcing in the same
        pass). Each row stops at ``eos_id`` (default:
        the model's stop ids). Returns the new tokens (B, N), padded with ``pad_id`` after a row's
        stop token, and per-row scores."""
        return generate(**self._decoding(input_ids, attention_mask, max_new_tokens, strategy, eos_id, options))

    def stream(self, input_ids: Any, attention_mask: Any = None, max_new_tokens: int = 32,
               strategy: str = "greedy", eos_id: int | Sequence[int] | None = None,
               **options: Any) -> Iterator[np.ndarray]:  # fmt: skip
        """:meth:`generate`'s tokens (B,) position by position as they are settled: greedy and
        sampling every step; beam search once every beam that could still win agrees on them."""
        yield from stream_positions(
            **self._decoding(input_ids, attention_mask, max_new_tokens, strategy, eos_id, options)
        )

    def greedy(self, input_ids: Any, attention_mask: Any = None, max_new_tokens: int = 20,
               stop_at_eos: bool = True) -> np.ndarray:  # fmt: skip
        """Greedy tokens (B, N); with ``stop_at_eos=False`` every row runs all steps."""
        return self.generate(input_ids, attention_mask, max_new_tokens, eos_id=None if stop_at_eos else -1).tokens

    def _answers(self, tokenizer: Detokenizer, ids: np.ndarray, mask: np.ndarray, max_new_tokens: int,
                 stop: Sequence[str], options: dict[str, Any]) -> list[tuple[str, np.ndarray]]:  # fmt: skip
        """Each row's answer text and tokens: up to (not including) a stop token, or up to the
        token that completed one of the ``stop`` strings (the text cut before it)."""
        if not any(stop):
            out = self.generate(ids, mask, max_new_tokens, **options).tokens
            kept = [until_stop(row, self.stop_ids) for row in out]
            return [(tokenizer.decode(row), row) for row in kept]
        answers = [AnswerText(tokenizer, stop) for _ in range(ids.shape[0])]
        ended = [False] * len(answers)
        for step in self.stream(ids, mask, max_new_tokens, **options):
            for i, token in enumerate(step.tolist()):
                if ended[i]:
                    continue
                if token in self.stop_ids:
                    ended[i] = True
                    continue
                answers[i].add(token)
                ended[i] = answers[i].stopped
            if all(ended):
                break  # every row is done: the rest of the search is not run
        return [(a.text, np.array(a.tokens, dtype=np.int64)) for a in answers]

    def _pieces(self, tokenizer: Detokenizer, ids: np.ndarray, mask: np.ndarray, max_new_tokens: int,
                stop: Sequence[str], options: dict[str, Any]) -> Iterator[str]:  # fmt: skip
        """One row's answer as it grows (see :func:`answer_pieces`), the pieces joining to
        :meth:`_answers`' text."""
        yield from answer_pieces(tokenizer, self.stream(ids, mask, max_new_tokens, **options), self.stop_ids, stop)


def answer_pieces(tokenizer: Detokenizer, steps: Iterator[np.ndarray], stop_ids: Sequence[int],
                  stop: Sequence[str] = ()) -> Iterator[str]:  # fmt: skip
    """The answer of one row whose tokens ``steps`` gives (an array of one a step) as it grows:
    each piece is what a token adds to its text (see :class:`AnswerText`), up to a stop token
    or a stop string."""
    answer = AnswerText(tokenizer, stop)
    for step in steps:
        token = int(step[0])
        if token in stop_ids:
            break
        piece = answer.add(token)
        if piece:
            yield piece
        if answer.stopped:
            return
    tail = answer.finish()
    if tail:
        yield tail
