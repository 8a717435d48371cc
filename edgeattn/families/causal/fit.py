"""The decoder-only family's GPTQ walk: its layers fitted one after another on calibration text.

Each layer's products are fitted (:func:`edgeattn.exporters.gptq.gptq`) on the inputs the layers
already quantised hand it, so that a layer's fit also makes up for what the ones before it lost
(GPTQ's sequential order). A layer's weights are swapped for their quantised values while its output
is computed for the next, then swapped back: the model is the gate's float32 reference and leaves
as it came (its weights, mapped from the export's checkpoint, never written).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgeattn.exporters.fitted_weights import FittedWeight
from edgeattn.exporters.gptq import Hessians, fits, gptq, nearest
from edgeattn.families.causal.graph_builder import layer_products, product_weight
from edgeattn.families.causal.model import CausalLM

log = logging.getLogger(__name__)


def fit_causal(model: CausalLM, ids: np.ndarray, bits_of: dict[str, int], block: int, progress: bool = False,
               source: Path | None = None) -> dict[str, FittedWeight]:  # fmt: skip
    """GPTQ fits of ``model``'s products whose graph weight ``bits_of`` gives 4 bits (in blocks it
    fits: :func:`~edgeattn.exporters.gptq.fits`), layer after layer over ``ids`` (R, T) (no
    padding); the other products are rounded to the nearest level of their width for the layers
    after them, and those not in ``bits_of`` stay float; ``progress`` shows a bar of the layers.
    (``source``, the graph, is not read: the causal graph names its weights by layer and product.)"""
    from tqdm import tqdm

    fitted: dict[str, FittedWeight] = {}
    bar = tqdm(total=len(model.layers), desc="int4: GPTQ fit", unit="layer", leave=False, disable=not progress)
    with bar, torch.no_grad():
        x, per_layer = model.layer_inputs(torch.from_numpy(ids))
        for i, layer in enumerate(model.layers):
            products = layer_products(layer)
            hessians = {name: Hessians(mods[0].in_features) for name, mods in products.items()
                        if bits_of.get(product_weight(i, name)) == 4 and fits(block)}  # fmt: skip
            hooks = [products[name][0].register_forward_hook(lambda m, a, o, h=h: h.add(a[0]))
                     for name, h in hessians.items()]  # fmt: skip
            try:
                _by_rows(layer, x, per_layer[i])
            finally:
                for hook in hooks:
                    hook.remove()
            kept = {}
            for name, modules in products.items():
                weight_name = product_weight(i, name)
                bits = bits_of.get(weight_name)
                if bits is None:
                    continue
                weight = torch.cat([m.weight for m in modules], 0)
                if name in hessians:
                    fitted[weight_name] = gptq(weight, hessians[name].value, bits, block)
                    quantized = torch.from_numpy(fitted[weight_name].dequantized())
                else:
                    quantized = nearest(weight, bits, block)
                row = 0
                for m in modules:  # swapped in, not written over: a weight mapped from a file stays clean
                    kept[m] = m.weight.data
                    m.weight.data = quantized[row : row + m.out_features].to(m.weight.dtype)
                    row += m.out_features
            try:
                x = _by_rows(layer, x, per_layer[i])
            finally:
                for m, weight in kept.items():
                    m.weight.data = weight
            bar.update()
    return fitted


#: the most calibration tokens a layer runs at once (its activations, not the calibration set, bound
#: the fit's memory: a 1.5B model's feed-forward holds 9k floats a token in several tensors)
CHUNK_TOKENS = 2048


def _rows(value: Any, rows: slice, batch: int) -> Any:
    """``value`` (a layer's argument: a tensor, or tuples of them, or None) cut to ``rows`` of its
    batch where it has one."""
    if isinstance(value, torch.Tensor):
        return value[rows] if value.dim() and value.shape[0] == batch else value
    if isinstance(value, tuple):
        return tuple(_rows(v, rows, batch) for v in value)
    return value


def _by_rows(layer: torch.nn.Module, x: torch.Tensor, args: tuple[Any, ...]) -> torch.Tensor:
    """``layer(x, *args)[0]`` computed a few rows of ``x`` (B, T, d) at a time (at most
    :data:`CHUNK_TOKENS` tokens), the rows' outputs put back together."""
    b, t = x.shape[:2]
    step = max(1, CHUNK_TOKENS // max(t, 1))
    if step >= b:
        return layer(x, *args)[0]
    return torch.cat([layer(x[r : r + step], *_rows(args, slice(r, r + step), b))[0] for r in range(0, b, step)])
