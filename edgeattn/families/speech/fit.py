"""GPTQ for Whisper's int4: its products fitted on held-out speech.

Each 4-bit product of the graph being quantised is fitted by :func:`edgeattn.exporters.gptq.gptq`
on the second moments of its inputs in eager float32 Whisper over the held-out windows: the audio
encoder's on the windows' features, the cross projections' on the encoder states, the decoder's
teacher-forced over float32's own greedy tokens (the gate's reference computes all three once).
Unlike the language models' walk (:mod:`edgeattn.families.causal.fit`), every product is fitted
on float32 inputs, not on what the quantised layers before it give. A graph's weights are
matched to the model's ``nn.Linear`` products by value (a ``MatMul`` weight is its product's weight
transposed), so no graph naming is assumed.
"""

from __future__ import annotations

import hashlib
import logging
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from edgeattn.exporters.fitted_weights import FittedWeight
from edgeattn.exporters.gptq import Hessians, fits, gptq
from edgeattn.families.speech.model import WhisperModel

log = logging.getLogger(__name__)

#: windows run through the model at once while the inputs' moments are gathered
FIT_WINDOWS = 2

#: the fits made for a model on one source of data, by (product, its rows, block): the ``decoder``
#: and ``decoder_fixed`` graphs hold the same products, whose second moments and fits are made once
_FITTED: weakref.WeakKeyDictionary[nn.Module, tuple[Any, dict[tuple[int, bytes, int], FittedWeight]]] = (
    weakref.WeakKeyDictionary()
)


def fit_source(reference: Any) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], str] | None:
    """The held-out windows' features, prompts and float32's greedy tokens the gate measures, or
    None for the gate's random features (nothing real to fit on: round to nearest)."""
    if reference.heldout.random or reference.heldout.features is None:
        return None
    data = (reference.features, np.array(reference.prompts, np.int64), reference.greedy)
    return data, f"{reference.heldout.source}, which the gate measures too"


def _row_key(row: np.ndarray) -> bytes:
    return hashlib.sha256(np.ascontiguousarray(row, dtype=np.float32).tobytes()).digest()


def _products(model: WhisperModel, source: Path, names: list[str]) -> dict[str, tuple[nn.Linear, np.ndarray]]:
    """{graph weight name: (the model's product, the rows of its weight)} for each of ``names``
    whose weight is a product's weight transposed, whole or some of its rows (the alignment heads'
    queries are rows of a cross-attention's query projection)."""
    rows: dict[bytes, tuple[nn.Linear, int]] = {}
    for module in model.modules():
        if isinstance(module, nn.Linear):
            for i, row in enumerate(module.weight.detach().numpy()):
                rows.setdefault(_row_key(row), (module, i))
    graph = onnx.load(str(source), load_external_data=False)
    inits = {t.name: t for t in graph.graph.initializer}
    found: dict[str, tuple[nn.Linear, np.ndarray]] = {}
    for name in names:
        tensor = inits.get(name)
        if tensor is None or tensor.data_type != onnx.TensorProto.FLOAT or len(tensor.dims) != 2:
            continue
        hits = [rows.get(_row_key(column)) for column in numpy_helper.to_array(tensor, str(source.parent)).T]
        if None in hits or len({id(module) for module, _ in hits}) != 1:  # type: ignore[misc]
            log.debug("%s is not a product of the model: rounded to nearest", name)
            continue
        found[name] = (hits[0][0], np.array([row for _, row in hits]))  # type: ignore[index,misc]
    return found


def fit_whisper(model: WhisperModel, data: tuple[np.ndarray, np.ndarray, np.ndarray], bits_of: dict[str, int],
                block: int, progress: bool = False, source: Path | None = None) -> dict[str, FittedWeight]:  # fmt: skip
    """GPTQ fits of the graph at ``source``'s products that ``bits_of`` gives 4 bits (in blocks it
    fits), on ``data``: held-out windows' features (W, n_mels, frames), their prompts (W, p) and
    float32's greedy tokens after them (W, n). A product already fitted for the model on the same
    data (another graph holding it) is not fitted again."""
    wanted = [name for name, bits in bits_of.items() if bits == 4]
    if source is None or not wanted or not fits(block):
        return {}
    products = _products(model, source, wanted)
    if not products:
        return {}
    held = _FITTED.get(model)
    if held is None or held[0] is not data:
        held = _FITTED[model] = (data, {})
    done = held[1]

    def key(module: nn.Linear, rows: np.ndarray) -> tuple[int, bytes, int]:
        return id(module), rows.tobytes(), block

    todo = {name: (m, rows) for name, (m, rows) in products.items() if key(m, rows) not in done}
    if todo:
        done.update(_fit(model, data, todo, block, progress, key))
    return {name: done[key(m, rows)] for name, (m, rows) in products.items()}


def _fit(model: WhisperModel, data: tuple[np.ndarray, np.ndarray, np.ndarray],
         products: dict[str, tuple[nn.Linear, np.ndarray]], block: int, progress: bool,
         key: Any) -> dict[tuple[int, bytes, int], FittedWeight]:  # fmt: skip
    """The products' GPTQ fits on their inputs' second moments over ``data``, by ``key``."""
    from tqdm import tqdm

    features, prompts, greedy = data
    targets = np.concatenate([prompts, greedy[:, :-1]], axis=1)
    hessians = {m: Hessians(m.in_features) for m, _ in products.values()}
    hooks = [m.register_forward_hook(lambda _m, args, _out, h=h: h.add(args[0])) for m, h in hessians.items()]
    try:
        with torch.no_grad():
            for start in range(0, len(features), FIT_WINDOWS):
                window = slice(start, start + FIT_WINDOWS)
                hidden = model.encode(torch.from_numpy(features[window]))
                cross = model.cross_kv(hidden)
                model.decode(torch.from_numpy(targets[window]), cross_kv=cross)
    finally:
        for hook in hooks:
            hook.remove()
    fitted = {}
    bar = tqdm(products.values(), desc="int4: GPTQ fit", unit="product", leave=False, disable=not progress)
    for module, rows in bar:
        fitted[key(module, rows)] = gptq(module.weight.detach()[torch.from_numpy(rows)], hessians[module].value, 4,
                                         block)  # fmt: skip
    return fitted
