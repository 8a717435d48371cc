"""Seq2seq generation on a T5 of t5-small's shape (random weights, built with ``transformers``) or a
local T5 folder: ``transformers`` eager with its cache, Optimum's ORTModelForSeq2SeqLM fp32 and int8,
edgeattn fp32 and int8, each in its own process, interleaved. Prints the table, writes the JSON.

    python benchmarks/t5_generation.py [--folder DIR] [--batch 1,8] [--passes 3] [--runs 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from edgeattn.benchmark.report import publish
from edgeattn.families.seq2seq.peers import VARIANTS, bench_seq2seq

#: t5-small's sizes (60M parameters, 242 MB of float32 weights)
T5_SMALL = {"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_heads": 8,
            "feed_forward_proj": "relu", "tie_word_embeddings": True}  # fmt: skip


def t5_small_folder(path: Path, seed: int = 0) -> Path:
    """A random t5-small-shaped T5 saved as ``save_pretrained`` writes it."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(**T5_SMALL, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, dropout_rate=0.0)
    T5ForConditionalGeneration(config).eval().save_pretrained(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, help="a local T5 folder (default: a random t5-small-shaped one)")
    parser.add_argument("--work", type=Path, help="where the exports go (default: a temporary directory)")
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--src-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3, help="timed generations per process (after one untimed)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/t5-small-generation.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        folder = args.folder or t5_small_folder(work / "t5-small-random")
        result = bench_seq2seq(folder, work, tuple(int(b) for b in args.batch.split(",")), args.src_len,
                               args.new_tokens, args.threads, args.passes, args.runs,
                               variants=tuple(args.variants.split(",")))  # fmt: skip
    publish(result, args.out)


if __name__ == "__main__":
    main()
