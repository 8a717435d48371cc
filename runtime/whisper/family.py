"""The speech family's record: Whisper's graphs (an audio encoder, the encoder-decoder family's
cross keys/values and decoders), its task, and the classes that run it."""

from __future__ import annotations

from dataclasses import replace

from edgeattn.runtime.families import SEQ2SEQ_FAMILY, Family, GraphRole
from edgeattn.runtime.whisper.specs import AUDIO_ENCODER, audio_encoder_spec, audio_sizes, window_sizes

_WHISPER = "edgeattn.whisper"
_cross_kv, _decoder, _decoder_fixed = (SEQ2SEQ_FAMILY.role(n) for n in ("cross_kv", "decoder", "decoder_fixed"))

SPEECH_FAMILY = Family(
    "speech",
    "speech-to-text",
    (
        # no calibration or gate yet: its reduced precisions wait for a gate on held-out audio
        GraphRole(AUDIO_ENCODER, audio_encoder_spec, f"{_WHISPER}.graphs:AudioEncoderGraph", audio_sizes, None, None,
                  lambda c: c.n_encoder_layers, once_per_source=True),
        replace(_cross_kv, sizes=window_sizes, calibration=None, gate=None),
        replace(_decoder, calibration=None, gate=None, needs=(AUDIO_ENCODER, "cross_kv")),
        replace(_decoder_fixed, calibration=None, gate=None),
    ),
    tasks={"transcribe": (AUDIO_ENCODER, "cross_kv", "decoder")},
    model=f"{_WHISPER}.model:WhisperModel",
    runtime="edgeattn.runtime.whisper.runtime:WhisperRuntime",
    generation=(AUDIO_ENCODER, "cross_kv", "decoder"),
    summary="speech to text (Whisper): audio in, its transcript or English translation out, with times",
    greedy_check=f"{_WHISPER}.verify:greedy_check",
    benched=False,
)  # fmt: skip

