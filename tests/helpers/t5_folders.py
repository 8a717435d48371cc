"""Small Hugging Face T5 folders (v1.0 and v1.1 layouts) with a tokenizer trained here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from edgeattn.exporters.export import export_model
from edgeattn.runtime import read_manifest
from edgeattn.sources import resolve_model

transformers = pytest.importorskip("transformers")

T5_CORPUS = [
    "summarize: the cat sat on the mat and the dog sat on the log",
    "translate English to German: the house is wonderful",
    "summarize: studies have shown that owning a dog is good for you",
    "the quick brown fox jumps over the lazy dog near the river bank",
    "rewrite: a small model runs at the edge without a server",
]


def t5_folder(path: Path, layout: str, **sizes: int) -> Path:
    """``save_pretrained`` of a checkpoint and the tokenizer into ``path``."""
    t5_checkpoint(layout, **sizes).save_pretrained(path)
    t5_tokenizer().save_pretrained(path)
    return path


def t5_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A unigram (SentencePiece-style) tokenizer trained here: <pad> 0, </s> 1, <unk> 2, </s> appended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=90, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    tok.train_from_iterator(T5_CORPUS * 4, trainer)
    # the trainer sums scores and orders pieces of equal score as a hash map iterates, which differs
    # from one process to the next: the same pieces got other ids (and scores in their last digits)
    # in every test worker, so the models' logits, and how far onnxruntime-web's came from ONNX
    # Runtime's, changed from run to run. Scores rounded and the pieces in a fixed order instead
    vocab = [(p, round(s, 9)) for p, s in json.loads(tok.to_str())["model"]["vocab"]]
    specials, pieces = vocab[:3], sorted(vocab[3:], key=lambda piece: (-piece[1], piece[0]))
    assert [p for p, _ in specials] == ["<pad>", "</s>", "<unk>"]
    tok.model = models.Unigram(specials + pieces, unk_id=2, byte_fallback=False)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])  # fmt: skip
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                                unk_token="<unk>")  # fmt: skip
    fast.model_input_names = ["input_ids", "attention_mask"]  # as T5's own tokenizer declares
    return fast


def t5_checkpoint(layout: str, layers: int = 2, decoder_layers: int | None = None, seed: int = 0, std: float = 0.4):
    """A small random T5 of one layout, its weights moved off their initialisation so that greedy
    and beam search produce varied tokens and end at EOS (``std``: of the weights; the larger, the
    more a small change of the logits changes the tokens)."""
    torch.manual_seed(seed)
    config = transformers.T5Config(
        vocab_size=96, d_model=32, d_kv=8, num_heads=3, d_ff=48, num_layers=layers, num_decoder_layers=decoder_layers,
        relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
        feed_forward_proj="relu" if layout == "t5" else "gated-gelu", tie_word_embeddings=layout == "t5",
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" not in name:
                p.normal_(0.0, std if "relative" not in name else 1.0)
        model.shared.weight[1] += 1.5 if layout == "t5" else 0.8  # EOS within reach
        if layout != "t5":
            model.lm_head.weight[1] += 0.6
    return model


def t5_batch() -> tuple[np.ndarray, np.ndarray]:
    """Three rows of lengths 11, 7 and 3 (the export traced 8), right-padded."""
    rng = np.random.default_rng(3)
    ids = np.zeros((3, 11), np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate((11, 7, 3)):
        ids[row, :n] = rng.integers(3, 90, n)
        ids[row, n - 1] = 1
        mask[row, :n] = 1
    return ids, mask


# ----------------------------------------------------------------------------- precisions
def export_variant(tmp_path: Path, model, precisions: list[str], **options):
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    t5_tokenizer().save_pretrained(folder)
    source = resolve_model(from_hf=folder)
    result = export_model(source.model, tmp_path / "out", precisions=precisions, **options, **source.export_fields())
    return source.model, result, read_manifest(tmp_path / "out")


def overflowing_t5():
    """A T5 v1.1 whose first encoder feed-forward writes values past float16's 65504 (as T5's do)."""
    model = t5_checkpoint("v1.1", std=0.1)
    with torch.no_grad():
        model.encoder.block[0].layer[1].DenseReluDense.wo.weight *= 3e5
    return model
