"""The vision family's runtime: images in (paths, bytes, Pillow images, uint8 arrays), pooled
embeddings or labels out. Torch-free: numpy, onnxruntime and Pillow."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime import text
from edgeattn.runtime.exported_model import ExportedModel, InputError, batch_texts
from edgeattn.runtime.families.vision.images import ImagePreprocessing, preprocessing_of
from edgeattn.runtime.families.vision.specs import PIXELS, TEXT_ENCODER, VISION_ENCODER
from edgeattn.runtime.jsonfile import read_json_object
from edgeattn.runtime.manifest import check_file
from edgeattn.runtime.tokenizer import TokenizerError


def image_list(images: Any) -> list[Any]:
    """One image or a list of them, as a list (a 3-d or 2-d uint8 array is one image)."""
    if isinstance(images, list | tuple):
        return list(images)
    return [images]


class VisionRuntime(ExportedModel):
    """A vision export (ViT, DINOv2, CLIP): :meth:`embed` and :meth:`classify` images, or
    :meth:`encode` pixel values; with a text tower (CLIP) :meth:`embed_text` and :meth:`zero_shot`."""

    @cached_property
    def preprocessing(self) -> ImagePreprocessing:
        """How an image becomes pixel values (``settings.json``'s ``preprocessing``; without one, a
        square of the model's image size, scaled to [-1, 1])."""
        entry = None if self.manifest is None else self.manifest.settings
        settings = None
        if entry is not None and self.export_dir is not None:
            settings = read_json_object(check_file(self.export_dir, entry), EdgeattnError)
        return preprocessing_of(settings, self.config.section.image_size)

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
        """One embedding per image: the model's pooled output (``pooler_output``, (B, d_model)), or for
        a model that projects it (CLIP) the projection (``image_embeds``, (B, projection)), float32."""
        outputs = self.encode(self.pixel_values(images))
        return outputs["image_embeds"] if "image_embeds" in outputs else outputs["pooler_output"]

    def _text_tower(self) -> Any:
        text = self.config.section.text
        if text is None:
            raise EdgeattnError("this vision model has no text tower: it embeds images, not texts")
        return text

    def encode_text(self, input_ids: Any, attention_mask: Any = None) -> dict[str, np.ndarray]:
        """The text tower's outputs (hidden states, pooled state, ``text_embeds``) for (B, T) token ids."""
        text = self._text_tower()
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or ids.dtype.kind not in "iu":
            raise InputError(f"input_ids are (batch, tokens) integers; got {ids.dtype} {ids.shape}")
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask)
        if mask.shape != ids.shape:
            raise InputError(f"attention_mask has shape {mask.shape} but input_ids has {ids.shape}")
        if ids.shape[1] > text.max_len:
            raise InputError(f"{ids.shape[1]} tokens are more than the text tower's {text.max_len}")
        if ((ids < 0) | (ids >= text.vocab_size)).any():
            raise InputError(f"token ids must lie in 0..{text.vocab_size - 1}")
        return self.run(TEXT_ENCODER, {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)})

    def embed_text(self, texts: Any, *, truncate: bool = True) -> np.ndarray:
        """One embedding per text (a string or a list of them) in the space the images are projected
        into (``text_embeds``), (B, projection) float32; texts longer than the tower takes are cut to it
        (its end token kept) unless ``truncate=False``."""
        return self.encode_text(*self.text_tokens(texts, truncate=truncate))["text_embeds"]

    def text_tokens(self, texts: Any, *, truncate: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The token ids and mask the text tower takes for texts, padded as it was trained (SigLIP: to
        its length) and cut to its length (the end token kept) unless ``truncate=False``."""
        text = self._text_tower()
        if self.tokenizer is None:
            raise EdgeattnError(f"{self.export_dir or 'this model'} has no tokenizer.json; "
                                "pass token ids to encode_text")
        try:
            batch = self.tokenizer.batch(batch_texts(texts), 1 << 20, text.pad_id, False)
        except TokenizerError as exc:
            raise InputError(str(exc)) from exc
        ids, mask = batch.ids, batch.mask
        if text.pool == "last" and ids.shape[1] < text.max_len:  # padded to the tower's length, as trained
            pad = text.max_len - ids.shape[1]
            ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=text.pad_id)
            mask = np.pad(mask, ((0, 0), (0, pad)))
        if ids.shape[1] > text.max_len:
            if not truncate:
                raise InputError(f"a text of {ids.shape[1]} tokens is more than the text tower's {text.max_len}")
            lengths = mask.sum(axis=1)
            ends = ids[np.arange(len(ids)), lengths - 1]
            ids, mask = ids[:, :text.max_len].copy(), mask[:, :text.max_len]
            long = lengths > text.max_len
            if text.pool == "eos":
                ids[long, -1] = ends[long]  # the end token the tower pools
        return ids, mask

    def _prompt_embeddings(self, prompts: tuple[str, ...]) -> np.ndarray:
        """:meth:`embed_text` of ``prompts``, kept for the next call with the same ones (a run or a
        server scores image after image against one set of labels)."""
        kept = self.__dict__.get("_prompts")
        if kept is None or kept[0] != prompts:
            kept = (prompts, self.embed_text(list(prompts)))
            self.__dict__["_prompts"] = kept
        return kept[1]

    def zero_shot(self, images: Any, labels: list[str], template: str = "a photo of {}") -> list[Any]:
        """Each image's probabilities over ``labels`` (zero-shot classification: the cosine of its
        embedding to each label's text, ``template`` filled with it, times the model's scale; CLIP's
        softmax over the labels, SigLIP's sigmoid of each after its bias): one
        :class:`~edgeattn.runtime.text.Classification` each."""
        if not labels or not all(isinstance(label, str) and label.strip() for label in labels):
            raise InputError("labels are a non-empty list of non-empty strings")
        if "{}" not in template:
            raise InputError("template must hold {} where each label goes")
        pictures = self.embed(images)
        words = self._prompt_embeddings(tuple(template.format(label.strip()) for label in labels))
        pictures = pictures / np.linalg.norm(pictures, axis=-1, keepdims=True)
        words = words / np.linalg.norm(words, axis=-1, keepdims=True)
        vision = self.config.section
        logits = vision.logit_scale * pictures @ words.T + vision.logit_bias
        names = [label.strip() for label in labels]
        if vision.scores == "softmax":
            return text.classifications(logits, names)
        found = []  # SigLIP: each label's own probability, not a share of one
        for row in 1.0 / (1.0 + np.exp(-logits.astype(np.float64))):
            best = int(row.argmax())
            scores = dict(zip(names, map(float, row), strict=True))
            found.append(text.Classification(names[best], float(row[best]), scores))
        return found

    def classify(self, images: Any) -> Any:
        """Images: one :class:`~edgeattn.runtime.text.Classification` each (label, probability,
        every label's probability); pixel values as an array: the logits (B, labels)."""
        if self.config.section.classifier == "none":
            raise EdgeattnError("this vision model has no classifier: embed its images instead")
        if isinstance(images, np.ndarray) and images.dtype != np.uint8:
            return self.encode(images)["logits"]
        logits = self.encode(self.pixel_values(images))["logits"]
        return text.classifications(logits, text.label_names(self.labels, logits.shape[-1]))
