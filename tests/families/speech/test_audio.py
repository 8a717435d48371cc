"""Audio in without torch: files of every format libsndfile reads, resampled to 16 kHz mono, and
Whisper's log-mel features equal to transformers' ``WhisperFeatureExtractor``."""

from __future__ import annotations

import io

import numpy as np
import pytest

pytest.importorskip("soundfile")
pytest.importorskip("soxr")
import soundfile  # noqa: E402

from edgeattn.runtime.families.speech.audio import AudioError, as_mono, read_audio  # noqa: E402
from edgeattn.runtime.families.speech.log_mel import LogMel, mel_filter_bank  # noqa: E402

pytestmark = pytest.mark.quick


def _sound(seconds: float, rate: int = 16_000, seed: int = 0) -> np.ndarray:
    """A chirp with a tone and a little noise: a spectrum that moves, like speech's."""
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).standard_normal(t.size)
    return (0.3 * np.sin(2 * np.pi * (150 + 200 * t) * t) + 0.1 * np.sin(2 * np.pi * 1200 * t)
            + 0.02 * noise).astype(np.float32)  # fmt: skip


@pytest.mark.parametrize("n_mels", [80, 128])
def test_log_mel_features_equal_whisper_feature_extractors(n_mels):
    """Short, exactly-30-s and over-30-s clips (cut to one window), and long-form audio (every
    frame, as ``generate`` takes it): within 1e-4 of transformers' torch path and its numpy path."""
    transformers = pytest.importorskip("transformers")
    extractor = transformers.WhisperFeatureExtractor(feature_size=n_mels)
    features = LogMel(n_mels=n_mels)
    assert np.abs(features.filters - extractor.mel_filters.T).max() < 1e-7
    for seconds in (0.7, 7.3, 30.0, 41.0):
        clip = _sound(seconds, seed=int(seconds))
        want = extractor(clip, sampling_rate=16_000, return_tensors="np").input_features[0]
        got = features(clip)
        assert got.shape == want.shape == (n_mels, 3000) and got.dtype == np.float32
        assert np.abs(got - want).max() < 1e-4, seconds
        padded = np.pad(clip[:480_000], (0, max(0, 480_000 - clip.size)))
        by_numpy = extractor._np_extract_fbank_features(padded[None], "cpu")[0]
        assert np.abs(got - by_numpy).max() < 1e-4, seconds
    long = _sound(65.2, seed=3)
    want = extractor(long, sampling_rate=16_000, return_tensors="np", truncation=False,
                     padding="longest").input_features[0]  # fmt: skip
    got = features(long, pad_to_window=False)
    assert got.shape == want.shape and np.abs(got - want).max() < 1e-4


def test_settings_come_from_the_folders_preprocessor_config(tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.WhisperFeatureExtractor(feature_size=128, chunk_length=30).save_pretrained(tmp_path)
    read = LogMel.from_folder(tmp_path)
    assert read == LogMel(n_mels=128) and LogMel.from_dict(read.as_dict()) == read
    assert (read.window_samples, read.window_frames) == (480_000, 3000)
    with pytest.raises(Exception, match="dither"):
        LogMel.from_dict({**read.as_dict(), "dither": 1.0})
    with pytest.raises(Exception, match="only Whisper"):
        LogMel.from_dict({"feature_extractor_type": "Wav2Vec2FeatureExtractor"})
    with pytest.raises(Exception, match="> 0"):
        LogMel.from_dict({"feature_size": 0})
    assert mel_filter_bank(80, 400, 16_000).shape == (201, 80)


@pytest.mark.parametrize("fmt,subtype,rate", [("WAV", "PCM_16", 44_100), ("WAV", "FLOAT", 22_050),
                                              ("FLAC", "PCM_24", 48_000), ("OGG", "VORBIS", 44_100),
                                              ("OGG", "OPUS", 48_000), ("MP3", "MPEG_LAYER_III", 44_100)])  # fmt: skip
def test_files_of_every_format_read_as_16_khz_mono(tmp_path, fmt, subtype, rate):
    """Stereo files at other rates: their channels' mean at 16 kHz; lossless ones equal the
    samples resampled, lossy ones the same sound (length, features close)."""
    import soxr

    left, right = _sound(3.0, rate, seed=1), _sound(3.0, rate, seed=2)
    path = tmp_path / f"clip.{fmt.lower()}"
    soundfile.write(path, np.stack([left, right], axis=1), rate, format=fmt, subtype=subtype)
    got = read_audio(path)
    assert got.dtype == np.float32 and got.ndim == 1
    want = soxr.resample((left + right) / 2, rate, 16_000).astype(np.float32)
    if subtype in ("FLOAT", "PCM_16", "PCM_24"):
        assert got.shape == want.shape and np.abs(got - want).max() < 1e-3
    else:  # codecs shift and shape the sound a little: the same length and spectrum
        assert abs(got.size - want.size) < 0.05 * want.size
        features = LogMel()
        a, b = features(got).ravel(), features(want).ravel()
        assert np.dot(a - a.mean(), b - b.mean()) / (np.std(a) * np.std(b) * a.size) > 0.9
    assert np.array_equal(read_audio(path.read_bytes()), got)


def test_audio_that_is_not_sound_is_one_clear_error(tmp_path):
    (tmp_path / "notes.txt").write_text("not audio")
    with pytest.raises(AudioError, match="not audio libsndfile reads"):
        read_audio(tmp_path / "notes.txt")
    with pytest.raises(AudioError, match="not audio libsndfile reads"):
        read_audio(b"RIFF\x00\x00garbage")
    with pytest.raises(AudioError, match="not a file"):
        read_audio(tmp_path / "missing.wav")
    with pytest.raises(AudioError, match="no samples"):
        as_mono(np.zeros(0, np.float32), 16_000)
    with pytest.raises(AudioError, match="not finite"):
        as_mono(np.array([0.0, np.nan, 0.1], np.float32), 16_000)
    with pytest.raises(AudioError, match="shape"):
        as_mono(np.zeros((2, 2, 2), np.float32), 16_000)
    pcm = (np.array([0.5, -0.5]) * 32768).astype(np.int16)  # integers: to [-1, 1]
    assert np.allclose(as_mono(pcm, 16_000), [0.5, -0.5])
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros((160, 2), np.float32), 16_000, format="WAV")
    assert read_audio(buffer.getvalue()).shape == (160,)


def test_audio_and_features_need_no_torch():
    from tests.helpers.torch_free import run_without_torch

    run_without_torch("import numpy as np\nfrom edgeattn.runtime.families.speech.audio import as_mono\n"
                      "from edgeattn.runtime.families.speech.log_mel import LogMel\n"
                      "f = LogMel()(as_mono(np.ones((44100, 2), np.float32) * 0.1, 44100))\n"
                      "assert f.shape == (80, 3000)\n")  # fmt: skip
