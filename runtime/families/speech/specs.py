"""The speech family's own graph: log-mel features -> encoder states (torch-free); its decoder,
the encoder-decoder family's that also returns the alignment heads' cross-attention weights. Its
cross keys/values graphs are the encoder-decoder family's (:mod:`edgeattn.runtime.families.seq2seq.specs`)."""

from __future__ import annotations

from dataclasses import replace

from edgeattn.config import ModelConfig
from edgeattn.runtime.families.seq2seq.specs import decoder_spec
from edgeattn.runtime.specs import BATCH, SRC_LEN, TGT_LEN, GraphSpec, TensorSpec

#: the feature frames axis (twice the audio positions the encoder returns)
FRAMES = "frames"
FEATURES = "input_features"
#: the graph (an encoder of sound, not of tokens: its own name)
AUDIO_ENCODER = "audio_encoder"
#: the decoder's output of the alignment heads' cross-attention weights (B, heads, T, audio positions)
ALIGNMENT = "alignment"
#: the frames a verification case runs the encoder at when the window is longer: not the traced size
SHORT_FRAMES = 74


def audio_encoder_spec(config: ModelConfig) -> GraphSpec:
    assert config.section is not None, "a speech-to-text config has its speech section"
    return GraphSpec(
        AUDIO_ENCODER,
        f"log-mel features ({config.section.n_mels} bins, up to {config.section.frames} frames: one window) -> encoder "
        "states, one per two frames",
        (TensorSpec(FEATURES, "float32", (BATCH, config.section.n_mels, FRAMES)),),
        (TensorSpec("last_hidden_state", "float32", (BATCH, SRC_LEN, config.d_model)),),
    )


def speech_decoder_spec(config: ModelConfig) -> GraphSpec:
    """The encoder-decoder family's decoder step, and, where the config lists alignment heads,
    their cross-attention weights over the audio positions (word timestamps' evidence)."""
    assert config.section is not None, "a speech-to-text config has its speech section"
    spec = decoder_spec(config)
    heads = len(config.section.alignment_heads)
    if not heads:
        return spec
    weights = TensorSpec(ALIGNMENT, "float32", (BATCH, heads, TGT_LEN, SRC_LEN))
    described = f"{spec.description}, and the cross-attention weights of its {heads} alignment heads"
    return replace(spec, description=described, outputs=(*spec.outputs, weights))


def audio_sizes(config: ModelConfig) -> list[dict[str, int]]:
    """The encoder at a part of a window and a whole one, batch 1 and 3."""
    assert config.section is not None
    whole = config.section.frames
    short = min(SHORT_FRAMES, whole)
    return [{"batch": 1, FRAMES: short}, {"batch": 3, FRAMES: short + 2}, {"batch": 2, FRAMES: whole}]


def window_sizes(config: ModelConfig) -> list[dict[str, int]]:
    """A source of one window's audio positions (and part of one), batch 1 and 3."""
    assert config.section is not None
    positions = config.section.audio_positions
    return [{"batch": 1, SRC_LEN: min(37, positions)}, {"batch": 3, SRC_LEN: positions}]
