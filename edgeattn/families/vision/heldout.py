"""A vision model's ``--heldout``: image files as the gate's pixel values, preprocessed as the export
preprocesses every image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.errors import ConfigError, EdgeattnError
from edgeattn.exporters.calibration import listed_files
from edgeattn.runtime.families.vision.images import ImagePreprocessing

#: what a vision model's --heldout reads as images
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp")


def image_files(path: Path) -> list[Path]:
    """The images of a folder, one file, or a text file naming them a line each."""
    return listed_files(path, IMAGE_SUFFIXES, "images")


def read_heldout(path: Path, settings: dict[str, Any] | None) -> tuple[np.ndarray, None]:
    """The held-out images at ``path`` as pixel values (N, channels, height, width), preprocessed as
    the export's ``settings`` say; no prompt."""
    preprocessing = ImagePreprocessing.from_dict((settings or {}).get("preprocessing") or {})
    try:
        return preprocessing.batch(list(image_files(path))), None
    except EdgeattnError as exc:
        raise ConfigError(f"--heldout {path}: {exc}") from exc
