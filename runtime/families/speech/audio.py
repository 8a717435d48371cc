"""Audio in, without torch: a file (WAV, FLAC, OGG Vorbis or Opus, MP3: whatever libsndfile
reads) or an array, as mono float32 samples at the rate a model wants, resampled by soxr.

Needs ``pip install 'edgeattn[audio]'`` (``soundfile``, whose wheels carry libsndfile, and
``soxr``).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError

#: the rate speech models take
SPEECH_RATE = 16_000
#: the longest audio read at once (samples at the model's rate: 4 hours at 16 kHz)
MAX_SAMPLES = 4 * 3600 * SPEECH_RATE


class AudioError(EdgeattnError):
    """Audio that cannot be read, or is not sound (empty, not finite, too long)."""


def _needs(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError:
        raise AudioError(f"reading audio needs {name}: pip install 'edgeattn[audio]'") from None


def resample(samples: np.ndarray, rate: int, to: int = SPEECH_RATE) -> np.ndarray:
    """``samples`` (mono) taken at ``rate`` as float32 at ``to`` (soxr's high quality)."""
    samples = np.asarray(samples, dtype=np.float32)
    if rate == to:
        return samples
    if rate <= 0:
        raise AudioError(f"a sampling rate is a positive number of samples a second, not {rate}")
    return np.asarray(_needs("soxr").resample(samples, rate, to), dtype=np.float32)


def as_mono(samples: np.ndarray, rate: int, to: int = SPEECH_RATE, where: str = "the audio") -> np.ndarray:
    """Samples of shape (frames,) or (frames, channels) at ``rate``: their channels' mean,
    resampled to ``to``; AudioError for audio that is empty, not finite or over 4 hours."""
    samples = np.asarray(samples)
    if samples.ndim == 2:
        samples = samples.mean(axis=1)
    if samples.ndim != 1:
        raise AudioError(f"{where} is (samples,) or (samples, channels), not of shape {samples.shape}")
    if samples.size == 0:
        raise AudioError(f"{where} holds no samples")
    if np.issubdtype(samples.dtype, np.integer):  # PCM integers: to [-1, 1]
        samples = samples / float(np.iinfo(samples.dtype).max + 1)
    if samples.size * to / rate > MAX_SAMPLES:
        raise AudioError(f"{where} is over {MAX_SAMPLES // SPEECH_RATE // 3600} hours long")
    mono = resample(samples.astype(np.float32), rate, to)
    if not np.isfinite(mono).all():
        raise AudioError(f"{where} holds samples that are not finite numbers")
    return mono


def read_audio(source: str | Path | bytes, to: int = SPEECH_RATE) -> np.ndarray:
    """A file (a path, or its bytes) as mono float32 samples at ``to`` samples a second."""
    soundfile = _needs("soundfile")
    where = "the uploaded audio" if isinstance(source, bytes) else str(source)
    handle = io.BytesIO(source) if isinstance(source, bytes) else source
    if not isinstance(source, bytes) and not Path(source).is_file():
        raise AudioError(f"{source} is not a file")
    try:
        with soundfile.SoundFile(handle) as f:
            if f.frames > MAX_SAMPLES * max(1, f.samplerate // to + 1):
                raise AudioError(f"{where} is over {MAX_SAMPLES // SPEECH_RATE // 3600} hours long")
            samples = f.read(dtype="float32", always_2d=True)
            rate = f.samplerate
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise AudioError(f"{where} is not audio libsndfile reads (WAV, FLAC, OGG Vorbis / Opus, MP3): {exc}") from exc
    return as_mono(samples, rate, to, where)
