"""The vision family's graph as a PyTorch module whose flat tensor signature is its spec's."""

from __future__ import annotations

from torch import Tensor, nn

from edgeattn.families.vision.model import VisionModel


class VisionEncoderGraph(nn.Module):
    """pixel_values -> last_hidden_state, pooler_output (and logits for a classifier)."""

    def __init__(self, model: VisionModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: Tensor) -> tuple[Tensor, ...]:
        hidden, pooled, logits = self.model(pixel_values)
        return (hidden, pooled) if logits is None else (hidden, pooled, logits)
