"""A speech model's ``--heldout``: audio files as the gate's windows of log-mel features, and the
prompt they are decoded after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.exporters.calibration import listed_files
from edgeattn.runtime.families.speech.audio import read_audio
from edgeattn.runtime.families.speech.decoding import WhisperDecoding
from edgeattn.runtime.families.speech.log_mel import LogMel

#: what a speech model's --heldout reads as audio
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".opus", ".mp3")


def audio_files(path: Path) -> list[Path]:
    """The audio of a folder, one file, or a text file naming them a line each."""
    return listed_files(path, AUDIO_SUFFIXES, "audio")


def read_heldout(path: Path, settings: dict[str, Any] | None) -> tuple[np.ndarray, list[int] | None]:
    """The held-out audio at ``path`` as windows of the export's log-mel features (W, n_mels, frames),
    and the prompt they are decoded after: an English-only model's transcription prompt (None for a
    multilingual one, whose language would need detecting first: the start token alone)."""
    settings = settings or {}
    log_mel = LogMel.from_dict(settings.get("features") or {}, "the export's feature settings")
    features = np.concatenate([log_mel.windows(read_audio(f, log_mel.rate)) for f in audio_files(path)])
    decoding = WhisperDecoding.from_dict(settings.get("decoding") or {}, "the export's decoding settings")
    return features, None if decoding.multilingual else decoding.prompt(None)
