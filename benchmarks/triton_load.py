"""Load through a real Triton server against the embedded runtime: requests per second and p50 /
p99 latency at concurrency 1, 8 and 32, dynamic batching on and off, for an encoder (a random
BERT classifier of 4 layers x 256, built with ``transformers``, its WordPiece tokenizer trained
here), a seq2seq export (the demo digit sorter) and a language model (a random Llama of 4 layers
x 256, its BPE tokenizer trained here; each request 32 new tokens). Prints the table, writes the
JSON.

    python benchmarks/triton_load.py [--seconds 5] [--concurrency 1,8,32] [--exports classifier,sorter,lm]
                                     [--out FILE]
"""

from __future__ import annotations

import argparse
import logging
import random
import tempfile
from pathlib import Path

from edgeattn.benchmark.report import publish
from edgeattn.exporters.export import export_model
from edgeattn.serving.traffic import bench_serving
from edgeattn.sources import resolve_model


def _words(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefghijklmnoprstuvwy") for _ in range(rng.randint(2, 9))) for _ in range(n)]


def encoder_export(work: Path) -> tuple[Path, list[str]]:
    """A random BERT sequence classifier with a trained tokenizer, exported; and request texts of
    8 to 60 words that fit its 128 positions."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    words = _words(3000)
    rng = random.Random(1)
    corpus = [" ".join(rng.choices(words, k=rng.randint(5, 40))) for _ in range(4000)]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=4000,
                            special_tokens=["[PAD]", "[CLS]", "[SEP]", "[UNK]"]))  # fmt: skip
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])  # fmt: skip
    folder = work / "bert-classifier"
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=256, num_hidden_layers=4,
                                     num_attention_heads=4, intermediate_size=1024, max_position_embeddings=128,
                                     id2label={0: "negative", 1: "positive"},
                                     label2id={"negative": 0, "positive": 1})  # fmt: skip
    transformers.BertForSequenceClassification(config).eval().save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                         sep_token="[SEP]").save_pretrained(folder)  # fmt: skip
    source = resolve_model(from_hf=folder)
    out = work / "classifier"
    export_model(source.model, out, graphs=["encoder"], tokenizer=source.tokenizer, task=source.task,
                 labels=source.labels, verify=False)  # fmt: skip
    drawn = (" ".join(rng.choices(words, k=rng.randint(8, 60))) for _ in range(1000))
    fits = [text for text in drawn if len(tok.encode(text).ids) <= config.max_position_embeddings]
    return out, fits[:64]  # each within the model's length: a request refused as too long is no load


def seq2seq_export(work: Path) -> tuple[Path, list[str]]:
    """The demo digit sorter, exported; request texts of 3 to 12 digits."""
    source = resolve_model()
    out = work / "sorter"
    export_model(source.model, out, tokenizer=source.tokenizer, task=source.task, verify=False)
    rng = random.Random(2)
    return out, [" ".join(str(rng.randint(0, 9)) for _ in range(rng.randint(3, 12))) for _ in range(64)]


#: new tokens each language-model request asks for (random weights rarely stop earlier)
LM_NEW_TOKENS = 32


def lm_export(work: Path) -> tuple[Path, list[str]]:
    """A random Llama (4 layers x 256, grouped-query attention) with a BPE tokenizer trained on
    random words, exported; request prompts of 8 to 40 words."""
    import json

    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    words = _words(3000, seed=3)
    rng = random.Random(4)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator((" ".join(rng.choices(words, k=30)) for _ in range(3000)),
                            trainers.BpeTrainer(vocab_size=4000, special_tokens=["<pad>", "<s>", "</s>"]))  # fmt: skip
    folder = work / "llama"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=256, intermediate_size=688,
                                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
                                      eos_token_id=2)  # fmt: skip
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                               "pad_token": "<pad>"}))  # fmt: skip
    source = resolve_model(from_hf=folder)
    out = work / "lm"
    export_model(source.model, out, **{**source.export_fields(), "heldout_texts": None}, verify=False)
    return out, [" ".join(rng.choices(words, k=rng.randint(8, 40))) for _ in range(64)]


EXPORTS = {"classifier": encoder_export, "sorter": seq2seq_export, "lm": lm_export}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per cell")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--max-queue-delay-us", type=int, default=2000)
    parser.add_argument("--exports", default=",".join(EXPORTS), help=f"which of {', '.join(EXPORTS)}")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/triton-load.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    wanted = args.exports.split(",")
    if unknown := [e for e in wanted if e not in EXPORTS]:
        parser.error(f"unknown export(s) {', '.join(unknown)}; choose from {', '.join(EXPORTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        made = {name: EXPORTS[name](work) for name in wanted}
        result = bench_serving({name: out for name, (out, _) in made.items()},
                               {name: texts for name, (_, texts) in made.items()},
                               tuple(int(c) for c in args.concurrency.split(",")), args.seconds,
                               args.max_batch_size, args.max_queue_delay_us,
                               settings={"lm": {"max_new_tokens": LM_NEW_TOKENS}})  # fmt: skip
    publish(result, args.out)


if __name__ == "__main__":
    main()
