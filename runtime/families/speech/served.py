"""The speech family's served task (Triton and ``edgeattn serve``): audio files in, transcripts out.

A request sends ``audio`` (each row a file's bytes: WAV, FLAC, OGG or MP3) and, optionally, the
``language``, the ``task`` (``transcribe`` or ``translate``), ``timestamps``, ``word_timestamps``,
a ``prompt``, a ``temperature`` and ``num_beams``; it gets back each file's ``text``, its
``segments`` (a JSON list: start, end, text, and the words with their times where asked) and its
``language``. The export runs in the serving process (its features and decoding settings travel
with it). Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.serving.tasks import ServedTensor, each_alone, request_settings, strings


@dataclass(frozen=True)
class TranscribeTask:
    """Audio in, transcripts out."""

    name: str = "transcribe"
    #: the graphs' settings (log-mel features, decoding) live in the export: it is carried and run in process
    carries_export: bool = True
    #: for the repository's README: what a request sends, a value of its first input, and the
    #: packages the server's Python needs besides numpy, onnxruntime and tokenizers
    sends: str = ("`audio` (each row an audio file's bytes: WAV, FLAC, OGG or MP3) and, optionally, `language`, "
                  "`task` (transcribe or translate), `timestamps`, `word_timestamps`, `prompt`, `temperature` and "
                  "`num_beams`")  # fmt: skip
    example: str = 'open("talk.wav", "rb").read()'
    packages: tuple[str, ...] = ("soundfile", "soxr")
    inputs: tuple[ServedTensor, ...] = (
        ServedTensor("audio", "bytes", (1,)),
        ServedTensor("language", "bytes", (1,), True),
        ServedTensor("task", "bytes", (1,), True),
        ServedTensor("timestamps", "bool", (1,), True),
        ServedTensor("word_timestamps", "bool", (1,), True),
        ServedTensor("prompt", "bytes", (1,), True),
        ServedTensor("temperature", "float32", (1,), True),
        ServedTensor("num_beams", "int32", (1,), True),
    )

    def outputs(self, config: Any) -> tuple[ServedTensor, ...]:
        return (ServedTensor("text", "bytes", (1,)), ServedTensor("segments", "bytes", (1,)),
                ServedTensor("language", "bytes", (1,)))  # fmt: skip

    def answer(self, model: Any, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray] | Exception]:
        """Each request's transcripts, one row a file (or the error that request alone caused)."""
        return each_alone(lambda request: self._one(model, request), requests)

    def _one(self, model: Any, request: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if "audio" not in request:
            raise EdgeattnError("the request has no 'audio' input (each row an audio file's bytes)")
        files = list(np.asarray(request["audio"], dtype=object).reshape(-1))
        if not files:
            raise EdgeattnError("the request's 'audio' input is empty")
        if not all(isinstance(f, bytes | np.bytes_) for f in files):
            raise EdgeattnError("'audio' holds each file's bytes (BYTES), not text or numbers")
        files = [bytes(f) for f in files]
        options = request_settings(request, self.inputs[1:])
        options.setdefault("language", None)
        if options.get("language") == "":
            options["language"] = None
        heard = model.transcribe_batch(files, **options)  # their windows decoded together
        segments = [json.dumps([_segment(s) for s in h.segments], ensure_ascii=False) for h in heard]
        return {"text": strings([h.text.strip() for h in heard]), "segments": strings(segments),
                "language": strings([h.language or "" for h in heard])}  # fmt: skip


def _segment(segment: Any) -> dict[str, Any]:
    found = {"start": segment.start, "end": segment.end, "text": segment.text, "tokens": list(segment.tokens)}
    if segment.words is not None:
        found["words"] = [{"word": w.word, "start": w.start, "end": w.end, "probability": w.probability}
                          for w in segment.words]  # fmt: skip
    return found


TRANSCRIBE = TranscribeTask()
