"""Decoding under a grammar: a JSON schema or a regular expression, each step's tokens masked to
those that keep the answer on it, by llguidance (the constrained-decoding library
onnxruntime-genai and llama.cpp use). Needs ``pip install llguidance``."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.exported_model import InputError

#: how JSON answers are laid out: one space after a comma and a colon, no other whitespace (a
#: grammar that allows any whitespace lets a weak model spend its tokens on it: a random Llama
#: answered ``{"ok":true,\t"n":1\t\r\t\r...`` until its 60 tokens ran out)
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _llguidance() -> Any:
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401
    except ImportError:
        raise EdgeattnError("decoding under a JSON schema or a regular expression needs llguidance: "
                            "pip install llguidance") from None  # fmt: skip
    return llguidance


def token_table(model: Any) -> Any:
    """llguidance's view of ``model``'s tokenizer (built once per model: about a second for a
    50k vocabulary), its end tokens the model's stop ids."""
    table = getattr(model, "_grammar_tokens", None)
    if table is None:
        llguidance = _llguidance()
        tokenizer = model._tokenizer()
        table = llguidance.LLTokenizer(tokenizer.to_json(), n_vocab=model.config.vocab_size,
                                       eos_token=list(model.stop_ids))  # fmt: skip
        model._grammar_tokens = table
    return table


class Constraint:
    """One answer's grammar state: :meth:`mask` the next token's scores, :meth:`consume` the
    token chosen; :attr:`finished` once the grammar allows nothing more."""

    def __init__(self, model: Any, grammar: str, what: str) -> None:
        llguidance = _llguidance()
        self.vocab = model.config.vocab_size
        self.matcher = llguidance.LLMatcher(token_table(model), grammar, log_level=0)
        if self.matcher.is_error():
            raise InputError(f"{what} cannot be decoded under: {self.matcher.get_error()}")
        self._bits = llguidance.numpy.allocate_token_bitmask(1, self.vocab)

    @classmethod
    def json_schema(cls, model: Any, schema: dict[str, Any] | str) -> Constraint:
        """Answers that are JSON valid under ``schema`` (``{"type": "object"}``: any object)."""
        llguidance = _llguidance()
        text = schema if isinstance(schema, str) else json.dumps(schema)
        grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT)
        return cls(model, grammar, "the JSON schema")

    @classmethod
    def lark(cls, model: Any, grammar: str) -> Constraint:
        """Answers in the language of ``grammar`` (llguidance's Lark syntax, ``%json {...}`` for an
        embedded JSON schema)."""
        return cls(model, _llguidance().LLMatcher.grammar_from_lark(grammar), "the grammar")

    @classmethod
    def of(cls, model: Any, kind: str, text: str) -> Constraint:
        """A grammar by kind: ``json_schema`` (text of a schema), ``lark`` or ``regex``."""
        makers = {"json_schema": cls.json_schema, "lark": cls.lark, "regex": cls.regex}
        if kind not in makers:
            raise InputError(f"grammar kind is one of {', '.join(makers)}, not {kind!r}")
        return makers[kind](model, text)

    @classmethod
    def regex(cls, model: Any, pattern: str) -> Constraint:
        """Answers that match ``pattern`` whole."""
        return cls(model, _llguidance().LLMatcher.grammar_from_regex(pattern), "the regular expression")

    def mask(self, scores: np.ndarray) -> np.ndarray:
        """``scores`` (vocab,) with every token the grammar does not allow next at -inf."""
        import llguidance.numpy

        llguidance.numpy.fill_next_token_bitmask(self.matcher, self._bits, 0)
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: len(scores)].astype(bool)
        if not allowed.any():
            raise EdgeattnError(f"the grammar allows no token next: {self.matcher.get_error() or 'a dead end'}")
        return np.where(allowed, scores, -np.inf).astype(np.float32)

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(token) or self.matcher.is_error():
            raise EdgeattnError(f"token {token} left the grammar: {self.matcher.get_error()}")

    @property
    def finished(self) -> bool:
        """Whether the grammar is complete and allows nothing more."""
        return bool(self.matcher.is_stopped())


class Constrained:
    """A stepper whose rows' logits are masked by their grammars (one :class:`Constraint` a row),
    each fed the token its row chose; a row that ended (a stop token) is left alone."""

    def __init__(self, inner: Any, grammars: list[Constraint], stop_ids: list[int]) -> None:
        self.inner, self.grammars, self.stop_ids = inner, grammars, set(stop_ids)
        self.ended = np.zeros(len(grammars), dtype=bool)
        self.started = False

    def step(self, tokens: np.ndarray) -> np.ndarray:
        if self.started:
            for row, token in enumerate(np.asarray(tokens).reshape(-1).tolist()):
                if self.ended[row]:
                    continue
                if token in self.stop_ids:
                    self.ended[row] = True
                else:
                    self.grammars[row].consume(token)
        self.started = True
        logits = np.array(self.inner.step(tokens), dtype=np.float32)
        for row, grammar in enumerate(self.grammars):
            if not self.ended[row]:
                logits[row] = grammar.mask(logits[row])
        return logits

    def reorder(self, index: np.ndarray) -> None:
        if not np.array_equal(index, np.arange(len(self.grammars))):
            raise EdgeattnError("a grammar-constrained decoding does not reorder its rows (no beam search)")
        self.inner.reorder(index)

    def seen(self) -> np.ndarray:
        return self.inner.seen()
