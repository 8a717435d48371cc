"""Whisper's input features in numpy: the log-mel spectrogram ``WhisperFeatureExtractor``
computes (a centred, reflect-padded STFT with a periodic Hann window, power, a Slaney mel filter
bank, log10, clamped to 8 below the largest value, scaled as (x + 4) / 4), equal to it within
1e-4 and without torch."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.jsonfile import read_json_object

#: what ``preprocessor_config.json`` names the settings
PREPROCESSOR_CONFIG = "preprocessor_config.json"
#: frames one task of the spectrogram takes (tasks run on threads: numpy's FFT and BLAS let go
#: of the GIL; also bounds memory on hours of audio)
FRAMES_AT_ONCE = 750
#: threads the spectrogram's tasks share
THREADS = min(4, os.cpu_count() or 1)


def _hertz_to_mel(freq: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    freq = np.asarray(freq, dtype=np.float64)
    mels = 3.0 * freq / 200.0
    log_region = freq >= 1000.0
    return np.where(log_region, 15.0 + np.log(np.maximum(freq, 1e-10) / 1000.0) * (27.0 / np.log(6.4)), mels)


def _mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    mels = np.asarray(mels, dtype=np.float64)
    freq = 200.0 * mels / 3.0
    return np.where(mels >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (mels - 15.0)), freq)


def mel_filter_bank(n_mels: int, n_fft: int, rate: int, low: float = 0.0, high: float | None = None) -> np.ndarray:
    """Triangular filters on Slaney's mel scale, each scaled to unit area (``norm="slaney"``):
    shape (n_fft // 2 + 1, n_mels)."""
    high = rate / 2 if high is None else high
    edges = _mel_to_hertz(np.linspace(_hertz_to_mel(low), _hertz_to_mel(high), n_mels + 2))
    bins = np.linspace(0, rate // 2, n_fft // 2 + 1)
    slopes = edges[None, :] - bins[:, None]
    widths = np.diff(edges)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    return filters * (2.0 / (edges[2:] - edges[:-2]))[None, :]


@dataclass(frozen=True)
class LogMel:
    """A Whisper model's feature settings (``preprocessor_config.json``)."""

    n_mels: int = 80
    n_fft: int = 400
    hop: int = 160
    rate: int = 16_000
    #: seconds a window of the model holds (its encoder takes ``window_frames`` frames)
    chunk_seconds: int = 30

    @classmethod
    def from_folder(cls, folder: str | Path) -> LogMel:
        """The settings a Hugging Face folder's ``preprocessor_config.json`` writes."""
        path = Path(folder) / PREPROCESSOR_CONFIG
        data = read_json_object(path, EdgeattnError)
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "the feature settings") -> LogMel:
        kind = data.get("feature_extractor_type", "WhisperFeatureExtractor")
        if kind != "WhisperFeatureExtractor":
            raise EdgeattnError(f"{where} describes a {kind}; only Whisper's log-mel features are computed")
        try:
            made = cls(int(data.get("feature_size", 80)), int(data.get("n_fft", 400)), int(data.get("hop_length", 160)),
                       int(data.get("sampling_rate", 16_000)), int(data.get("chunk_length", 30)))  # fmt: skip
        except (TypeError, ValueError) as exc:
            raise EdgeattnError(f"{where} holds a setting that is not a number: {exc}") from None
        if min(made.n_mels, made.n_fft, made.hop, made.rate, made.chunk_seconds) <= 0:
            raise EdgeattnError(f"{where}: feature_size, n_fft, hop_length, sampling_rate and chunk_length are > 0")
        if float(data.get("dither", 0.0) or 0.0) != 0.0:
            raise EdgeattnError(f"{where} asks for dither {data['dither']}; only undithered features are computed")
        return made

    def as_dict(self) -> dict[str, Any]:
        """As ``preprocessor_config.json`` writes them (what an export keeps)."""
        return {"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": self.n_mels,
                "n_fft": self.n_fft, "hop_length": self.hop, "sampling_rate": self.rate,
                "chunk_length": self.chunk_seconds}  # fmt: skip

    @property
    def window_samples(self) -> int:
        return self.chunk_seconds * self.rate

    @property
    def window_frames(self) -> int:
        return self.window_samples // self.hop

    @cached_property
    def filters(self) -> np.ndarray:
        """(n_mels, n_fft // 2 + 1) float32."""
        return np.ascontiguousarray(mel_filter_bank(self.n_mels, self.n_fft, self.rate).T.astype(np.float32))

    @cached_property
    def window(self) -> np.ndarray:
        """The periodic Hann window."""
        return np.hanning(self.n_fft + 1)[:-1].astype(np.float32)

    def windows(self, samples: np.ndarray) -> np.ndarray:
        """Audio as consecutive windows of features (W, n_mels, window_frames): one padded window,
        or long-form audio's features cut every ``chunk_seconds`` and the last padded with zeros."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        long_form = samples.size > self.window_samples
        features = self(samples, pad_to_window=not long_form)
        count = -(-features.shape[1] // self.window_frames)
        out = np.zeros((count, self.n_mels, self.window_frames), dtype=np.float32)
        for i in range(count):
            piece = features[:, i * self.window_frames : (i + 1) * self.window_frames]
            out[i, :, : piece.shape[1]] = piece
        return out

    def __call__(self, samples: np.ndarray, pad_to_window: bool = True) -> np.ndarray:
        """Features of mono ``samples`` at the model's rate, shape (n_mels, frames) float32:
        one window (zero-padded or cut to ``chunk_seconds``) when ``pad_to_window``, as the
        feature extractor gives a short clip; else every frame of the audio, one per ``hop``
        samples (long-form audio, cut into windows afterwards: what ``generate`` takes)."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if pad_to_window:
            samples = np.pad(samples[: self.window_samples], (0, max(0, self.window_samples - samples.size)))
        if samples.size < 2:
            raise EdgeattnError("audio of fewer than 2 samples has no spectrogram")
        half = self.n_fft // 2
        mode = "reflect" if samples.size > half else "constant"
        padded = np.pad(samples, (half, half), mode=mode)
        count = 1 + (padded.size - self.n_fft) // self.hop
        frames = np.lib.stride_tricks.as_strided(padded, (count, self.n_fft), (padded.strides[0] * self.hop,
                                                                                padded.strides[0]), writeable=False)
        mels = np.empty((count, self.n_mels), dtype=np.float32)
        bank = np.ascontiguousarray(self.filters.T)  # (bins, n_mels)

        def task(start: int) -> None:
            spectrum = np.fft.rfft(frames[start : start + FRAMES_AT_ONCE] * self.window, axis=1)
            power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)
            np.matmul(power, bank, out=mels[start : start + FRAMES_AT_ONCE])

        starts = range(0, count, FRAMES_AT_ONCE)
        if len(starts) > 1 and THREADS > 1:
            with ThreadPoolExecutor(THREADS) as pool:
                list(pool.map(task, starts))
        else:
            task(0)
        power = mels.T
        logs = np.log10(np.maximum(power[:, :-1], 1e-10))
        logs = np.maximum(logs, logs.max() - 8.0)
        return ((logs + 4.0) / 4.0).astype(np.float32)
