"""Fine-tuned models from local Hugging Face folders, as ``save_pretrained`` writes them.

Dispatched on ``architectures[0]`` through one table, :data:`IMPORTERS` (architecture -> the
family it becomes, its weight layout, the task its head implies, and its loader, which maps the
config and every tensor), gathered from the family records: each family's ``importers`` names
the function that lists its architectures (``edgeattn.families.<family>.hf:importers``).
Weights come from ``model.safetensors`` (single or sharded) or ``pytorch_model.bin``, read with
``torch.load(weights_only=True)`` only. Nothing is downloaded. ``transformers`` is not needed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from edgeattn.errors import CheckpointError, ConfigError
from edgeattn.hf_reference import ReferenceOutputs
from edgeattn.model import TransformerModel
from edgeattn.runtime.families import FAMILIES, all_tasks, resolve
from edgeattn.runtime.families.causal.chat import ChatTemplate
from edgeattn.runtime.jsonfile import read_json_object
from edgeattn.runtime.manifest import EmbeddingPooling
from edgeattn.runtime.tokenizer import TextTokenizer

log = logging.getLogger(__name__)

#: what an encoder-decoder is for: text in, text out
GENERATE = "generate"
TASKS = all_tasks()


@dataclass(frozen=True)
class Importer:
    """How one Hugging Face architecture (``architectures[0]`` of its ``config.json``) is imported."""

    architecture: str
    #: the edgeattn model family it becomes (``edgeattn.runtime.families``)
    family: str
    #: the layout of its weights (which ``model_type`` values it accepts)
    layout: str
    #: the task its head implies
    task: str
    #: ``load(folder, hf_config, importer, task) -> HFModel``: config mapped, every tensor mapped
    load: Callable[[Path, dict[str, Any], Importer, str], HFModel]
    #: the outputs edgeattn's model and transformers' give for the same ids (``edgeattn.hf_reference``)
    reference: ReferenceOutputs
    #: the ``model_type`` values of config.json it accepts
    model_types: tuple[str, ...]


def _importers() -> dict[str, Importer]:
    """Every architecture the families import, from their records."""
    return {i.architecture: i for family in FAMILIES.values() if family.importers is not None
            for i in resolve(family.importers)()}  # fmt: skip


@dataclass
class HFModel:
    """An imported checkpoint: the model, what it was, and what its outputs mean."""

    model: TransformerModel
    architecture: str
    task: str
    labels: list[str] | None
    pooling: EmbeddingPooling | None
    folder: Path
    #: the folder's tokenizer.json, when it has one
    tokenizer: TextTokenizer | None = None
    #: a language model's chat template and the tokens that end its answers
    chat_template: ChatTemplate | None = None
    stop_ids: list[int] | None = None
    #: what the family's runtime reads besides the graphs (a speech model's features and decoding)
    settings: dict[str, Any] | None = None


def read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path, ConfigError)


def renamed(tensors: dict[str, torch.Tensor], name_of: Callable[[str], str | None], source: str, layout: str
            ) -> dict[str, torch.Tensor]:  # fmt: skip
    """A folder's tensors under the names ``name_of`` gives them; a CheckpointError names the tensors
    it has no place for (``None``) and any two it puts in one place."""
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for key, value in tensors.items():
        name = name_of(key)
        if name is None:
            unknown.append(key)
            continue
        if name in out:
            raise CheckpointError(f"{source}: tensors map twice onto {name} ({key})")
        out[name] = value
    if unknown:
        raise CheckpointError(f"{source} has tensor(s) edgeattn's {layout} layout does not use: "
                              f"{', '.join(unknown[:8])}")  # fmt: skip
    return out


def label_names(hf: dict[str, Any], path: Path) -> list[str] | None:
    """A config.json's ``id2label`` as the list of label names in id order, or None without one."""
    id2label = hf.get("id2label")
    if not id2label:
        return None
    try:
        return [str(id2label[str(i)] if str(i) in id2label else id2label[i]) for i in range(len(id2label))]
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: id2label must map 0..{len(id2label) - 1} to names") from exc


def _importer(hf: dict[str, Any], path: Path) -> Importer:
    """The importer of a config.json's architecture, or a ConfigError listing what edgeattn knows."""
    known = ", ".join(KNOWN_ARCHITECTURES)
    names = hf.get("architectures") or []
    model_type = hf.get("model_type")
    if not isinstance(names, list) or len(names) != 1 or not isinstance(names[0], str):
        raise ConfigError(f"{path} names no single architecture ({names!r}); edgeattn imports {known}")
    importer = IMPORTERS.get(names[0])
    if importer is None or model_type not in importer.model_types:
        raise ConfigError(f"architecture {names[0]} (model_type {model_type!r}) is not one edgeattn imports: {known}")
    return importer


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's weights: safetensors (single or sharded, mapped: read as used)
    first, else a pickle checkpoint read with ``torch.load(weights_only=True)`` (no code runs)."""
    from safetensors import SafetensorError

    from edgeattn.weights import map_safetensors

    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    shards: list[Path] = []
    if single.is_file():
        shards = [single]
    elif index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index} has no weight_map")
        shards = [folder / name for name in sorted(set(weight_map.values()))]
    if shards:
        tensors: dict[str, torch.Tensor] = {}
        for shard in shards:
            try:
                tensors.update(map_safetensors(shard))
            except (SafetensorError, OSError) as exc:
                raise CheckpointError(f"{shard} is not a readable safetensors file: {exc}") from exc
        return tensors
    pickle = folder / "pytorch_model.bin"
    if pickle.is_file():
        try:
            data = torch.load(str(pickle), map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises its own unpickling errors
            raise CheckpointError(f"{pickle} cannot be read with weights_only=True: {exc}") from exc
        if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
            raise CheckpointError(f"{pickle} does not hold a state dict of tensors")
        return dict(data)
    raise CheckpointError(f"{folder} holds no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def tokenizer_of(folder: Path) -> TextTokenizer | None:
    tokenizer = TextTokenizer.load(folder / "tokenizer.json") if (folder / "tokenizer.json").is_file() else None
    if tokenizer is None:
        log.warning("%s has no tokenizer.json: the export will take token ids, not text", folder)
    return tokenizer


def import_folder(folder: str | Path, task: str | None = None) -> HFModel:
    """The model in a local Hugging Face folder, its weights loaded and checked; ``task``
    (encode, embed, classify, tag for encoders; generate for T5s) overrides what ``config.json``
    implies. Dispatched on ``architectures[0]`` through :data:`IMPORTERS`."""
    folder = Path(folder)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{folder} has no config.json; is it a Hugging Face model folder?")
    hf = read_json(config_file)
    importer = _importer(hf, config_file)
    if task is not None and task not in TASKS:
        raise ConfigError(f"task {task!r} is not one of {', '.join(TASKS)}")
    return importer.load(folder, hf, importer, task or "")


#: Every architecture edgeattn imports -> its importer (each family's record names where its own are listed).
IMPORTERS: dict[str, Importer] = _importers()
KNOWN_ARCHITECTURES = tuple(IMPORTERS)
