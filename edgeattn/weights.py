"""Weights as safetensors with the config beside them; no pickle on any load path."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from edgeattn.config import ModelConfig
from edgeattn.errors import CheckpointError, ConfigError
from edgeattn.model import TransformerModel, build_model
from edgeattn.weight_file import (
    checkpoint_data_start,
    checkpoint_file,
    file_backed,
    has_meta_parameters,
    write_safetensors,
)

log = logging.getLogger(__name__)

CONFIG_KEY = "edgeattn_config"


def config_path_for(weights: Path) -> Path:
    """The config file written beside a weights file: ``NAME.safetensors`` -> ``config.json``."""
    return weights.with_name("config.json")


def checkpoint_tensors(model: TransformerModel, keep_vars: bool = False) -> dict[str, torch.Tensor]:
    """The tensors :func:`save_weights` stores, in its order: the state dict, each tied alias once
    (``keep_vars``: the parameters themselves), with each module's matrices before its vectors
    (``attn.q_proj.weight``, ``attn.k_proj.weight``, ... then ``attn.q_proj.bias``, ...): the
    projections a graph packs side by side lie side by side in the file, for it to point at."""
    aliases = model.tied_aliases()
    ordered: list[tuple[str, torch.Tensor]] = []
    run: list[tuple[str, torch.Tensor]] = []
    owner: str | None = None
    for name, tensor in model.state_dict(keep_vars=keep_vars).items():
        if name in aliases:
            continue
        parent = name.rsplit(".", 2)[0] if name.count(".") >= 2 else None
        if parent != owner or parent is None:
            ordered += [e for e in run if e[1].dim() >= 2] + [e for e in run if e[1].dim() < 2]
            run, owner = [], parent
        run.append((name, tensor))
    ordered += [e for e in run if e[1].dim() >= 2] + [e for e in run if e[1].dim() < 2]
    return dict(ordered)


def checkpoint_metadata(model: TransformerModel) -> dict[str, str]:
    return {CONFIG_KEY: model.config.to_json()}


def save_weights(model: TransformerModel, path: str | Path) -> Path:
    """Write the model's tensors to ``path`` (safetensors, config in its metadata) and
    ``config.json`` beside it. Tied aliases are stored once. A model imported into a file laid out
    as this checkpoint (:func:`load_state`) has that file linked to ``path``, not written again."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = checkpoint_tensors(model)
    metadata = checkpoint_metadata(model)
    held = checkpoint_file(model)
    if held is not None and held.save_as(tensors, metadata, path):
        map_onto(model, path)  # the file is the checkpoint now: the model's writes stay its own
        log.info("linked the imported weights' file (%d tensors) to %s", len(tensors), path)
    else:
        write_safetensors(tensors, path, metadata, checkpoint_data_start(tensors, metadata))
        log.info("wrote %d tensors to %s", len(tensors), path)
    model.config.save(config_path_for(path))
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


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}  # fmt: skip


def map_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file as a view of the file mapped copy-on-write, in its own
    dtype: nothing is read until a tensor is used, and what is read stays the page cache's, which
    the system may drop again (a folder of several GB costs no memory of its own to open). The
    file is checked by safetensors' own parser first; a tensor whose dtype torch cannot view, or
    whose offset is not aligned to its element, is copied out instead."""
    import json
    import mmap

    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:  # refuses a malformed header, overlaps, bad offsets
        names = list(f.keys())
    if not names:
        return {}
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        start = f.tell()  # the data's first byte, past the length and the header
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    tensors: dict[str, torch.Tensor] = {}
    for name in names:
        entry = header[name]
        begin, end = entry["data_offsets"]
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None or (start + begin) % dtype.itemsize:
            with safe_open(str(path), framework="pt") as f:
                tensors[name] = f.get_tensor(name)
            continue
        count = (end - begin) // dtype.itemsize
        flat = torch.frombuffer(mapped, dtype=dtype, count=count, offset=start + begin) if count else \
            torch.empty(0, dtype=dtype)  # fmt: skip
        tensors[name] = flat.reshape(entry["shape"])
    return tensors


def map_onto(model: TransformerModel, path: Path) -> int:
    """Rebind every tensor of ``model`` that the checkpoint at ``path`` (just written by
    :func:`save_weights`) holds, same dtype and shape, to its view in that file mapped copy-on-write
    (:func:`map_safetensors`): the model answers the same, and its weights stop costing memory of
    their own (the page cache's, which the system can drop and read again) while later phases load
    graphs and sessions beside it. Returns how many tensors were rebound. Writing into a rebound
    tensor makes a private copy of its pages; the file is never changed."""
    mapped = map_safetensors(path)
    aliases = model.tied_aliases()
    rebound = 0
    for name, tensor in model.state_dict(keep_vars=True).items():
        source = mapped.get(aliases.get(name, name))
        if source is None or source.dtype != tensor.dtype or source.shape != tensor.shape:
            continue
        if tensor.data_ptr() != source.data_ptr():
            tensor.data = source
            rebound += 1
    return rebound


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
    """Copy ``tensors`` into ``model``, asserting the key and shape mapping first; each tensor leaves
    ``tensors`` as it is copied (cast to its parameter's dtype).

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
    if has_meta_parameters(model):  # built by parameters_on_meta: storage in a file the system can page
        if isinstance(model, TransformerModel):  # laid out as the checkpoint an export saves it as
            file_backed(model, checkpoint_tensors(model, keep_vars=True), checkpoint_metadata(model))
        else:
            file_backed(model)
        expected = {k: v for k, v in model.state_dict().items() if k not in aliases}
    # each tensor copied into its parameter (cast on the way) and let go of, so that the source (mapped,
    # or read in its own dtype) and a converted copy of the whole model never sit in memory together
    from tqdm import tqdm

    with torch.no_grad():  # a bar where stderr is a terminal (disable=None): a large folder takes seconds
        for key, ref in tqdm(expected.items(), desc="loading weights", unit="tensor", disable=None, leave=False):
            ref.copy_(tensors.pop(key))


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
