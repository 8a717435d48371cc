"""The encoder-decoder family's runtime: generation (greedy, beam, sampling), streaming, and their
text forms, over the exported encoder, cross_kv and decoder graphs.

Every call keeps its own decoding state (:class:`OnnxStepper`, or :class:`SlotStepper` over the
``decoder_fixed`` graph's cache written in place), so one model serves several threads.
Torch-free: numpy and onnxruntime (and ``tokenizers`` for text).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.cross_decoding import (
    CROSS_INPUT,
    CROSS_KV,
    DECODER_FIXED,
    ENCODER_OUTPUT,
    OnnxStepper,
    SlotStepper,
    empty_cache,
)
from edgeattn.runtime.exported_model import InputError, batch_texts
from edgeattn.runtime.families.encoder.runtime import ENCODER, SourceEncoding
from edgeattn.runtime.layout import TOKENIZER
from edgeattn.runtime.text_generation import TokenGeneration
from edgeattn.runtime.tokenizer import TextTokenizer, TokenizerError


class Seq2SeqRuntime(TokenGeneration, SourceEncoding):
    """An encoder-decoder export (T5 family, edgeattn's own): generate and stream tokens or text."""

    def _attached(self) -> None:
        self._cache_slots = True
        #: the token that ends a row
        self.stop_ids: list[int] = [self.config.eos_id]

    # ------------------------------------------------------------- generation
    def empty_cache(self, rows: int) -> dict[str, np.ndarray]:
        """A self-attention cache of length 0 (the first decoder step) for ``rows`` rows."""
        return empty_cache(self.config, rows)

    def _decoding(
        self, input_ids: Any, attention_mask: Any, max_new_tokens: int, strategy: str,
        eos_id: int | Sequence[int] | None, options: dict[str, Any],
    ) -> dict[str, Any]:  # fmt: skip
        """Checked settings and inputs as the keyword arguments of the search functions."""
        if not self.family.generates_with(self.sessions):
            raise EdgeattnError(
                "generation needs the encoder, cross_kv and decoder graphs; export with --graphs decoder"
            )
        cfg = self.generation_config(max_new_tokens, strategy, options)
        if max_new_tokens > self.config.max_len:
            raise InputError(f"max_new_tokens={max_new_tokens} exceeds the model's max_len {self.config.max_len}")
        ids, mask = self.check_source(input_ids, attention_mask)
        c = self.config
        return {
            "make": lambda n: self.stepper(ids, mask, n, capacity=cfg.max_new_tokens),
            "batch": ids.shape[0],
            "bos_id": c.bos_id,
            "eos_id": self.stop_ids if eos_id is None else eos_id,
            "pad_id": c.pad_id,
            "cfg": cfg,
        }

    @property
    def cache_slots(self) -> bool:
        """Whether generation runs the ``decoder_fixed`` graph (a cache of fixed capacity written in
        place) rather than ``decoder`` (a cache grown by concatenation every step): where the export
        has it, unless set False."""
        return self._cache_slots and DECODER_FIXED in self.sessions

    @cache_slots.setter
    def cache_slots(self, value: bool) -> None:
        self._cache_slots = bool(value)

    def source_state(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[dict[str, np.ndarray],
                                                                                       np.ndarray]:  # fmt: skip
        """A checked source's cross-attention keys and values (the encoder and cross_kv graphs, once)
        and the mask of its positions the decoder attends to."""
        hidden = self.run(ENCODER, {"input_ids": input_ids, "attention_mask": attention_mask})[ENCODER_OUTPUT]
        return self.run(CROSS_KV, {CROSS_INPUT: hidden}), attention_mask

    def stepper(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, repeat: int = 1, capacity: int | None = None
    ) -> OnnxStepper:
        """A decoding state for checked inputs: the encoder and cross projections run here, once.
        With a ``capacity`` (the most steps it will take) and :attr:`cache_slots`, its cache has
        that many slots, allocated here and written in place."""
        if capacity is not None and self.cache_slots:
            return SlotStepper(self, input_ids, attention_mask, repeat, capacity)
        return OnnxStepper(self, input_ids, attention_mask, repeat)

    # ------------------------------------------------------------------- text
    def generate_text(
        self, texts: Any, max_new_tokens: int | None = None, *, stop: Sequence[str] = (), truncate: bool = False,
        **options: Any,
    ) -> list[str]:  # fmt: skip
        """Tokenize ``texts`` (one string or a list), generate, and decode the answers (needs the
        export's tokenizer): each up to its end token, or up to (not including) the first of the
        ``stop`` strings. ``max_new_tokens`` defaults to twice the longest input plus 8; a text
        longer than the model takes is an error unless ``truncate``."""
        return [answer for answer, _ in self.generate_answers(texts, max_new_tokens, stop=stop, truncate=truncate,
                                                               **options)]  # fmt: skip

    def generate_answers(
        self, texts: Any, max_new_tokens: int | None = None, *, stop: Sequence[str] = (), truncate: bool = False,
        **options: Any,
    ) -> list[tuple[str, np.ndarray]]:  # fmt: skip
        """As :meth:`generate_text`, with each answer's tokens (up to, not including, its end token;
        up to the one that completed a stop string)."""
        ids, mask = self._text_source(texts, truncate)
        steps = max_new_tokens or self._default_steps(ids.shape[1])
        return self._answers(self._detokenizer(), ids, mask, steps, stop, options)

    def stream_text(
        self, text_in: str, max_new_tokens: int | None = None, *, stop: Sequence[str] = (), truncate: bool = False,
        **options: Any,
    ) -> Iterator[str]:  # fmt: skip
        """Generation for one text that yields the answer's text as it grows (any strategy; see
        :meth:`stream`): each piece is what the tokens so far add to the decoded answer (a sub-word
        piece may add nothing until its word is complete; one that could begin a stop string
        waits), so the pieces join to :meth:`generate_text`'s answer."""
        ids, mask = self._text_source([text_in], truncate)
        steps = max_new_tokens or self._default_steps(ids.shape[1])
        yield from self._pieces(self._detokenizer(), ids, mask, steps, stop, options)

    def _detokenizer(self) -> Any:
        assert self.tokenizer is not None  # _text_source refused an export without one
        return self.tokenizer

    def _default_steps(self, width: int) -> int:
        """New tokens when none are asked for: twice the longest source plus 8, within max_len."""
        return min(self.config.max_len, 2 * width + 8)

    def _text_source(self, texts: Any, truncate: bool) -> tuple[np.ndarray, np.ndarray]:
        """(ids, mask) of texts through the export's tokenizer, right-padded."""
        if self.tokenizer is None:
            where = self.export_dir or "this model"
            raise EdgeattnError(f"{where} has no {TOKENIZER}; pass token ids to generate() instead")
        if isinstance(self.tokenizer, TextTokenizer):
            batch = self.text_batch(texts, truncate)
            return batch.ids, batch.mask
        try:
            encoded = [self.tokenizer.encode(t) for t in batch_texts(texts)]
        except TokenizerError as exc:
            raise InputError(str(exc)) from exc
        width = max(len(e) for e in encoded)
        ids = np.full((len(encoded), width), self.config.pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, e in enumerate(encoded):
            ids[i, : len(e)] = e
            mask[i, : len(e)] = 1
        return ids, mask
