"""What a vision model's served requests carry: in the OpenAI API, images as data URLs or base64 (as
vLLM's and Jina's embedding servers take them), never a URL or a path the server would fetch or
read; in Triton and ``edgeattn serve``, image files' bytes (:data:`IMAGES`). Torch-free."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime import text
from edgeattn.runtime.exported_model import InputError
from edgeattn.serving.tasks import ServedTensor, each_alone, strings

#: the most bytes one image of a request may hold, decoded
MAX_IMAGE_BYTES = 20 << 20
_DATA_URL = re.compile(r"^data:image/[a-z0-9.+-]+;base64,", re.IGNORECASE)


def embed_inputs(model: Any, items: list[str]) -> np.ndarray:
    """The OpenAI API's embeddings of ``items`` in order: images (data URLs, or for a model without a
    text tower bare base64 too) by :meth:`embed`, and for a model with a text tower (CLIP) every other
    item as a text by :meth:`embed_text`, in the space the two share."""
    texts = model.config.section.text is not None
    is_image = [bool(_DATA_URL.match(item)) or not texts for item in items]
    out: list[np.ndarray | None] = [None] * len(items)
    images = [i for i, image in enumerate(is_image) if image]
    if images:
        for i, vector in zip(images, model.embed(image_inputs([items[i] for i in images], images)), strict=True):
            out[i] = vector
    words = [i for i, image in enumerate(is_image) if not image]
    if words:
        for i, vector in zip(words, model.embed_text([items[i] for i in words]), strict=True):
            out[i] = vector
    return np.stack([v for v in out if v is not None])


def image_inputs(items: list[str], positions: list[int] | None = None) -> list[bytes]:
    """Each request item as the bytes of an image: ``data:image/...;base64,...`` or bare base64
    (``positions``: the items' places in the request, for messages)."""
    images = []
    for i, item in zip(positions or range(len(items)), items, strict=True):
        payload = _DATA_URL.sub("", item, count=1)
        if payload == item and re.match(r"^[a-z][a-z0-9+.-]*:", item, re.IGNORECASE):
            raise InputError(f"input {i} is a {item.split(':', 1)[0]}: URL; a vision model takes images as data URLs "
                             "(data:image/png;base64,...) or base64, not addresses to fetch")  # fmt: skip
        if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
            raise InputError(f"input {i} is over the limit of {MAX_IMAGE_BYTES:,} bytes an image")
        try:
            images.append(base64.b64decode(payload, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise InputError(f"input {i} is neither a data URL of an image nor base64 ({exc})") from exc
    return images


@dataclass(frozen=True)
class ImageTask:
    """Images in (each row an image file's bytes: JPEG, PNG, WebP, GIF or BMP), each image's pooled
    embedding out, and a classifier's label, its probability and every label's probability."""

    name: str = "image-feature-extraction"
    #: the image preprocessing lives in the export: it is carried and run in process
    carries_export: bool = True
    sends: str = "`image` (each row an image file's bytes: JPEG, PNG, WebP, GIF or BMP)"
    example: str = 'open("cat.jpg", "rb").read()'
    packages: tuple[str, ...] = ("Pillow",)
    inputs: tuple[ServedTensor, ...] = (ServedTensor("image", "bytes", (1,)),)

    def outputs(self, config: Any) -> tuple[ServedTensor, ...]:
        """What a request gets back for a model of ``config`` (None: every output a model may have)."""
        width = -1 if config is None else config.section.projection or config.d_model
        out = (ServedTensor("embedding", "float32", (width,)),)
        if config is not None and config.section.classifier == "none":
            return out
        return (*out, ServedTensor("label", "bytes", (1,)), ServedTensor("score", "float32", (1,)),
                ServedTensor("probabilities", "float32", (-1 if config is None else config.num_labels,)))  # fmt: skip

    def answer(self, model: Any, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray] | Exception]:
        """Each request's answers, one row an image (or the error that request alone caused)."""
        return each_alone(lambda request: self._one(model, request), requests)

    def _one(self, model: Any, request: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if "image" not in request:
            raise EdgeattnError("the request has no 'image' input (each row an image file's bytes)")
        files = list(np.asarray(request["image"], dtype=object).reshape(-1))
        if not files or not all(isinstance(f, bytes | np.bytes_) for f in files):
            raise EdgeattnError("'image' holds each image file's bytes (BYTES), one a row")
        outputs = model.encode(model.pixel_values([bytes(f) for f in files]))
        embedding = outputs["image_embeds"] if "image_embeds" in outputs else outputs["pooler_output"]
        answer = {"embedding": embedding.astype(np.float32)}
        if "logits" in outputs:
            found = text.classifications(outputs["logits"], text.label_names(model.labels, model.config.num_labels))
            answer["label"] = strings([c.label for c in found])
            answer["score"] = np.array([[c.score] for c in found], np.float32)
            answer["probabilities"] = np.array([list(c.scores.values()) for c in found], np.float32)
        return answer


IMAGES = ImageTask()
