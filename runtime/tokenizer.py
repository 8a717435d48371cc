"""Tokenizers stored beside the graphs (torch-free): edgeattn's whitespace word tokenizer (the
demo's), and Hugging Face ``tokenizer.json`` files run by the ``tokenizers`` library."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError


class TokenizerError(EdgeattnError, ValueError):
    """Text the tokenizer cannot encode, or a tokenizer file it cannot read."""


class WordTokenizer:
    """Maps whitespace-separated words to ids and back; specials are ``<pad>``, ``<bos>``, ``<eos>``."""

    def __init__(self, vocab: Sequence[str], pad: str = "<pad>", bos: str = "<bos>", eos: str = "<eos>") -> None:
        if len(set(vocab)) != len(vocab):
            raise TokenizerError("tokenizer vocabulary has duplicate entries")
        self.vocab = list(vocab)
        self.ids = {w: i for i, w in enumerate(self.vocab)}
        for special in (pad, bos, eos):
            if special not in self.ids:
                raise TokenizerError(f"tokenizer vocabulary lacks the special token {special!r}")
        self.pad_id, self.bos_id, self.eos_id = self.ids[pad], self.ids[bos], self.ids[eos]
        self.specials = {self.pad_id, self.bos_id, self.eos_id}

    def encode(self, text: str) -> list[int]:
        """Ids of the words of ``text``; unknown words are an error naming them."""
        words = text.split()
        unknown = sorted({w for w in words if w not in self.ids or self.ids[w] in self.specials})
        if unknown:
            known = " ".join(w for w in self.vocab if self.ids[w] not in self.specials)
            raise TokenizerError(f"unknown token(s) {', '.join(map(repr, unknown))}; the vocabulary is: {known}")
        if not words:
            raise TokenizerError("empty input: give at least one token")
        return [self.ids[w] for w in words]

    def decode(self, ids: Iterable[int]) -> str:
        """Words of ``ids`` up to the first EOS, specials dropped."""
        words = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i not in self.specials and 0 <= i < len(self.vocab):
                words.append(self.vocab[i])
        return " ".join(words)

    def to_dict(self) -> dict[str, object]:
        return {"type": "word", "vocab": self.vocab}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> WordTokenizer:
        return cls.from_dict(_read_json(path), path)

    @classmethod
    def from_dict(cls, data: Any, path: str | Path) -> WordTokenizer:
        """The tokenizer ``path`` held, from its parsed JSON."""
        if not isinstance(data, dict) or data.get("type") != "word" or not isinstance(data.get("vocab"), list):
            raise TokenizerError(f"{path} is not an edgeattn word tokenizer")
        return cls(data["vocab"])


def _read_json(path: str | Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"cannot read tokenizer {path}: {exc}") from exc


@dataclass
class TextBatch:
    """Texts tokenized and right-padded into one batch, with what maps tokens back to characters."""

    ids: np.ndarray  # (B, S) int64
    mask: np.ndarray  # (B, S) int64, 1 for tokens
    type_ids: np.ndarray  # (B, S) int64 token types (segments)
    offsets: list[list[tuple[int, int]]]  # per row, per real token: character span in its text
    special: list[list[bool]]  # per row, per real token: a special token ([CLS], </s>, ...)
    words: list[list[int | None]]  # per row, per real token: the index of the word it belongs to


class TextTokenizer:
    """A Hugging Face ``tokenizer.json`` run by the ``tokenizers`` library (the ``text`` extra).

    Batches are padded here (on the right, with the model's pad id). A text longer than the
    model's maximum is an error unless ``truncate`` is asked for, which keeps the first tokens
    and the closing special tokens.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._tok.no_padding()
        self._tok.no_truncation()

    @classmethod
    def load(cls, path: str | Path) -> TextTokenizer:
        return cls.from_dict(_read_json(path), path)

    @classmethod
    def from_dict(cls, data: Any, path: str | Path) -> TextTokenizer:
        """The tokenizer ``path`` held, from its parsed JSON."""
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise TokenizerError(
                f"{path} is a Hugging Face tokenizer; running it needs the tokenizers package "
                "(pip install 'edgeattn[text]')"
            ) from exc
        try:
            return cls(Tokenizer.from_str(json.dumps(data)))
        except Exception as exc:  # tokenizers raises its own exception type
            raise TokenizerError(f"{path} is not a tokenizer the tokenizers library can read: {exc}") from exc

    def save(self, path: str | Path) -> None:
        self._tok.save(str(path))

    def to_json(self) -> str:
        """The tokenizer as ``tokenizer.json`` holds it (what other libraries build theirs from)."""
        return str(self._tok.to_str())

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``, with the special tokens the tokenizer adds around a text (a BOS,
        [CLS] ... [SEP]) unless ``special_tokens`` is False (a rendered chat carries its own)."""
        return list(self._tok.encode(text, add_special_tokens=special_tokens).ids)

    def decode(self, ids: Iterable[int]) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=True))

    def batch(self, texts: Sequence[str], max_len: int, pad_id: int, truncate: bool = False) -> TextBatch:
        """``texts`` as one padded batch of at most ``max_len`` tokens a row."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TokenizerError("texts must be a list of strings")
        if not texts:
            raise TokenizerError("give at least one text")
        rows = []
        for i, encoding in enumerate(self._tok.encode_batch(list(texts))):
            ids, types = list(encoding.ids), list(encoding.type_ids)
            offsets, special = list(encoding.offsets), [bool(s) for s in encoding.special_tokens_mask]
            words = list(encoding.word_ids)
            if len(ids) > max_len:
                if not truncate:
                    raise TokenizerError(
                        f"text {i} is {len(ids)} tokens long; this model takes at most {max_len}: shorten it or "
                        "ask for truncation (truncate=True, --truncate)"
                    )
                tail = 0  # closing special tokens ([SEP], </s>) stay
                while tail < len(ids) and special[len(ids) - 1 - tail]:
                    tail += 1
                keep = list(range(max_len - tail)) + list(range(len(ids) - tail, len(ids)))
                ids, types = [ids[k] for k in keep], [types[k] for k in keep]
                offsets, special = [offsets[k] for k in keep], [special[k] for k in keep]
                words = [words[k] for k in keep]
            rows.append((ids, types, offsets, special, words))
        width = max(len(r[0]) for r in rows)
        ids = np.full((len(rows), width), pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        type_ids = np.zeros_like(ids)
        for i, (row_ids, row_types, *_) in enumerate(rows):
            ids[i, : len(row_ids)] = row_ids
            mask[i, : len(row_ids)] = 1
            type_ids[i, : len(row_ids)] = row_types
        return TextBatch(ids, mask, type_ids, [r[2] for r in rows], [r[3] for r in rows], [r[4] for r in rows])


def load_tokenizer(path: str | Path) -> WordTokenizer | TextTokenizer:
    """The tokenizer in ``path``: edgeattn's word tokenizer, or a Hugging Face ``tokenizer.json``."""
    data = _read_json(path)
    if isinstance(data, dict) and data.get("type") == "word":
        return WordTokenizer.from_dict(data, path)
    if isinstance(data, dict) and "model" in data:
        return TextTokenizer.from_dict(data, path)
    raise TokenizerError(f"{path} is neither an edgeattn word tokenizer nor a Hugging Face tokenizer.json")
