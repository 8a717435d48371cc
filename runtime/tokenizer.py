"""A whitespace word-level tokenizer stored as JSON beside the graphs (torch-free)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

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
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise TokenizerError(f"cannot read tokenizer {path}: {exc}") from exc
        if not isinstance(data, dict) or data.get("type") != "word" or not isinstance(data.get("vocab"), list):
            raise TokenizerError(f"{path} is not an edgeattn word tokenizer")
        return cls(data["vocab"])
