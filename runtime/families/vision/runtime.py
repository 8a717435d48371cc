"""The vision family's runtime: images in (paths, bytes, Pillow images, uint8 arrays), pooled
embeddings or labels out. Torch-free: numpy, onnxruntime and Pillow."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime import text
from edgeattn.runtime.exported_model import ExportedModel, InputError
from edgeattn.runtime.families.vision.images import ImagePreprocessing
from edgeattn.runtime.families.vision.specs import PIXELS, VISION_ENCODER
from edgeattn.runtime.jsonfile import read_json_object
from edgeattn.runtime.manifest import check_file


def image_list(images: Any) -> list[Any]:
    """One image or a list of them, as a list (a 3-d or 2-d uint8 array is one image)."""
    if isinstance(images, list | tuple):
        return list(images)
    return [images]


class VisionRuntime(ExportedModel):
    """A vision export (ViT, DINOv2): :meth:`embed` and :meth:`classify` images, or :meth:`encode`
    pixel values."""

    @cached_property
    def preprocessing(self) -> ImagePreprocessing:
        """How an image becomes pixel values (``settings.json``'s ``preprocessing``; without one, a
        square of the model's image size, scaled to [-1, 1])."""
        entry = None if self.manifest is None else self.manifest.settings
        if entry is None or self.export_dir is None:
            side = self.config.section.image_size
            return ImagePreprocessing(size={"height": side, "width": side})
        settings = read_json_object(check_file(self.export_dir, entry), EdgeattnError)
        return ImagePreprocessing.from_dict(settings.get("preprocessing") or {})

    def pixel_values(self, images: Any) -> np.ndarray:
        """(B, channels, height, width) float32 pixel values of one image or a list of them."""
        return self.preprocessing.batch(image_list(images))

    def encode(self, pixel_values: Any) -> dict[str, np.ndarray]:
        """Every output of the graph (hidden states, the pooled embedding, logits where the model has a
        classifier) for (B, channels, height, width) pixel values."""
        pixels = np.asarray(pixel_values)
        vision = self.config.section
        if pixels.ndim != 4 or pixels.shape[1] != vision.channels:
            raise InputError(f"pixel values are (batch, {vision.channels}, height, width); got shape {pixels.shape}")
        if min(pixels.shape[2:]) < vision.patch_size:
            raise InputError(f"an image of {pixels.shape[2]} x {pixels.shape[3]} pixels is smaller than one "
                             f"{vision.patch_size}-pixel patch")  # fmt: skip
        if not np.isfinite(pixels).all():
            raise InputError("pixel values hold NaN or infinity")
        return self.run(VISION_ENCODER, {PIXELS: pixels.astype(np.float32, copy=False)})

    def embed(self, images: Any) -> np.ndarray:
        """One pooled embedding per image (the model's ``pooler_output``), (B, d_model) float32."""
        return self.encode(self.pixel_values(images))["pooler_output"]

    def classify(self, images: Any) -> Any:
        """Images: one :class:`~edgeattn.runtime.text.Classification` each (label, probability,
        every label's probability); pixel values as an array: the logits (B, labels)."""
        if self.config.section.classifier == "none":
            raise EdgeattnError("this vision model has no classifier: embed its images instead")
        if isinstance(images, np.ndarray) and images.dtype != np.uint8:
            return self.encode(images)["logits"]
        logits = self.encode(self.pixel_values(images))["logits"]
        return text.classifications(logits, text.label_names(self.labels, logits.shape[-1]))
