"""The speech family's own graph module: a window's log-mel features -> encoder states (the cross
keys/values and decoder graphs are the encoder-decoder family's, :mod:`edgeattn.exporters.graphs`)."""

from __future__ import annotations

from torch import Tensor, nn

from edgeattn.whisper.model import WhisperModel


class AudioEncoderGraph(nn.Module):
    """input_features (B, n_mels, frames) -> last_hidden_state (B, frames / 2, d)."""

    def __init__(self, model: WhisperModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_features: Tensor) -> Tensor:
        return self.model.encode(input_features)
