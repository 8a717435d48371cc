"""The runtimes of families with an encoder graph: the encoder family's (encode, classify, tag,
embed), and what an encoder-decoder's shares with it (encoding a checked source).

Torch-free: numpy and onnxruntime (and ``tokenizers`` for text).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime import text
from edgeattn.runtime.exported_model import ExportedModel, InputError, _int_matrix, _is_text, batch_texts
from edgeattn.runtime.specs import encoder_feeds
from edgeattn.runtime.tokenizer import TextBatch

#: the graph that encodes a source, in every family that has one
ENCODER = "encoder"


class SourceEncoding(ExportedModel):
    """A runtime whose family encodes a source with its ``encoder`` graph."""

    def encoder_feeds(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None) -> dict[str, Any]:
        """Checked encoder feeds; ``token_type_ids`` (B, S) only for models with token types
        (zeros when not given)."""
        ids, mask = self.check_source(input_ids, attention_mask)
        types = None
        if token_type_ids is not None:
            if not self.config.token_types:
                raise InputError("this model has no token types; leave token_type_ids out")
            types = _int_matrix(token_type_ids, "token_type_ids")
            if types.shape != ids.shape:
                raise InputError(f"token_type_ids has shape {types.shape} but input_ids has {ids.shape}")
            if ((types < 0) | (types >= self.config.token_types)).any():
                raise InputError(f"token_type_ids must lie in 0..{self.config.token_types - 1}")
        return encoder_feeds(self.specs[ENCODER].input_names, ids, mask, types)

    def encode(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None) -> np.ndarray:
        """Encoder hidden states (B, S, d_model)."""
        return self.run(ENCODER, self.encoder_feeds(input_ids, attention_mask, token_type_ids))["last_hidden_state"]

    def _types(self, batch: TextBatch) -> np.ndarray | None:
        return batch.type_ids if self.config.token_types else None



class EncoderRuntime(SourceEncoding):
    """An encoder export (BERT family): hidden states, and by its head, labels of each text or of
    each token, or pooled embeddings; token ids or texts in."""

    def _logits(self, input_ids: Any, attention_mask: Any, token_type_ids: Any, head: str) -> np.ndarray:
        if self.config.head != head:
            raise EdgeattnError(f"this model has no {head}-classification head (head={self.config.head!r})")
        return self.run(ENCODER, self.encoder_feeds(input_ids, attention_mask, token_type_ids))["logits"]

    def classify(
        self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None, *, truncate: bool = False
    ) -> Any:
        """Texts (a string or a list of strings, tokenized by the export's tokenizer): one
        :class:`~edgeattn.runtime.text.Classification` each (label, probability, every label's
        probability). Token ids (B, S): the logits (B, num_labels)."""
        if not _is_text(input_ids):
            return self._logits(input_ids, attention_mask, token_type_ids, "sequence")
        batch = self.text_batch(input_ids, truncate)
        logits = self._logits(batch.ids, batch.mask, self._types(batch), "sequence")
        return text.classifications(logits, text.label_names(self.labels, logits.shape[-1]))

    def tag(
        self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None, *, truncate: bool = False,
        aggregation: str = "simple",
    ) -> Any:  # fmt: skip
        """Texts: the entities of each (a list of :class:`~edgeattn.runtime.text.Entity`: type,
        score, character span into the text; B-/I- tags merged as the ``simple`` aggregation of
        transformers' pipeline merges them; ``aggregation="first"`` labels each word by its first
        piece). Token ids (B, S): the logits (B, S, num_labels)."""
        if not _is_text(input_ids):
            return self._logits(input_ids, attention_mask, token_type_ids, "token")
        if aggregation not in text.AGGREGATIONS:
            raise InputError(f"aggregation {aggregation!r} is not one of {', '.join(text.AGGREGATIONS)}")
        batch = self.text_batch(input_ids, truncate)
        logits = self._logits(batch.ids, batch.mask, self._types(batch), "token")
        labels = text.label_names(self.labels, logits.shape[-1])
        texts = batch_texts(input_ids)
        return [
            text.entities(logits[i], t, batch.offsets[i], batch.special[i], labels, batch.words[i], aggregation)
            for i, t in enumerate(texts)
        ]

    def embed(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None, *, truncate: bool = False
              ) -> np.ndarray:  # fmt: skip
        """One vector per text (or per row of token ids): token vectors pooled as the export says
        (a sentence-embedding folder's pooling; else the mean over real tokens), L2-normalised unless
        the pooling says otherwise. (B, d_model) float32."""
        if _is_text(input_ids):
            batch = self.text_batch(input_ids, truncate)
            feeds = self.encoder_feeds(batch.ids, batch.mask, self._types(batch))
        else:
            feeds = self.encoder_feeds(input_ids, attention_mask, token_type_ids)
        hidden = self.run(ENCODER, feeds)["last_hidden_state"]
        return text.pool(hidden, feeds["attention_mask"], self.pooling)

