"""Exports the bundle tests package, and the texts they check bundles on."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeattn.exporters.export import export_model
from edgeattn.sources import resolve_model
from tests.helpers.encoder_folders import BERT_SPECIALS, make_checkpoint, make_tokenizer

pytest.importorskip("transformers")


BUNDLE_TEXTS = ["Angela Merkel visited Warsaw in May.", "Edge devices run.",
         "Ada Lovelace wrote notes about Paris today, and about the sea."]  # fmt: skip


def bert_export(root: Path, head: str) -> Path:
    make_checkpoint("Bert", head).save_pretrained(root / "hf")
    make_tokenizer(*BERT_SPECIALS).save_pretrained(root / "hf")
    source = resolve_model(from_hf=root / "hf")
    fields = {k: v for k, v in source.export_fields().items() if k != "heldout_texts"}
    export_model(source.model, root / "out", graphs=["encoder"], precisions=["int8"], verify=False, **fields)
    return root / "out"


#: texts whose pieces are hard to place: accents, an unknown word, CJK ideographs, tabs and runs of spaces
HARD_TEXTS = [*BUNDLE_TEXTS, "Zoë visited Kraków, then 東京!  Ünïcode   spaces\tand\ttabs.", "ok"]


#: prompts in the trained tokenizer's vocabulary (a BPE with no unknown token: text outside it is
#: dropped by Python's tokenizers and kept as pieces by tokenizers.js, which the check would flag)
PROMPTS = ["the sea is", "write a haiku about the sea", "hello how are", "waves fold over the sand under"]
