"""The speech family's record: Whisper's graphs (an audio encoder, the encoder-decoder family's
cross keys/values and decoders), its task, and the classes that run it."""

from __future__ import annotations

from dataclasses import replace

from edgeattn.runtime.families.seq2seq.record import CROSS_KV, DECODER, DECODER_FIXED
from edgeattn.runtime.families.speech.specs import AUDIO_ENCODER, audio_encoder_spec, audio_sizes, window_sizes
from edgeattn.runtime.families.speech.specs import speech_decoder_spec as decoder_spec
from edgeattn.runtime.records import Family, GraphRole

_WHISPER = "edgeattn.families.speech"
_GATE = f"{_WHISPER}.gate"
_cross_kv, _decoder, _decoder_fixed = CROSS_KV, DECODER, DECODER_FIXED
#: int4: the decoders' products fitted by GPTQ on the held-out speech, their output layer (and the table
#: tied to it) at 8 bits; the audio encoder and cross keys/values stay 8-bit (4 bits lose them)
_INT4 = {"int4_method": "gptq", "fitter": f"{_WHISPER}.fit:fit_whisper", "int8_activations": True}

FAMILY = Family(
    "speech",
    "speech-to-text",
    (
        GraphRole(AUDIO_ENCODER, audio_encoder_spec, f"{_WHISPER}.graphs:AudioEncoderGraph", audio_sizes,
                  f"{_GATE}:encoder_calibration", f"{_GATE}:encoder_metrics", lambda c: c.n_encoder_layers,
                  once_per_source=True, int8_form="blockwise", separate_projections=True, int4_bits=8),
        replace(_cross_kv, sizes=window_sizes, calibration=f"{_GATE}:cross_kv_calibration", int8_form="blockwise",
                int4_bits=8),
        replace(_decoder, spec=decoder_spec, module=f"{_WHISPER}.graphs:SpeechDecoderGraph",
                needs=(AUDIO_ENCODER, "cross_kv"), calibration=f"{_GATE}:decoder_calibration", int8_form="blockwise",
                int4_head_bits=8, **_INT4),
        replace(_decoder_fixed, calibration=f"{_GATE}:decoder_calibration", int8_form="blockwise", int4_head_bits=8,
                **_INT4),
    ),
    tasks={"transcribe": (AUDIO_ENCODER, "cross_kv", "decoder")},
    model=f"{_WHISPER}.model:WhisperModel",
    runtime="edgeattn.runtime.families.speech.runtime:WhisperRuntime",
    generation=(AUDIO_ENCODER, "cross_kv", "decoder"),
    summary="speech to text (Whisper): audio in, its transcript or English translation out, with times",
    greedy_check=f"{_WHISPER}.verify:greedy_check",
    benched=False,
    limits={"int8": {"exact_match": 0.0, "tokens_kept": 0.85, "words_kept": 0.85},
            "int8-static": {"exact_match": 0.0, "tokens_kept": 0.85, "words_kept": 0.85},
            "int4": {"exact_match": 0.0, "teacher_top1": 0.85, "tokens_kept": 0.7, "words_kept": 0.7},
            "fp16": {"exact_match": 0.0, "tokens_kept": 0.95, "words_kept": 0.95}},
    gate_reference=f"{_GATE}:SpeechReference",
    heldout_reader=f"{_WHISPER}.heldout:read_heldout",
    fit_source=f"{_WHISPER}.fit:fit_source",
    random_caveat="held-out windows of random log-mel features: they cannot show what speech does (a real "
                  "model's transcripts of it); give --heldout with audio",
    generation_gate=f"{_GATE}:generation_metrics",
    served="edgeattn.runtime.families.speech.served:TRANSCRIBE",
    bundle_graphs=(AUDIO_ENCODER, _cross_kv.name, _decoder_fixed.name),
    bundle_describer=f"{_WHISPER}.bundle:describe_speech",
    importers=f"{_WHISPER}.hf:importers",
    bundle_module="edgeattn.runtime.families.speech:speech.mjs",
    bundle_check=f"{_WHISPER}.bundle:check_speech_bundle",
    config_section=f"{_WHISPER}.config:SpeechConfig",
    encoder_decoder=True,
    run_hook="edgeattn.runtime.families.speech.cli:RUN",
    api="transcribe",
)  # fmt: skip

