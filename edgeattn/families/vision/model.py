"""The vision family's PyTorch model: a vision transformer (ViT, DINOv2) over image patches."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgeattn.attention import padding_mask
from edgeattn.config import ModelConfig
from edgeattn.families.vision.config import TextTowerConfig
from edgeattn.layers import _activate, make_norm
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
        self.patch = nn.Conv2d(vision.channels, d, vision.patch_size, stride=vision.patch_size, bias=vision.patch_bias)
        self.cls_token = nn.Parameter(torch.randn(1, 1, d) * 0.02) if vision.class_token else None
        self.registers = nn.Parameter(torch.randn(1, vision.registers, d) * 0.02) if vision.registers else None
        self.position = nn.Parameter(torch.randn(1, int(vision.class_token) + vision.grid**2, d) * 0.02)
        self.embedding_norm = make_norm(config) if vision.embedding_norm else None
        self.encoder = Encoder(config)
        layers = config.n_encoder_layers
        self.layer_scale = nn.Parameter(torch.ones(layers, 2, d)) if vision.layer_scale else None
        self.pooler = nn.Linear(d, d) if vision.pooled == "pooler" else None
        self.attention_pool = AttentionPool(config) if vision.pooled == "map" else None
        width = 2 * d if vision.classifier == "cls+mean" else d
        self.classifier = nn.Linear(width, config.num_labels) if vision.classifier != "none" else None
        projects = vision.projection and vision.project_images
        self.projection = nn.Linear(d, vision.projection, bias=False) if projects else None
        self.text = TextTower(vision.text, vision.projection) if vision.text is not None else None

    def positions(self, rows: int | Tensor, cols: int | Tensor) -> Tensor:
        """(1, 1 + rows * cols, d): the class token's position and the grid's, resized bicubically
        (``align_corners=False``) from the table's square grid to ``rows`` x ``cols`` patches."""
        d, side, first = self.config.d_model, self.vision.grid, int(self.vision.class_token)
        if self.vision.antialias:  # as two products with the filter's weights: exports at any opset
            grid = self.position[:, first:].reshape(side, side, d)
            grid = torch.einsum("rs,sd->rd", antialiased_bicubic(side, rows), grid.reshape(side, -1))
            grid = torch.einsum("ct,rtd->rcd", antialiased_bicubic(side, cols), grid.reshape(-1, side, d))
            grid = grid.reshape(1, -1, d)
        else:
            grid = self.position[:, first:].reshape(1, side, side, d).permute(0, 3, 1, 2)
            grid = F.interpolate(grid, size=(rows, cols), mode="bicubic", align_corners=False)
            grid = grid.permute(0, 2, 3, 1).reshape(1, -1, d)
        return torch.cat([self.position[:, :1], grid], dim=1) if first else grid

    def encode(self, pixel_values: Tensor) -> Tensor:
        """(B, C, H, W) pixel values -> hidden states (B, 1 + registers + patches, d), normed."""
        patches = self.patch(pixel_values)  # (B, d, rows, cols)
        rows, cols = patches.shape[2], patches.shape[3]
        x = patches.flatten(2).transpose(1, 2)  # (B, rows * cols, d)
        batch = x.shape[0]
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(batch, -1, -1), x], dim=1)
        x = x + self.positions(rows, cols)
        if self.registers is not None:
            x = torch.cat([x[:, :1], self.registers.expand(batch, -1, -1), x[:, 1:]], dim=1)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        for i, layer in enumerate(self.encoder.layers):
            branch, _, _ = layer.self_attn(layer.norm1(x))
            x = x + (branch if self.layer_scale is None else branch * self.layer_scale[i, 0])
            branch = layer.ff(layer.norm2(x))
            x = x + (branch if self.layer_scale is None else branch * self.layer_scale[i, 1])
        return self.encoder.final_norm(x) if self.vision.final_norm == "all" else x

    def pool(self, hidden: Tensor) -> Tensor:
        """(B, N, d) -> (B, d): the class token, normed where the final norm is the pooled token's
        alone, through the pooler where the model has one."""
        if self.attention_pool is not None:
            return self.attention_pool(hidden)
        first = hidden[:, 0]
        if self.vision.final_norm == "pooled":
            first = self.encoder.final_norm(first)
        return first if self.pooler is None else torch.tanh(self.pooler(first))

    def outputs(self, pixel_values: Tensor) -> dict[str, Tensor]:
        """The image encoder's outputs by their graph names: ``last_hidden_state`` (B, N, d),
        ``pooler_output`` (B, d), and ``image_embeds`` (B, projection) or ``logits`` (B, labels)
        where the model has them."""
        hidden = self.encode(pixel_values)
        pooled = self.pool(hidden)
        out = {"last_hidden_state": hidden, "pooler_output": pooled}
        if self.projection is not None:
            out["image_embeds"] = self.projection(pooled)
        elif self.vision.projection:  # the pooled output is already in the shared space (SigLIP)
            out["image_embeds"] = pooled
        if self.classifier is not None:
            first = hidden[:, 0]
            if self.vision.classifier == "cls+mean":
                first = torch.cat([first, hidden[:, self.vision.extra_tokens:].mean(dim=1)], dim=1)
            out["logits"] = self.classifier(first)
        return out

    def forward(self, pixel_values: Tensor) -> tuple[Tensor, ...]:
        """:meth:`outputs` in the graph's order."""
        return tuple(self.outputs(pixel_values).values())


class TextTower(nn.Module):
    """A text tower beside an image encoder (CLIP's): token and position embeddings, pre-norm layers
    under a causal mask and the padding mask, the final norm, the end token's state projected into
    the space the images are projected into."""

    def __init__(self, text: TextTowerConfig, projection: int) -> None:
        super().__init__()
        self.text = text
        self.config = ModelConfig(
            architecture="encoder", vocab_size=text.vocab_size, d_model=text.d_model, n_heads=text.n_heads,
            d_ff=text.d_ff, n_encoder_layers=text.n_layers, n_decoder_layers=0, max_len=text.max_len, dropout=0.0,
            activation=text.activation, norm="layernorm", norm_eps=text.norm_eps, norm_first=True, position="none",
            scale_embedding=False, embedding_norm=False, tie_embeddings=False, pad_id=0, bos_id=0, eos_id=0,
        )  # fmt: skip
        self.embed = nn.Embedding(text.vocab_size, text.d_model)
        self.position = nn.Parameter(torch.randn(text.max_len, text.d_model) * 0.01)
        self.encoder = Encoder(self.config)
        for layer in self.encoder.layers:  # each block masks what follows its queries itself (and fused)
            layer.self_attn.causal = text.causal
        self.projection = nn.Linear(text.d_model, projection, bias=text.head_bias)

    def outputs(self, input_ids: Tensor, attention_mask: Tensor) -> dict[str, Tensor]:
        """``last_hidden_state`` (B, T, d), ``pooler_output`` (B, d: the end token's state) and
        ``text_embeds`` (B, projection) of (B, T) token ids and their mask."""
        length = input_ids.shape[1]
        x = self.embed(input_ids) + self.position[:length]
        mask = padding_mask(attention_mask)
        for layer in self.encoder.layers:
            x, _ = layer(x, mask)
        hidden = self.encoder.final_norm(x)
        if self.text.pool == "last":
            pooled = hidden[:, -1]
        else:
            ids = input_ids.to(torch.int32)
            end = ids.argmax(dim=-1) if self.text.eos_id < 0 else \
                (ids == self.text.eos_id).to(torch.int32).argmax(dim=-1)  # fmt: skip
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), end]
        return {"last_hidden_state": hidden, "pooler_output": pooled, "text_embeds": self.projection(pooled)}


class AttentionPool(nn.Module):
    """SigLIP's attention-pooling head: a learned query attends over every token (one multi-head
    attention), then a residual feed-forward over its normed result."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.n_heads, self.activation = config.n_heads, config.activation
        self.probe = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.in_proj = nn.Linear(d, 3 * d)
        self.out_proj = nn.Linear(d, d)
        self.norm = make_norm(config)
        self.fc1 = nn.Linear(d, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, d)

    def forward(self, hidden: Tensor) -> Tensor:
        """(B, N, d) -> (B, d)."""
        batch, d = hidden.shape[0], hidden.shape[2]
        heads = self.n_heads
        wq, wk, wv = self.in_proj.weight.chunk(3)
        bq, bk, bv = self.in_proj.bias.chunk(3)
        q = F.linear(self.probe, wq, bq).reshape(1, 1, heads, -1).transpose(1, 2)  # (1, H, 1, D)
        k = F.linear(hidden, wk, bk).reshape(batch, -1, heads, q.shape[-1]).transpose(1, 2)  # (B, H, N, D)
        v = F.linear(hidden, wv, bv).reshape(batch, -1, heads, q.shape[-1]).transpose(1, 2)
        weights = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)  # (B, H, 1, N)
        x = self.out_proj((weights @ v).transpose(1, 2).reshape(batch, 1, d))
        x = x + self.fc2(_activate(self.fc1(self.norm(x)), self.activation))
        return x[:, 0]
