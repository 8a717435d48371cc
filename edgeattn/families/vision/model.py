"""The vision family's PyTorch model: a vision transformer (ViT, DINOv2) over image patches."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgeattn.config import ModelConfig
from edgeattn.model import Encoder, TransformerModel


def antialiased_bicubic(size: int, out: int | Tensor) -> Tensor:
    """(out, size): the weights PyTorch's antialiased bicubic resize (``antialias=True``, Pillow's
    filter: a = -0.5, widened by the scale where it shrinks) gives each input row of each output row."""
    out_t = torch.as_tensor(out).to(torch.float32)
    scale = size / out_t
    support = 2.0 * torch.clamp(scale, min=1.0)
    inverse = 1.0 / torch.clamp(scale, min=1.0)
    centre = scale * (torch.arange(out_t.to(torch.int64), dtype=torch.float32) + 0.5)  # (out,)
    inputs = torch.arange(size, dtype=torch.float32)
    first = torch.clamp(torch.floor(centre - support + 0.5), min=0.0)
    last = torch.clamp(torch.floor(centre + support + 0.5), max=float(size))
    x = ((inputs[None, :] - centre[:, None] + 0.5) * inverse[None]).abs()
    a = -0.5
    weight = torch.where(x < 1.0, ((a + 2) * x - (a + 3)) * x * x + 1,
                         torch.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, torch.zeros_like(x)))
    inside = (inputs[None, :] >= first[:, None]) & (inputs[None, :] < last[:, None])
    weight = torch.where(inside, weight, torch.zeros_like(weight))
    return weight / weight.sum(dim=1, keepdim=True)


class VisionModel(TransformerModel):
    """Patches of an image, a class token (and registers), a position table interpolated to the
    image's grid, pre-norm encoder layers (each residual branch scaled per channel where the config
    says), the final norm; the pooled embedding and optionally a classifier's logits."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        vision = config.section
        assert vision is not None, "a vision config has its vision section"
        d = config.d_model
        self.vision = vision
        self.embed = None  # an image model has no token table
        self.patch = nn.Conv2d(vision.channels, d, vision.patch_size, stride=vision.patch_size)
        self.cls_token = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.registers = nn.Parameter(torch.randn(1, vision.registers, d) * 0.02) if vision.registers else None
        self.position = nn.Parameter(torch.randn(1, 1 + vision.grid**2, d) * 0.02)
        self.encoder = Encoder(config)
        layers = config.n_encoder_layers
        self.layer_scale = nn.Parameter(torch.ones(layers, 2, d)) if vision.layer_scale else None
        self.pooler = nn.Linear(d, d) if vision.pooled == "pooler" else None
        width = 2 * d if vision.classifier == "cls+mean" else d
        self.classifier = nn.Linear(width, config.num_labels) if vision.classifier != "none" else None

    def positions(self, rows: int | Tensor, cols: int | Tensor) -> Tensor:
        """(1, 1 + rows * cols, d): the class token's position and the grid's, resized bicubically
        (``align_corners=False``) from the table's square grid to ``rows`` x ``cols`` patches."""
        d, side = self.config.d_model, self.vision.grid
        if self.vision.antialias:  # as two products with the filter's weights: exports at any opset
            grid = self.position[:, 1:].reshape(side, side, d)
            grid = torch.einsum("rs,sd->rd", antialiased_bicubic(side, rows), grid.reshape(side, -1))
            grid = torch.einsum("ct,rtd->rcd", antialiased_bicubic(side, cols), grid.reshape(-1, side, d))
            return torch.cat([self.position[:, :1], grid.reshape(1, -1, d)], dim=1)
        grid = self.position[:, 1:].reshape(1, side, side, d).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(rows, cols), mode="bicubic", align_corners=False)
        return torch.cat([self.position[:, :1], grid.permute(0, 2, 3, 1).reshape(1, -1, d)], dim=1)

    def encode(self, pixel_values: Tensor) -> Tensor:
        """(B, C, H, W) pixel values -> hidden states (B, 1 + registers + patches, d), normed."""
        patches = self.patch(pixel_values)  # (B, d, rows, cols)
        rows, cols = patches.shape[2], patches.shape[3]
        x = patches.flatten(2).transpose(1, 2)  # (B, rows * cols, d)
        batch = x.shape[0]
        x = torch.cat([self.cls_token.expand(batch, -1, -1), x], dim=1) + self.positions(rows, cols)
        if self.registers is not None:
            x = torch.cat([x[:, :1], self.registers.expand(batch, -1, -1), x[:, 1:]], dim=1)
        for i, layer in enumerate(self.encoder.layers):
            branch, _, _ = layer.self_attn(layer.norm1(x))
            x = x + (branch if self.layer_scale is None else branch * self.layer_scale[i, 0])
            branch = layer.ff(layer.norm2(x))
            x = x + (branch if self.layer_scale is None else branch * self.layer_scale[i, 1])
        return self.encoder.final_norm(x)

    def pool(self, hidden: Tensor) -> Tensor:
        """(B, N, d) -> (B, d): the class token, through the pooler where the model has one."""
        first = hidden[:, 0]
        return first if self.pooler is None else torch.tanh(self.pooler(first))

    def forward(self, pixel_values: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Hidden states (B, N, d), the pooled embedding (B, d), and the logits (B, labels) or None."""
        hidden = self.encode(pixel_values)
        logits = None
        if self.classifier is not None:
            first = hidden[:, 0]
            if self.vision.classifier == "cls+mean":
                first = torch.cat([first, hidden[:, self.vision.extra_tokens:].mean(dim=1)], dim=1)
            logits = self.classifier(first)
        return hidden, self.pool(hidden), logits
