"""Where a model comes from: a preset (the demo preset with its trained weights), a config file,
a safetensors checkpoint, or a local Hugging Face folder."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeattn.config import ModelConfig, get_preset
from edgeattn.errors import ConfigError
from edgeattn.model import TransformerModel, build_model
from edgeattn.runtime.families.causal.chat import ChatTemplate
from edgeattn.runtime.manifest import EmbeddingPooling
from edgeattn.runtime.tokenizer import TextTokenizer, WordTokenizer
from edgeattn.weights import load_model, read_config

log = logging.getLogger(__name__)


@dataclass
class ModelSource:
    """A model ready to export, a line saying where it came from, and its tokenizer if any."""

    model: TransformerModel
    description: str
    tokenizer: WordTokenizer | TextTokenizer | None = None
    #: the task the model was trained for, if any (recorded in the manifest)
    task: str | None = None
    #: what an imported checkpoint was, its label names and its embedding pooling
    architecture: str | None = None
    labels: list[str] | None = None
    pooling: EmbeddingPooling | None = None
    #: the Hugging Face folder an imported checkpoint came from
    folder: Path | None = None
    #: a language model's chat template and the tokens that end its answers
    chat_template: ChatTemplate | None = None
    stop_ids: list[int] | None = None
    #: what the family's runtime reads besides the graphs (a speech model's features and decoding)
    settings: dict[str, Any] | None = None

    def export_fields(self) -> dict[str, Any]:
        """What ``export_model`` records of this source besides the model: its description,
        tokenizer, task and held-out inputs, and for an imported checkpoint its architecture,
        labels, pooling and folder."""
        return {"source": self.description, "tokenizer": self.tokenizer, "heldout_texts": self.heldout,
                "task": self.task, "architecture": self.architecture, "labels": self.labels,
                "pooling": self.pooling, "source_folder": self.folder, "chat_template": self.chat_template,
                "stop_ids": self.stop_ids, "settings": self.settings}  # fmt: skip

    @property
    def heldout(self) -> list[list[int]] | None:
        """Held-out task inputs (token id lists) for the accuracy gate, when the model has a task."""
        return heldout_for_task(self.task)


DEMO_TASK = "demo-sort"


def heldout_for_task(task: str | None) -> list[list[int]] | None:
    """The held-out inputs of a known task (the demo's digit sorting), else None."""
    if task == DEMO_TASK:
        from edgeattn.demo import heldout_ids

        return heldout_ids()
    return None


def resolve_model(
    preset: str | None = None,
    config_file: str | Path | None = None,
    checkpoint: str | Path | None = None,
    seed: int = 0,
    from_hf: str | Path | None = None,
    task: str | None = None,
) -> ModelSource:
    """The model the user asked for. With nothing given: the demo preset with its shipped weights.

    A checkpoint carries its config unless ``config_file`` overrides it; a preset or config
    without a checkpoint gets random weights from ``seed`` (the demo preset gets its trained ones).
    ``from_hf`` imports a local Hugging Face folder (``task`` overrides the one its config implies).
    """
    if from_hf is not None:
        if preset or config_file or checkpoint:
            raise ConfigError("a Hugging Face folder carries its own config and weights; give it alone")
        from edgeattn.hf import import_folder

        hf = import_folder(from_hf, task)
        return ModelSource(hf.model, f"Hugging Face {hf.architecture} from {Path(from_hf).name}", hf.tokenizer,
                           hf.task, hf.architecture, hf.labels, hf.pooling, hf.folder, hf.chat_template,
                           hf.stop_ids, hf.settings)  # fmt: skip
    if task is not None:
        raise ConfigError("a task is for Hugging Face folders (--from-hf)")
    if preset and config_file:
        raise ConfigError("give a preset or a config file, not both")
    if checkpoint is not None:
        if preset:
            raise ConfigError("a checkpoint carries its own config; use a config file to override it, not a preset")
        config = ModelConfig.load(config_file) if config_file else read_config(checkpoint)
        return ModelSource(load_model(checkpoint, config), f"checkpoint {Path(checkpoint).name}")
    if config_file:
        return ModelSource(build_model(ModelConfig.load(config_file), seed=seed), f"random weights (seed {seed})")
    name = preset or "demo"
    config = get_preset(name)
    if name == "demo":
        from edgeattn.demo import demo_tokenizer, shipped_checkpoint

        path = shipped_checkpoint()
        if path.is_file():
            return ModelSource(
                load_model(path, config), "demo preset: trained digit sorter", demo_tokenizer(), DEMO_TASK
            )
        log.warning("the trained demo checkpoint %s is missing; using random weights", path)
    return ModelSource(build_model(config, seed=seed), f"preset {name}, random weights (seed {seed})")
