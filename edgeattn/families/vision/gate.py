"""The vision family's side of the accuracy gate and of calibration: eager float32's answers on
held-out images (the user's, as pixel values, or seeded random pixels), and the image encoder
measured against them: the pooled embedding's cosine (the figure an embedding's user reads), the
hidden states' cosine, and a classifier's top-1 agreement with float32's labels."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np
import torch

from edgeattn.exporters.gate import HeldOut, Reference, cosine_metrics
from edgeattn.families.vision.model import VisionModel
from edgeattn.runtime.families.vision.specs import PIXELS
from edgeattn.runtime.specs import GraphSpec

#: random images the gate measures when no held-out images are given
RANDOM_IMAGES = 8
#: images a batch of the gate's runs (eager and candidate alike)
BATCH = 8
#: the largest side of a random image (a model's own size may be far larger: DINOv2's table is 518)
RANDOM_SIDE = 224


def random_pixels(model: VisionModel, images: int, seed: int) -> np.ndarray:
    """Seeded pixel values in the range normalised photographs take (about [-2, 2.6])."""
    vision = model.config.section
    side = max(vision.patch_size, min(vision.image_size, RANDOM_SIDE) // vision.patch_size * vision.patch_size)
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(0.0, 1.0, (images, vision.channels, side, side)), -2.1, 2.6).astype(np.float32)


def batched(run: Any, pixels: np.ndarray) -> dict[str, np.ndarray]:
    """``run(batch) -> {name: array}`` over ``pixels`` a batch at a time, the answers joined."""
    parts = [run(pixels[i:i + BATCH]) for i in range(0, len(pixels), BATCH)]
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


class VisionReference(Reference):
    """Eager float32 on the held-out images (``heldout.features``: pixel values), else on seeded
    random pixels; each answer computed once."""

    def __init__(self, model: VisionModel, heldout: HeldOut, new_tokens: int = 16, progress: bool = False
                 ) -> None:  # fmt: skip
        super().__init__(model, heldout, new_tokens, progress)
        if heldout.features is None:
            images = min(len(heldout.ids), RANDOM_IMAGES)
            self.heldout = HeldOut(heldout.ids[:images], heldout.mask[:images],
                                   f"seeded random pixel values ({images} images)", True,
                                   random_pixels(model, images, 99))  # fmt: skip
        assert self.heldout.features is not None
        self.pixels = self.heldout.features

    @cached_property
    def outputs(self) -> dict[str, np.ndarray]:
        """Eager float32's hidden states, pooled embeddings and (with a classifier) logits."""

        def eager(pixels: np.ndarray) -> dict[str, np.ndarray]:
            with torch.no_grad():
                return {name: t.numpy() for name, t in self.model.outputs(torch.from_numpy(pixels)).items()}

        return batched(eager, self.pixels)


def encoder_metrics(ref: VisionReference, runtime: Any, graph: str) -> dict[str, float]:
    """The pooled embeddings' cosine to eager float32's (mean and least), the hidden states' mean
    cosine, and a classifier's top-1 agreement."""
    got = batched(lambda pixels: runtime.run(graph, {PIXELS: pixels}), ref.pixels)
    want = ref.outputs
    embedding = "image_embeds" if "image_embeds" in want else "pooler_output"  # what embed() returns
    metrics = cosine_metrics(got[embedding], want[embedding])
    metrics["hidden_cosine_mean"] = cosine_metrics(got["last_hidden_state"], want["last_hidden_state"])["cosine_mean"]
    if "logits" in want:
        metrics["top1"] = float((got["logits"].argmax(-1) == want["logits"].argmax(-1)).mean())
    return metrics


#: random texts the text encoder is gated and calibrated on, and their longest length
RANDOM_TEXTS, TEXT_TOKENS = 16, 12


def random_texts(model: VisionModel, rows: int, seed: int) -> dict[str, np.ndarray]:
    """Seeded token ids of the text tower's vocabulary with lengths spread over 2..TEXT_TOKENS, each row
    ending in its end token, padded on the right."""
    text = model.config.section.text
    rng = np.random.default_rng(seed)
    width = min(TEXT_TOKENS, text.max_len)
    ids = rng.integers(0, text.vocab_size - 1 if text.eos_id < 0 else text.vocab_size, (rows, width))
    mask = np.zeros((rows, width), np.int64)
    for row, length in enumerate(rng.integers(2, width + 1, rows)):
        mask[row, :length] = 1
        ids[row, length - 1] = text.vocab_size - 1 if text.eos_id < 0 else text.eos_id
    return {"input_ids": ids.astype(np.int64), "attention_mask": mask}


def text_metrics(ref: VisionReference, runtime: Any, graph: str) -> dict[str, float]:
    """The text embeddings' cosine to eager float32's on seeded random texts (mean and least)."""
    feeds = random_texts(ref.model, RANDOM_TEXTS, 5)
    with torch.no_grad():
        want = ref.model.text.outputs(*(torch.from_numpy(feeds[n]) for n in ("input_ids", "attention_mask")))
    got = runtime.run(graph, feeds)
    return cosine_metrics(got["text_embeds"], want["text_embeds"].numpy())


def text_calibration(model: VisionModel, spec: GraphSpec, ids: np.ndarray, mask: np.ndarray,
                     rng: np.random.Generator, new_tokens: int) -> dict[str, np.ndarray]:  # fmt: skip
    """Random texts, one a row."""
    return random_texts(model, ids.shape[0], int(rng.integers(1 << 30)))


def encoder_calibration(model: VisionModel, spec: GraphSpec, ids: np.ndarray, mask: np.ndarray,
                        rng: np.random.Generator, new_tokens: int) -> dict[str, np.ndarray]:  # fmt: skip
    """Random pixel values, one image a row."""
    return {PIXELS: random_pixels(model, ids.shape[0], int(rng.integers(1 << 30)))}
