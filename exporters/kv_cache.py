"""A language model's key/value cache kept in int8: ONNX Runtime's ``GroupQueryAttention`` (1.32)
stores its past keys and values as int8 with a float scale per head and channel, and reads them
back so, which halves what a decoding step reads at long context.

The scales are each channel's largest magnitude on real text run through the float graph (a
key's channel and the one RoPE rotates it with share theirs: at positions the text did not reach,
the rotation moves a key's size between the two); on token ids drawn from the vocabulary, with
room to spare (:data:`DRAWN_MARGIN`). The gate then measures the graph as it decodes.
Measured on the real SmolLM2-135M-Instruct's int4 (2 Xeon cores, 2026-12-03): perplexity +4.34%
against the float cache's +4.72%, decoding 110 / 81 / 66 tokens/s at prompts 128 / 512 / 2048
against 106 / 72 / 40.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeattn.config import ModelConfig
from edgeattn.runtime.specs import SLOT_CACHE, SLOT_UPDATED, is_in_place_cache

log = logging.getLogger(__name__)

#: the first ONNX Runtime whose GroupQueryAttention keeps its cache in int8 on the CPU
MIN_ONNXRUNTIME = (1, 32)
#: tokens of text the scales are measured on: rows of so many tokens taken evenly over the
#: calibration text, so many rows a run
SCALE_TOKENS, SCALE_ROW_TOKENS, SCALE_ROWS = 2048, 512, 2
#: room above the largest magnitude seen when the text is token ids drawn from the vocabulary,
#: whose activations are not the model's real ones
DRAWN_MARGIN = 2.0
#: GroupQueryAttention's inputs that take the key and value scales
K_SCALE_INPUT, V_SCALE_INPUT = 12, 13


@dataclass(frozen=True)
class CacheScales:
    """Per layer, head and channel: the largest key and value magnitudes an int8 level spans."""

    #: (layers, kv heads, head dim) each
    keys: np.ndarray
    values: np.ndarray
    #: what they were measured on, in words
    source: str
    #: the factor applied over the largest magnitudes seen
    margin: float = 1.0


def why_not_supported() -> str | None:
    """Why this ONNX Runtime cannot keep the cache in int8, or None when it can."""
    import onnxruntime as ort

    version = tuple(int(p) for p in ort.__version__.split(".")[:2] if p.isdigit())
    if version < MIN_ONNXRUNTIME:
        need = ".".join(map(str, MIN_ONNXRUNTIME))
        return f"onnxruntime {ort.__version__} has no int8 key/value cache (it needs {need})"
    return None


def rope_partners(config: ModelConfig) -> np.ndarray | None:
    """For each key channel, the channel the rotary positions rotate it with (itself past the
    rotated ones); None where the model has no rotary positions."""
    c = config.section
    if c is None or c.position != "rope":
        return None
    channels = np.arange(c.dim)
    rotary = int(c.dim * c.rotary_fraction)
    if c.rope_layout == "interleaved":
        channels[:rotary] ^= 1
    else:
        channels[:rotary] = (channels[:rotary] + rotary // 2) % rotary
    return channels


def measure_scales(src: Path, feeds: Iterable[dict[str, np.ndarray]], config: ModelConfig, source: str,
                   margin: float = 1.0) -> CacheScales:  # fmt: skip
    """The largest key and value magnitudes the float graph ``src`` writes into its cache over
    ``feeds`` (whole prompts into an empty cache as wide as they are: slot t holds token t),
    padding left out."""
    import onnxruntime as ort

    c = config.section
    assert c is not None, "a decoder-only config has its causal section"
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.disable_prepacking", "1")  # float32 weights stay mapped
    # a Transpose of a checkpoint tensor is fused into its product, not folded into a copy of the weight
    session = ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=["ConstantFolding"])  # fmt: skip
    names = [f"{SLOT_UPDATED}_{kind}_{i}" for i in range(c.n_layers) for kind in ("key", "value")]
    top = np.zeros((2, c.n_layers, c.n_kv_heads, c.dim), np.float32)
    for feed in feeds:
        outputs = dict(zip(names, session.run(names, feed), strict=True))
        valid = feed["attention_mask"].astype(bool)  # (B, T)
        width = valid.shape[1]
        for i in range(c.n_layers):
            for k, kind in enumerate(("key", "value")):
                cache = outputs[f"{SLOT_UPDATED}_{kind}_{i}"][:, :, :width]  # (B, KV, T, D)
                seen = np.abs(cache.transpose(0, 2, 1, 3)[valid])  # (N, KV, D)
                if len(seen):
                    top[k, i] = np.maximum(top[k, i], seen.max(0))
    del session
    partners = rope_partners(config)
    keys = top[0] if partners is None else np.maximum(top[0], top[0][..., partners])
    return CacheScales(keys, top[1], source, margin)


def quantize_cache(path: Path, scales: CacheScales) -> dict[str, Any] | None:
    """Rewrite the graph in ``path`` (its weights left where they are) so that its
    GroupQueryAttention nodes keep their in-place caches in int8, per-channel scales from
    ``scales``; its ``cache_*`` inputs and ``updated_*`` outputs become int8. The manifest's
    record of it, or None where the graph has no GroupQueryAttention over its cache."""
    model = onnx.load(str(path), load_external_data=False)
    nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft"]
    cached = [n for n in nodes if len(n.input) > 4 and n.input[3].startswith(SLOT_CACHE + "_")]
    if not cached or len(cached) != scales.keys.shape[0]:
        return None
    kv, dim = scales.keys.shape[1:]
    for node in cached:
        layer = int(node.output[1].rsplit("_", 1)[1])
        for name, top in ((f"k_scale_{layer}", scales.keys[layer]), (f"v_scale_{layer}", scales.values[layer])):
            level = (np.maximum(top * scales.margin, 1e-6) / 127.0).astype(np.float32).reshape(1, kv, 1, dim)
            model.graph.initializer.append(numpy_helper.from_array(level, name))
        while len(node.input) <= V_SCALE_INPUT:
            node.input.append("")
        node.input[K_SCALE_INPUT], node.input[V_SCALE_INPUT] = f"k_scale_{layer}", f"v_scale_{layer}"
        node.attribute.extend([helper.make_attribute("k_quant_type", "PER_CHANNEL"),
                               helper.make_attribute("v_quant_type", "PER_CHANNEL"),
                               helper.make_attribute("kv_cache_bit_width", 8)])  # fmt: skip
    for value in (*model.graph.input, *model.graph.output):
        if is_in_place_cache(value.name):
            value.type.tensor_type.elem_type = TensorProto.INT8
    onnx.save(model, str(path))
    log.info("key/value cache in int8 (%d layers, scales per channel, %s)", len(cached), scales.source)
    return {"dtype": "int8", "scales": "per head and channel, symmetric", "kernel": "GroupQueryAttention",
            "measured_on": scales.source, "margin": scales.margin}  # fmt: skip
