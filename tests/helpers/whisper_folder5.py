"""Run by transformers 5's python: a random Whisper folder saved by transformers 5, and its own
encoder states and logits on fixed inputs (``reference.npz``) beside it.

Usage: ``python whisper_folder5.py OUT``
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import transformers


def main(out: Path) -> None:
    torch.manual_seed(0)
    config = transformers.WhisperConfig(
        vocab_size=120, num_mel_bins=128, d_model=64, encoder_layers=2, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_source_positions=100, max_target_positions=40, pad_token_id=119, bos_token_id=117, eos_token_id=118,
        decoder_start_token_id=116,
    )  # fmt: skip
    model = transformers.WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(out)
    features = torch.randn(2, 128, 200, generator=torch.Generator().manual_seed(1))
    ids = torch.randint(0, 116, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        states = model.model.encoder(features).last_hidden_state
        logits = model(input_features=features, decoder_input_ids=ids).logits
    np.savez(out / "reference.npz", features=features.numpy(), ids=ids.numpy(), states=states.numpy(),
             logits=logits.numpy())  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
