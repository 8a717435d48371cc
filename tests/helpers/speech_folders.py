"""Small Whisper folders with random weights, and audio to hear."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
soundfile = pytest.importorskip("soundfile")
pytest.importorskip("soxr")


def whisper_folder(path, n_mels: int = 80, encoder_layers: int = 3, decoder_layers: int = 1, seed: int = 0,
                   vocab_size: int = 120, target_positions: int = 40):
    """A random WhisperForConditionalGeneration saved as transformers saves one (30 s windows
    shrunk to 2 s: 100 audio positions, 200 frames)."""
    torch.manual_seed(seed)
    config = transformers.WhisperConfig(
        vocab_size=vocab_size, num_mel_bins=n_mels, d_model=64, encoder_layers=encoder_layers,
        decoder_layers=decoder_layers, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
        decoder_ffn_dim=128, max_source_positions=100, max_target_positions=target_positions, pad_token_id=119,
        bos_token_id=117, eos_token_id=118,
        decoder_start_token_id=116,
    )  # fmt: skip
    model = transformers.WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # biases and norms away from their initial 0 and 1, so a misplaced one shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


def speech_folder(path: Path, seed: int = 3) -> Path:
    """A random multilingual Whisper with Whisper's special tokens, its generation and feature
    settings (2 s windows) and a word-level tokenizer ``w0 .. w50256`` (specials after)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    model = whisper_folder(path, vocab_size=51865, seed=seed, target_positions=64)
    model.generation_config = transformers.GenerationConfig(**GENERATION)
    model.generation_config.save_pretrained(path)
    transformers.WhisperFeatureExtractor(feature_size=80, chunk_length=WINDOW_SECONDS).save_pretrained(path)
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(50257)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([AddedToken(f"<|s{i}|>", special=True) for i in range(50257, 51865)])
    tokenizer.save(str(path / "tokenizer.json"))
    return path


def audio(seconds: float, seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(seconds * RATE))).astype(np.float32)


#: Whisper's special tokens where the multilingual vocabulary (51,865) has them
SOT, EOS, NO_TIMESTAMPS = 50258, 50257, 50363


GENERATION = {
    "decoder_start_token_id": SOT, "eos_token_id": EOS, "pad_token_id": EOS, "bos_token_id": EOS,
    "no_timestamps_token_id": NO_TIMESTAMPS, "is_multilingual": True, "max_initial_timestamp_index": 50,
    "suppress_tokens": [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92, 93, 359,
                        503, 522, 542, 873, 893, 902, 918, 922, 931, 1350, 1853, 1982, 2460, 2627, 50359, 50360,
                        50361, 50362],
    "begin_suppress_tokens": [220, EOS],
    "lang_to_id": {"<|en|>": 50259, "<|de|>": 50261, "<|fr|>": 50265, "<|ja|>": 50266},
    "task_to_id": {"transcribe": 50359, "translate": 50358}, "max_length": 448,
    "alignment_heads": [[0, 1], [0, 3]], "prev_sot_token_id": 50361,
}  # fmt: skip


RATE = 16_000


#: the test folder's window: 2 s (100 audio positions, 200 frames)
WINDOW_SECONDS = 2
