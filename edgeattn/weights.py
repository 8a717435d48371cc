"""Weights as safetensors with the config beside them; no pickle on any load path."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from edgeattn.config import ModelConfig
from edgeattn.errors import CheckpointError, ConfigError
from edgeattn.model import TransformerModel, build_model

log = logging.getLogger(__name__)

CONFIG_KEY = "edgeattn_config"


def config_path_for(weights: Path) -> Path:
    """The config file written beside a weights file: ``NAME.safetensors`` -> ``config.json``."""
    return weights.with_name("config.json")


def save_weights(model: TransformerModel, path: str | Path) -> Path:
    """Write the model's tensors to ``path`` (safetensors, config in its metadata) and
    ``config.json`` beside it. Tied aliases are stored once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    aliases = model.tied_aliases()
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k not in aliases}
    save_file(tensors, str(path), metadata={CONFIG_KEY: model.config.to_json()})
    model.config.save(config_path_for(path))
    log.info("wrote %d tensors to %s", len(tensors), path)
    return path


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        return load_file(str(path)), metadata
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path} is not a readable safetensors file: {exc}") from exc


def read_config(path: str | Path) -> ModelConfig:
    """The config of a checkpoint: from its metadata, else from ``config.json`` beside it."""
    path = Path(path)
    _, metadata = _read(path)
    if CONFIG_KEY in metadata:
        try:
            return ModelConfig.from_json(metadata[CONFIG_KEY])
        except ConfigError as exc:
            raise CheckpointError(f"checkpoint {path} carries an invalid config: {exc}") from exc
    beside = config_path_for(path)
    if beside.is_file():
        return ModelConfig.load(beside)
    raise CheckpointError(f"checkpoint {path} has no config in its metadata and no {beside.name} beside it")


def load_state(
    model: nn.Module, tensors: dict[str, torch.Tensor], source: str, aliases: dict[str, str] | None = None
) -> None:
    """Copy ``tensors`` into ``model``, asserting the key and shape mapping first.

    Every parameter and buffer of the model must be present with its exact shape, and every
    tensor in the file must be used; errors name the offending tensors.
    """
    aliases = aliases or {}
    expected = {k: v for k, v in model.state_dict().items() if k not in aliases}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        raise CheckpointError(
            f"{source} is missing tensor(s): {', '.join(missing[:8])}" + (" ..." if len(missing) > 8 else "")
        )
    if unexpected:
        raise CheckpointError(
            f"{source} has unexpected tensor(s): {', '.join(unexpected[:8])}" + (" ..." if len(unexpected) > 8 else "")
        )
    for key, ref in expected.items():
        got = tensors[key]
        if tuple(got.shape) != tuple(ref.shape):
            raise CheckpointError(
                f"{source}: tensor {key} has shape {tuple(got.shape)}, the model expects {tuple(ref.shape)}"
            )
        if got.dtype != ref.dtype:
            tensors[key] = got.to(ref.dtype)
    full = dict(tensors)
    for alias, src in aliases.items():
        full[alias] = tensors[src]
    model.load_state_dict(full, strict=True)


def load_weights(model: TransformerModel, path: str | Path) -> None:
    """Load a safetensors checkpoint into an existing model (strict key and shape check)."""
    path = Path(path)
    tensors, _ = _read(path)
    load_state(model, tensors, f"checkpoint {path}", model.tied_aliases())


def load_model(path: str | Path, config: ModelConfig | None = None) -> TransformerModel:
    """Build the model from a checkpoint's config (or the one given) and load its weights."""
    config = config or read_config(path)
    model = build_model(config)
    load_weights(model, path)
    return model.eval()
