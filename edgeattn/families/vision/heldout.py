"""A vision model's ``--heldout``: image files as the gate's pixel values, preprocessed as the export
preprocesses every image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.errors import ConfigError, EdgeattnError
from edgeattn.runtime.families.vision.images import ImagePreprocessing

#: what a vision model's --heldout reads as images
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp")


def image_files(path: Path) -> list[Path]:
    """The images of a folder, one image, or a text file naming them a line each."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    elif path.suffix.lower() in IMAGE_SUFFIXES:
        files = [path]
    else:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--heldout {path}: a vision model's held-out images are a folder of images, an "
                              f"image, or a text file naming them ({exc})") from exc  # fmt: skip
        files = [path.parent / line.strip() for line in lines if line.strip()]
    if not files:
        raise ConfigError(f"--heldout {path} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    return files


def read_heldout(path: Path, settings: dict[str, Any] | None) -> tuple[np.ndarray, None]:
    """The held-out images at ``path`` as pixel values (N, channels, height, width), preprocessed as
    the export's ``settings`` say; no prompt."""
    preprocessing = ImagePreprocessing.from_dict((settings or {}).get("preprocessing") or {})
    try:
        return preprocessing.batch(list(image_files(path))), None
    except EdgeattnError as exc:
        raise ConfigError(f"--heldout {path}: {exc}") from exc
