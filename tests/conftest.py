"""Shared fixtures: small configs and models built with fixed seeds."""

from __future__ import annotations

import pytest
import torch

from edgeattn.config import ModelConfig


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def tiny_config() -> ModelConfig:
    return ModelConfig(
        vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, max_len=256, dropout=0.0
    )


def pytest_collection_modifyitems(config, items):
    """Skip `cuda` tests cleanly where onnxruntime has no CUDA provider (or no GPU answers)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        return
    skip = pytest.mark.skip(reason="onnxruntime's CUDA provider is not available here")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
