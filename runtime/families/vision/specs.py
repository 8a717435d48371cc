"""The vision family's graph: pixel values in, the encoder's hidden states, the pooled embedding
and (with a classifier) its logits out (torch-free)."""

from __future__ import annotations

from edgeattn.config import ModelConfig
from edgeattn.runtime.specs import BATCH, SRC_LEN, GraphSpec, TensorSpec

#: the graph (an encoder of images: its own name)
VISION_ENCODER = "vision_encoder"
#: a text tower's graph (CLIP)
TEXT_ENCODER = "text_encoder"
PIXELS = "pixel_values"
HEIGHT, WIDTH, TOKENS = "height", "width", "tokens"


def vision_encoder_spec(config: ModelConfig) -> GraphSpec:
    vision = config.section
    assert vision is not None, "a vision config has its vision section"
    d = config.d_model
    outputs = [TensorSpec("last_hidden_state", "float32", (BATCH, TOKENS, d)),
               TensorSpec("pooler_output", "float32", (BATCH, d))]  # fmt: skip
    if vision.projection:
        outputs.append(TensorSpec("image_embeds", "float32", (BATCH, vision.projection)))
    if vision.classifier != "none":
        outputs.append(TensorSpec("logits", "float32", (BATCH, config.num_labels)))
    return GraphSpec(
        VISION_ENCODER,
        f"pixel values ({vision.channels} channels, any height and width of at least a {vision.patch_size}-pixel "
        "patch) -> hidden states (the class token, " + (f"{vision.registers} registers, " if vision.registers else "")
        + "one a patch), the pooled embedding" + (" and its projection" if vision.projection else "")
        + (" and classification logits" if vision.classifier != "none" else ""),
        (TensorSpec(PIXELS, "float32", (BATCH, vision.channels, HEIGHT, WIDTH)),),
        tuple(outputs),
    )


def text_encoder_spec(config: ModelConfig) -> GraphSpec:
    vision = config.section
    assert vision is not None and vision.text is not None, "a text encoder needs the vision config's text tower"
    text = vision.text
    return GraphSpec(
        TEXT_ENCODER,
        f"token ids + attention mask (up to {text.max_len}) -> the text tower's hidden states, its pooled (end "
        "token's) state and its projection into the space images are projected into",
        (TensorSpec("input_ids", "int64", (BATCH, SRC_LEN)), TensorSpec("attention_mask", "int64", (BATCH, SRC_LEN))),
        (TensorSpec("last_hidden_state", "float32", (BATCH, SRC_LEN, text.d_model)),
         TensorSpec("pooler_output", "float32", (BATCH, text.d_model)),
         TensorSpec("text_embeds", "float32", (BATCH, vision.projection))),
    )  # fmt: skip


def has_text(config: ModelConfig) -> bool:
    """Whether the model has a text tower (CLIP)."""
    return config.section is not None and config.section.text is not None


def text_sizes(config: ModelConfig) -> list[dict[str, int]]:
    """Texts of 1, 5 and the tower's longest tokens, batch 1 to 3."""
    longest = config.section.text.max_len
    return [{BATCH: 1, SRC_LEN: 1}, {BATCH: 3, SRC_LEN: min(5, longest)}, {BATCH: 3, SRC_LEN: longest}]


def image_sizes(config: ModelConfig) -> list[dict[str, int]]:
    """The encoder at its own image size, and at sizes whose grids differ from its position table's
    (taller, wider, a size that is no multiple of a patch), batch 1 to 3."""
    vision = config.section
    assert vision is not None
    p, side = vision.patch_size, vision.image_size
    return [{BATCH: 1, HEIGHT: side, WIDTH: side}, {BATCH: 3, HEIGHT: 2 * p + 3, WIDTH: 3 * p},
            {BATCH: 2, HEIGHT: side + p, WIDTH: max(p, side - 2 * p) + 1}]  # fmt: skip
