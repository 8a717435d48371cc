"""The vision family's own section of a model config (torch-free): the image side of a vision
transformer, its patches, position grid, extra tokens and heads."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeattn.errors import ConfigError

if TYPE_CHECKING:
    from edgeattn.config import ModelConfig

#: what the pooled embedding is: the class token of the final norm's output ("cls": DINOv2, a ViT
#: without pooler), ViT's pooler (a dense layer and tanh over it), or a learned query attending
#: over every token ("map": SigLIP's attention-pooling head)
POOLED = ("cls", "pooler", "map")
#: what a classifier reads: the class token ("cls": ViT), or the class token beside the mean of the
#: patch tokens ("cls+mean": DINOv2)
CLASSIFIERS = ("none", "cls", "cls+mean")


#: where the final norm goes: over every hidden state ("all": ViT, DINOv2) or over the pooled class
#: token alone ("pooled": CLIP, whose last hidden states are the last layer's, unnormed)
FINAL_NORMS = ("all", "pooled")


@dataclass(frozen=True)
class TextTowerConfig:
    """A text tower beside the image encoder (CLIP's): a pre-norm causal transformer over token ids
    whose pooled state is the end token's (``eos_id``; -1: the highest id in the row, as CLIP's old
    configs find it)."""

    vocab_size: int
    d_model: int
    n_heads: int
    d_ff: int
    n_layers: int
    max_len: int = 77
    eos_id: int = -1
    norm_eps: float = 1e-5
    activation: str = "quick_gelu"
    causal: bool = True
    #: the state pooled: the end token's ("eos": CLIP) or the last position's ("last": SigLIP, whose
    #: texts are padded to ``max_len``)
    pool: str = "eos"
    #: the projection has a bias (SigLIP's head)
    head_bias: bool = False
    #: the id texts are padded with (to ``max_len`` where the pooled state is the last position's)
    pad_id: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"text tower {name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"text tower d_model {self.d_model} is not divisible by its {self.n_heads} heads")
        if not -1 <= self.eos_id < self.vocab_size:
            raise ConfigError(f"text tower eos_id {self.eos_id} is outside its vocabulary")
        if self.pool not in ("eos", "last"):
            raise ConfigError(f"text tower pool={self.pool!r} is not eos or last")


@dataclass(frozen=True)
class VisionConfig:
    """A vision transformer's image side. Its position table holds a square grid of
    ``image_size / patch_size`` patches a side, interpolated (bicubic, as transformers'
    ``interpolate_pos_encoding``) for images of other sizes; ``registers`` extra learned tokens
    follow the class token (DINOv2 with registers); ``layer_scale``: each residual branch is
    scaled per channel (DINOv2)."""

    image_size: int = 224
    patch_size: int = 16
    channels: int = 3
    registers: int = 0
    layer_scale: bool = False
    #: the position grid's bicubic resize filters a grid it shrinks (``antialias``: DINOv2 with registers)
    antialias: bool = False
    pooled: str = "cls"
    classifier: str = "none"
    #: a norm over the embeddings before the first layer (CLIP's ``pre_layrnorm``)
    embedding_norm: bool = False
    final_norm: str = "all"
    patch_bias: bool = True
    #: the width of the space images (and texts) are projected into (CLIP's ``image_embeds``); 0: none
    projection: int = 0
    #: the text tower (CLIP), or None for an image encoder alone
    text: TextTowerConfig | None = None
    #: the zero-shot scores' scale (CLIP's ``logit_scale.exp()``)
    logit_scale: float = 100.0
    #: the images' embeddings are their pooled output projected ("True": CLIP), or the pooled output
    #: itself (SigLIP, whose pooling head ends in the shared space)
    project_images: bool = True
    #: a class token before the patches (SigLIP has none)
    class_token: bool = True
    #: how zero-shot scores become probabilities: a softmax over the labels (CLIP) or a sigmoid of
    #: each (SigLIP, after adding ``logit_bias``)
    scores: str = "softmax"
    logit_bias: float = 0.0

    def __post_init__(self) -> None:
        for name in ("image_size", "patch_size", "channels"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"vision config {name} must be a positive integer, got {value!r}")
        if not isinstance(self.registers, int) or isinstance(self.registers, bool) or self.registers < 0:
            raise ConfigError(f"vision config registers must be a non-negative integer, got {self.registers!r}")
        if self.image_size < self.patch_size:
            raise ConfigError(f"vision config image_size {self.image_size} is smaller than a patch ({self.patch_size})")
        if self.pooled not in POOLED:
            raise ConfigError(f"vision config pooled={self.pooled!r} is not one of {', '.join(POOLED)}")
        if self.classifier not in CLASSIFIERS:
            raise ConfigError(f"vision config classifier={self.classifier!r} is not one of {', '.join(CLASSIFIERS)}")
        if self.final_norm not in FINAL_NORMS:
            raise ConfigError(f"vision config final_norm={self.final_norm!r} is not one of {', '.join(FINAL_NORMS)}")
        if isinstance(self.text, dict):
            object.__setattr__(self, "text", TextTowerConfig(**self.text))
        if self.scores not in ("softmax", "sigmoid"):
            raise ConfigError(f"vision config scores={self.scores!r} is not softmax or sigmoid")
        if not self.class_token and (self.registers or self.pooled != "map" or self.classifier != "none"):
            raise ConfigError("a vision config without a class token pools by attention (map), with no registers "
                              "or classifier")
        if self.text is not None and not self.projection:
            raise ConfigError("a vision config with a text tower projects both into one space: set projection")

    def check(self, config: ModelConfig) -> None:
        """A ConfigError where ``config`` cannot hold this section."""
        if config.n_encoder_layers < 1:
            raise ConfigError("config n_encoder_layers must be at least 1")
        if not config.norm_first:
            raise ConfigError("a vision transformer normalises before each block (norm_first)")

    @property
    def grid(self) -> int:
        """Patches a side of the position table's grid."""
        return self.image_size // self.patch_size

    @property
    def extra_tokens(self) -> int:
        """Tokens before the patches: the class token and the registers."""
        return int(self.class_token) + self.registers

    def tokens(self, height: int, width: int) -> int:
        """The sequence length of an image of ``height`` x ``width`` pixels."""
        return self.extra_tokens + (height // self.patch_size) * (width // self.patch_size)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> VisionConfig:
        """The section from a dictionary, refusing unknown keys by name."""
        from edgeattn.config import checked_section_data

        return cls(**checked_section_data(cls, data, "vision"))
