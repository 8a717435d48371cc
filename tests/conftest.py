"""Shared fixtures: small configs and models built with fixed seeds, and exports made once per
test session for every module that reads the same one."""

from __future__ import annotations

import json
import os

import pytest
import torch

from edgeattn.config import ModelConfig
from tests.helpers.browser import browser, chromium, driver  # noqa: F401 - Chromium for the web page's tests
from tests.helpers.npm import node_modules  # noqa: F401 - onnxruntime-node and -web from npm, for every test

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n 2 on two cores: each worker (and every process it starts) computes on one thread, so
    # that the workers' torch and ONNX Runtime threads do not spin against each other
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "EDGEATTN_THREADS"):
        os.environ[name] = "1"
    torch.set_num_threads(1)

# folders saved by transformers 5 are checked on export by the transformers 5 environment .ci/run makes
# (the project's own environment has 4.x)
_TF5 = os.path.join(os.environ.get("EDGEATTN_TF5", os.path.expanduser("~/.cache/edgeattn-tf5")), "bin", "python")
if os.path.isfile(_TF5):
    os.environ.setdefault("EDGEATTN_TRANSFORMERS_PYTHON", _TF5)


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


@pytest.fixture
def built_in_providers(monkeypatch):
    """``built_in_providers(*names)``: onnxruntime taken to have exactly these providers built in
    (``onnxruntime-openvino``'s OpenVINO, say), whatever plugins this process has registered."""
    import onnxruntime as ort

    from edgeattn.runtime import providers

    def pretend(*names: str) -> None:
        monkeypatch.setattr(ort, "get_available_providers", lambda: list(names))
        monkeypatch.setattr(providers, "_registered", set())

    return pretend


@pytest.fixture(scope="session")
def shared_export(tmp_path_factory):
    """``shared_export(preset, seed=0, **export_options)``: the export of a preset's model with
    random weights (not verified), made the first time a test session asks for it and then handed
    to every test that asks for the same one. Read it; never change it."""
    from edgeattn.config import get_preset
    from edgeattn.exporters.export import export_model
    from edgeattn.model import build_model

    made = {}

    def make(preset: str, seed: int = 0, **options):
        key = json.dumps([preset, seed, options], sort_keys=True)
        if key not in made:
            out = tmp_path_factory.mktemp("shared") / "out"
            export_model(build_model(get_preset(preset), seed=seed), out, verify=False, **options)
            made[key] = out
        return made[key]

    return make
