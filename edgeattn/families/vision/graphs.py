"""The vision family's graphs as PyTorch modules whose flat tensor signatures are their specs': the
image encoder, and a text tower's encoder (CLIP)."""

from __future__ import annotations

from torch import Tensor, nn

from edgeattn.families.vision.model import VisionModel


class VisionEncoderGraph(nn.Module):
    """pixel_values -> last_hidden_state, pooler_output (and logits for a classifier)."""

    def __init__(self, model: VisionModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: Tensor) -> tuple[Tensor, ...]:
        return tuple(self.model.outputs(pixel_values).values())


class TextEncoderGraph(nn.Module):
    """input_ids, attention_mask -> last_hidden_state, pooler_output, text_embeds (CLIP's text tower)."""

    def __init__(self, model: VisionModel) -> None:
        super().__init__()
        assert model.text is not None, "a text encoder graph needs the model's text tower"
        self.text = model.text

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        return tuple(self.text.outputs(input_ids, attention_mask).values())
