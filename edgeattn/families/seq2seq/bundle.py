"""The seq2seq family's web and Node.js bundle: what bundle.json says of it for the ES module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeattn.exporters.web import closing_specials
from edgeattn.runtime.cross_decoding import cross_contract
from edgeattn.runtime.families.encoder.runtime import ENCODER
from edgeattn.runtime.manifest import Manifest


def describe_seq2seq(manifest: Manifest, folder: Path) -> dict[str, Any]:
    """An encoder-decoder's bundle: its sizes and special ids, stop ids and cache feed names."""
    config = manifest.config
    layers = config.n_decoder_layers
    return {"task": "generate",
            "model": {"max_len": config.max_len, "pad_id": config.pad_id, "bos_id": config.bos_id,
                      "eos_id": config.eos_id, "vocab_size": config.vocab_size, "n_heads": config.n_heads,
                      "head_dim": config.head_dim, "n_decoder_layers": layers, "head": None},
            "stop_ids": [config.eos_id],
            "contract": cross_contract(ENCODER, {"ids": "input_ids", "mask": "attention_mask"}, layers),
            "closing_special_tokens": closing_specials(folder / "tokenizer.json")}  # fmt: skip
