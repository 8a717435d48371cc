"""``/v1/audio/transcriptions`` and ``/v1/audio/translations`` through a real server on loopback and
the official ``openai`` client: a multipart upload answered in every response format, equal to
the runtime's own transcript; OpenAI's errors for what is not served."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from click.testing import CliRunner

from tests.helpers.speech_folders import audio, speech_folder

openai = pytest.importorskip("openai")
soundfile = pytest.importorskip("soundfile")
pytest.importorskip("transformers")
pytest.importorskip("aiohttp")
from edgeattn.cli import cli  # noqa: E402
from edgeattn.runtime import load  # noqa: E402
from edgeattn.serving.openai_api import ApiThread, OpenAIApi, served_models  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("openai-audio")
    folder = speech_folder(root / "folder")
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(root / "whisper-test"),
                                      "--no-verify"])  # fmt: skip
    assert result.exit_code == 0, result.output
    api = OpenAIApi(served_models([root / "whisper-test"], max_rows=2), api_key="sesame")
    with ApiThread(api) as running:
        yield running, root / "whisper-test"


def _wav(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, 16_000, format="WAV")
    return buffer.getvalue()


def test_transcriptions_in_every_format(server):
    running, export = server
    client = openai.OpenAI(base_url=running.url, api_key="sesame")
    samples = audio(1.4, seed=21)
    wav = _wav(samples)
    model = load(export)
    want = model.transcribe(samples, language="fr", timestamps=True)
    plain = model.transcribe(samples, language="fr")
    heard = client.audio.transcriptions.create(model="whisper-test", file=("clip.wav", wav), language="fr")
    assert heard.text == plain.text.strip()
    text = client.audio.transcriptions.create(model="whisper-test", file=("clip.wav", wav), language="fr",
                                              response_format="text")  # fmt: skip
    assert text.strip() == plain.text.strip()
    verbose = client.audio.transcriptions.create(model="whisper-test", file=("clip.wav", wav), language="fr",
                                                 response_format="verbose_json")  # fmt: skip
    assert verbose.language == "fr" and verbose.duration == pytest.approx(1.4)
    assert [(s.start, s.end, s.tokens) for s in verbose.segments] == [(s.start, s.end, list(s.tokens))
                                                                      for s in want.segments]  # fmt: skip
    assert all(s.avg_logprob < 0 and s.compression_ratio > 0 and s.temperature == 0 for s in verbose.segments)
    worded = client.audio.transcriptions.create(model="whisper-test", file=("clip.wav", wav), language="fr",
                                                response_format="verbose_json",
                                                timestamp_granularities=["word"])  # fmt: skip
    words = [w for s in model.transcribe(samples, language="fr", word_timestamps=True).segments for w in s.words]
    assert [(w.word, w.start, w.end) for w in worded.words] == [(w.word.strip(), w.start, w.end) for w in words]
    assert worded.words and not worded.segments
    both = client.audio.transcriptions.create(model="whisper-test", file=("clip.wav", wav), language="fr",
                                              response_format="verbose_json",
                                              timestamp_granularities=["word", "segment"])  # fmt: skip
    assert both.words and [s.tokens for s in both.segments] == [list(s.tokens) for s in want.segments]
    prompted = client.audio.transcriptions.create(model="whisper-test", file=("clip.wav", wav), language="fr",
                                                  response_format="verbose_json", prompt="w5 w17 w300")  # fmt: skip
    after = model.transcribe(samples, language="fr", timestamps=True, prompt="w5 w17 w300")
    assert [s.tokens for s in prompted.segments] == [list(s.tokens) for s in after.segments]
    sampled = client.audio.transcriptions.create(model="whisper-test", file=("clip.wav", wav), language="fr",
                                                 response_format="verbose_json", temperature=0.8)  # fmt: skip
    assert sampled.segments and {s.temperature for s in sampled.segments} == {0.8}
    srt = client.audio.transcriptions.create(model="whisper-test", file=("clip.wav", wav), language="fr",
                                             response_format="srt")  # fmt: skip
    assert srt.startswith("1\n00:00:0") and want.segments[0].text.strip() in srt
    vtt = client.audio.transcriptions.create(model="whisper-test", file=("clip.wav", wav), language="fr",
                                             response_format="vtt")  # fmt: skip
    assert vtt.startswith("WEBVTT")
    english = client.audio.translations.create(model="whisper-test", file=("clip.wav", wav))
    assert english.text == model.transcribe(samples, task="translate").text.strip()


def test_audio_errors_are_openai_errors(server):
    import urllib.request

    running, _ = server
    client = openai.OpenAI(base_url=running.url, api_key="sesame")
    wav = _wav(audio(0.5, seed=3))
    with pytest.raises(openai.NotFoundError):
        client.audio.transcriptions.create(model="nope", file=("a.wav", wav))
    with pytest.raises(openai.BadRequestError, match="need response_format verbose_json"):
        client.audio.transcriptions.create(model="whisper-test", file=("a.wav", wav), timestamp_granularities=["word"])
    with pytest.raises(openai.BadRequestError, match="word and segment, not letter"):
        client.audio.transcriptions.create(model="whisper-test", file=("a.wav", wav), response_format="verbose_json",
                                           timestamp_granularities=["letter"])  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="temperature is from 0"):
        client.audio.transcriptions.create(model="whisper-test", file=("a.wav", wav), temperature=1.5)
    with pytest.raises(openai.BadRequestError, match="not audio"):
        client.audio.transcriptions.create(model="whisper-test", file=("a.wav", b"plain words"))
    with pytest.raises(openai.BadRequestError, match="no language 'xx'"):
        client.audio.transcriptions.create(model="whisper-test", file=("a.wav", wav), language="xx")
    with pytest.raises(openai.BadRequestError, match="transcribes speech"):
        client.embeddings.create(model="whisper-test", input="hello")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=running.url, api_key="wrong").audio.transcriptions.create(
            model="whisper-test", file=("a.wav", wav))
    request = urllib.request.Request(running.url + "/audio/transcriptions", data=json.dumps({"model": "x"}).encode(),
                                     headers={"Authorization": "Bearer sesame", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request)
    assert raised.value.code == 400 and "multipart" in json.loads(raised.value.read())["error"]["message"]
