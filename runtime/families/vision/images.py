"""Images in, pixel values out, without torch: decoding with Pillow (hostile files refused before
they are decoded) and the resize, crop, rescale and normalisation a folder's
``preprocessor_config.json`` describes, step for step as transformers' image processors do them on
their Pillow path (``ViTImageProcessor``, ``BitImageProcessor``, ``CLIPImageProcessor``)."""

from __future__ import annotations

import io
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.runtime.exported_model import InputError

#: the formats an image may come in (a file of another kind is refused by name)
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
#: the most pixels an image may declare (a decompression bomb declares far more than it holds);
#: ``EDGEATTN_MAX_IMAGE_PIXELS`` sets another limit
MAX_PIXELS = 64_000_000
#: Pillow's resampling filters by the numbers preprocessor configs use
FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def max_pixels() -> int:
    """The pixel limit in force (``EDGEATTN_MAX_IMAGE_PIXELS`` or :data:`MAX_PIXELS`)."""
    value = os.environ.get("EDGEATTN_MAX_IMAGE_PIXELS")
    try:
        return int(value) if value else MAX_PIXELS
    except ValueError as exc:
        raise InputError(f"EDGEATTN_MAX_IMAGE_PIXELS={value!r} is not a whole number of pixels") from exc


@dataclass
class ImagePreprocessing:
    """What a vision model's processor does to an image before the model sees it (the fields of a
    ``preprocessor_config.json``, as transformers reads them)."""

    #: resize to ``{"height", "width"}``, or the shorter edge to ``{"shortest_edge"}`` keeping the
    #: aspect ratio (the longer edge truncated)
    size: dict[str, int] = field(default_factory=lambda: {"height": 224, "width": 224})
    do_resize: bool = True
    resample: int = 2
    do_center_crop: bool = False
    crop_size: dict[str, int] = field(default_factory=lambda: {"height": 224, "width": 224})
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    image_std: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    do_convert_rgb: bool = True

    def __post_init__(self) -> None:
        if self.resample not in FILTERS:
            raise InputError(f"resample {self.resample!r} is not one of Pillow's filters ({FILTERS})")
        for name, sizes in (("size", self.size), ("crop_size", self.crop_size)):
            if not isinstance(sizes, dict) or not sizes or not all(
                    k in ("height", "width", "shortest_edge") and isinstance(v, int) and v > 0
                    for k, v in sizes.items()):  # fmt: skip
                raise InputError(f"preprocessing {name} {sizes!r} is not {{height, width}} or {{shortest_edge}} "
                                 "in positive pixels")  # fmt: skip
        if len(self.image_mean) != len(self.image_std):
            raise InputError("preprocessing image_mean and image_std differ in length")

    @classmethod
    def from_processor(cls, config: dict[str, Any], source: str = "preprocessor_config.json") -> ImagePreprocessing:
        """The preprocessing a ``preprocessor_config.json`` describes; one this module cannot do
        exactly is refused by name rather than done differently."""
        kind = str(config.get("image_processor_type", "")).removesuffix("Fast")
        if kind and kind not in ("ViTImageProcessor", "BitImageProcessor", "CLIPImageProcessor",
                                 "SiglipImageProcessor", "DINOv2ImageProcessor"):  # fmt: skip
            raise InputError(f"{source}: image processor {kind} is not one edgeattn reproduces")
        if config.get("crop_pct") not in (None, 1, 1.0):
            raise InputError(f"{source}: crop_pct {config['crop_pct']} is not supported yet")
        size = config.get("size", {"height": 224, "width": 224})
        if isinstance(size, int):  # an old config: a square, or the shorter edge where it crops after
            size = {"shortest_edge": size} if config.get("do_center_crop") else {"height": size, "width": size}
        crop = config.get("crop_size", {"height": 224, "width": 224})
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        mean = config.get("image_mean", [0.5, 0.5, 0.5])
        std = config.get("image_std", [0.5, 0.5, 0.5])
        return cls(size=dict(size), do_resize=bool(config.get("do_resize", True)),
                   resample=int(config.get("resample", 2)), do_center_crop=bool(config.get("do_center_crop", False)),
                   crop_size=dict(crop), do_rescale=bool(config.get("do_rescale", True)),
                   rescale_factor=float(config.get("rescale_factor", 1 / 255)),
                   do_normalize=bool(config.get("do_normalize", True)),
                   image_mean=[float(m) for m in (mean if isinstance(mean, list) else [mean] * 3)],
                   image_std=[float(s) for s in (std if isinstance(std, list) else [std] * 3)],
                   do_convert_rgb=config.get("do_convert_rgb") is not False)  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImagePreprocessing:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"unknown image preprocessing keys: {', '.join(unknown)}")
        return cls(**data)

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) of the pixel values an image of this size becomes."""
        if self.do_center_crop:
            return self.crop_size["height"], self.crop_size["width"]
        return resized_size(self, height, width) if self.do_resize else (height, width)

    def __call__(self, image: Any) -> np.ndarray:
        """One image (see :func:`open_image`) as (channels, height, width) float32 pixel values."""
        return self.pixels(open_image(image, self.do_convert_rgb))

    def pixels(self, image: Any) -> np.ndarray:
        """A decoded Pillow image as (channels, height, width) float32 pixel values."""
        from PIL import Image

        if self.do_resize:
            height, width = resized_size(self, image.height, image.width)
            image = image.resize((width, height), resample=Image.Resampling(self.resample), reducing_gap=None)
        array = np.asarray(image)
        if array.ndim == 2:
            array = array[:, :, None]
        if self.do_center_crop:
            array = center_crop(array, self.crop_size["height"], self.crop_size["width"])
        if self.do_rescale:  # in float64 first, as transformers rescales
            values = (array.astype(np.float64) * self.rescale_factor).astype(np.float32)
        else:
            values = array.astype(np.float32)
        if self.do_normalize:
            channels = values.shape[-1]
            if channels != len(self.image_mean):
                raise InputError(f"the image has {channels} channels, the model's normalisation {len(self.image_mean)}")
            values = (values - np.array(self.image_mean, np.float32)) / np.array(self.image_std, np.float32)
        return np.ascontiguousarray(values.transpose(2, 0, 1))

    def batch(self, images: list[Any]) -> np.ndarray:
        """(B, channels, height, width) pixel values of ``images``: one size for all, which a processor
        that resizes to a fixed size or crops gives any mix of sizes; otherwise they must agree."""
        if not images:
            raise InputError("give at least one image")
        arrays = [self(image) for image in images]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise InputError(f"the images' pixel values differ in size ({sorted(shapes)}) and this model's "
                             "preprocessing neither resizes them to one size nor crops them: give one size at a time")
        return np.stack(arrays)


def preprocessing_of(settings: dict[str, Any] | None, image_size: int) -> ImagePreprocessing:
    """An export's preprocessing: its ``settings.json``'s ``preprocessing``, or without one a square of
    the model's ``image_size``, scaled to [-1, 1]."""
    if settings is None:
        return ImagePreprocessing(size={"height": image_size, "width": image_size})
    return ImagePreprocessing.from_dict(settings.get("preprocessing") or {})


def resized_size(pre: ImagePreprocessing, height: int, width: int) -> tuple[int, int]:
    """transformers' resize target: a fixed ``height`` x ``width``, or the shorter edge set and the
    longer scaled and truncated (``get_resize_output_image_size`` with ``default_to_square=False``)."""
    if "shortest_edge" in pre.size:
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = pre.size["shortest_edge"], int(pre.size["shortest_edge"] * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)
    return pre.size["height"], pre.size["width"]


def center_crop(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """The centre ``height`` x ``width`` of an (H, W, C) array, padded with zeros where it is smaller
    (as transformers' ``center_crop``)."""
    h, w = array.shape[:2]
    top, left = (h - height) // 2, (w - width) // 2
    if top >= 0 and left >= 0 and top + height <= h and left + width <= w:
        return array[top:top + height, left:left + width]
    padded = np.zeros((max(h, height), max(w, width), array.shape[2]), array.dtype)
    top_pad, left_pad = (padded.shape[0] - h) // 2, (padded.shape[1] - w) // 2
    padded[top_pad:top_pad + h, left_pad:left_pad + w] = array
    top, left = top + top_pad, left + left_pad
    return padded[top:top + height, left:left + width]


def describe(image: Any) -> str:
    """How an image input is named in messages."""
    if isinstance(image, str | Path):
        return str(image)
    if isinstance(image, bytes | bytearray | memoryview):
        return f"the image of {len(bytes(image)):,} bytes"
    if isinstance(image, np.ndarray):
        return "the image array"
    return "the Pillow image" if type(image).__module__.startswith("PIL") else f"a {type(image).__name__}"


def open_image(image: Any, rgb: bool = True) -> Any:
    """A Pillow image of a path, bytes, a Pillow image or an (H, W, 3) / (H, W) uint8 array, EXIF
    orientation applied, RGB (where ``rgb``); hostile inputs raise an :class:`InputError` of one line
    before anything is decoded: a declared size over :func:`max_pixels` (a decompression bomb), a
    zero-sized, truncated or unreadable file, a format not in :data:`FORMATS`."""
    try:
        from PIL import Image, ImageOps, UnidentifiedImageError
    except ImportError as exc:
        raise InputError("a vision model reads images with Pillow, which is not installed: "
                         "pip install 'edgeattn[vision]'") from exc
    name = describe(image)
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (1, 3, 4)):
            raise InputError(f"an image array is (height, width) or (height, width, 1 / 3 / 4) uint8; got "
                             f"{image.dtype} {image.shape}")  # fmt: skip
        _check_size(image.shape[1], image.shape[0], name)
        image = Image.fromarray(image[:, :, 0] if image.ndim == 3 and image.shape[2] == 1 else image)
    elif isinstance(image, bytes | bytearray | memoryview | str | Path):
        source: Any = io.BytesIO(bytes(image)) if isinstance(image, bytes | bytearray | memoryview) else image
        try:
            opened = Image.open(source, formats=list(FORMATS))
        except FileNotFoundError as exc:
            raise InputError(f"{name}: no such file") from exc
        except IsADirectoryError as exc:
            raise InputError(f"{name} is a folder, not an image") from exc
        except UnidentifiedImageError as exc:
            raise InputError(f"{name} is not an image edgeattn reads ({', '.join(FORMATS)})") from exc
        except Image.DecompressionBombError as exc:
            raise InputError(f"{name} declares more pixels than an image may have ({max_pixels():,}; "
                             "EDGEATTN_MAX_IMAGE_PIXELS sets the limit)") from exc  # fmt: skip
        except PermissionError as exc:
            raise InputError(f"{name} cannot be read: {exc.strerror}") from exc
        except OSError as exc:
            raise InputError(f"{name} is damaged or truncated: {exc}") from exc
        _check_size(opened.width, opened.height, name)
        try:
            opened.seek(0)  # an animation's first frame
            opened.load()
        except (OSError, SyntaxError, ValueError) as exc:
            raise InputError(f"{name} is damaged or truncated: {exc}") from exc
        image = opened
    elif not isinstance(image, Image.Image):
        raise InputError(f"an image is a path, bytes, a Pillow image or a uint8 array; got {type(image).__name__}")
    else:
        _check_size(image.width, image.height, name)
    try:
        image = ImageOps.exif_transpose(image)
    except Exception as exc:  # noqa: BLE001 - a damaged EXIF block: the image as stored
        raise InputError(f"{name} has damaged orientation data: {exc}") from exc
    if rgb and image.mode != "RGB":
        image = image.convert("RGB")
    return image


def _check_size(width: int, height: int, name: str) -> None:
    if width < 1 or height < 1:
        raise InputError(f"{name} is {width} x {height} pixels: an image has at least one")
    limit = max_pixels()
    if width * height > limit:
        raise InputError(f"{name} declares {width} x {height} pixels, over the limit of {limit:,} (a decompression "
                         "bomb is refused before it is decoded; EDGEATTN_MAX_IMAGE_PIXELS sets the limit)")  # fmt: skip
