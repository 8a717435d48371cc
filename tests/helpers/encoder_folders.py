"""Small Hugging Face encoder folders (BERT, RoBERTa, DistilBERT) with a tokenizer trained here, and
exports of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from edgeattn.exporters.export import export_model
from edgeattn.runtime import load
from edgeattn.sources import resolve_model

transformers = pytest.importorskip("transformers")

SIZES = {"vocab_size": 99, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64}


LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


# --------------------------------------------------------------------------- checkpoints
def make_checkpoint(family: str, head: str) -> transformers.PreTrainedModel:
    """A small random checkpoint of one family and head (``Model``, ``ForSequenceClassification``...)."""
    torch.manual_seed(0)
    labels = {"id2label": LABELS, "label2id": {v: k for k, v in LABELS.items()}} if head != "Model" else {}
    if family == "Bert":
        config = transformers.BertConfig(hidden_size=32, intermediate_size=37, **SIZES, **labels)
    elif family == "Roberta":
        config = transformers.RobertaConfig(hidden_size=32, intermediate_size=37, pad_token_id=1, type_vocab_size=1,
                                            **{**SIZES, "max_position_embeddings": 66}, **labels)  # fmt: skip
    else:
        config = transformers.DistilBertConfig(vocab_size=99, dim=32, hidden_dim=37, n_layers=2, n_heads=4,
                                               max_position_embeddings=64, **labels)  # fmt: skip
    model = getattr(transformers, f"{family}{head}")(config).eval()
    with torch.no_grad():  # trained-looking weights: nothing left at its zero / one initialisation
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


# ------------------------------------------------------------------------------------- text
CORPUS = [
    "Angela Merkel visited Paris in May.", "The weather in Berlin is cold today.",
    "Marie Curie worked in Paris and Warsaw.", "A quick brown fox jumps over the lazy dog.",
    "Edge devices run small transformer models.", "Ada Lovelace wrote notes in London.",
]  # fmt: skip


TEXTS = ["Angela Merkel visited Warsaw in May.", "Edge devices run.", "Ada Lovelace wrote notes about Paris today."]


def make_tokenizer(specials: list[str], cls: str, sep: str) -> transformers.PreTrainedTokenizerFast:
    """A WordPiece tokenizer trained here, as transformers saves it (tokenizer.json)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token=specials[3]))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(CORPUS * 3, trainers.WordPieceTrainer(vocab_size=99, special_tokens=specials))
    ids = {cls: tok.token_to_id(cls), sep: tok.token_to_id(sep)}
    tok.post_processor = processors.TemplateProcessing(single=f"{cls} $A {sep}", special_tokens=list(ids.items()))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=specials[3], pad_token=specials[1]
                                                if specials[1].startswith("<") else specials[0], cls_token=cls,
                                                sep_token=sep)  # fmt: skip


BERT_SPECIALS = (["[PAD]", "[CLS]", "[SEP]", "[UNK]"], "[CLS]", "[SEP]")


ROBERTA_SPECIALS = (["<s>", "<pad>", "</s>", "<unk>"], "<s>", "</s>")


def text_export(tmp_path: Path, family: str, head: str, folder_extra=None) -> tuple:
    specials = ROBERTA_SPECIALS if family == "Roberta" else BERT_SPECIALS
    tokenizer = make_tokenizer(*specials)
    if family != "Bert":  # as their own tokenizers declare: no token types
        tokenizer.model_input_names = ["input_ids", "attention_mask"]
    reference = make_checkpoint(family, head)
    with torch.no_grad():  # sharper logits, so that entity groups of several kinds appear
        for p in reference.parameters():
            p.mul_(8.0) if p.dim() == 2 and p.shape[0] == len(LABELS) else None
    reference.save_pretrained(tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")
    if folder_extra:
        folder_extra(tmp_path / "hf")
    source = resolve_model(from_hf=tmp_path / "hf")
    export_model(source.model, tmp_path / "out", graphs=["encoder"], tokenizer=source.tokenizer, task=source.task,
                 architecture=source.architecture, labels=source.labels, pooling=source.pooling)  # fmt: skip
    return reference, tokenizer, load(tmp_path / "out", providers=["CPUExecutionProvider"])


def sentence_folder(folder: Path, mode: str = "mean") -> None:
    """Make ``folder`` a sentence-transformers folder: Transformer, Pooling (``mode``), Normalize."""
    kinds, paths = ["Transformer", "Pooling", "Normalize"], ["", "1_Pooling", "2_Normalize"]
    modules = [{"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.models.{k}"}
               for i, (k, p) in enumerate(zip(kinds, paths, strict=True))]  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    key = "pooling_mode_cls_token" if mode == "cls" else f"pooling_mode_{mode}_tokens"
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({key: True}))
