"""The vision family's record: a vision transformer's image encoder (ViT, DINOv2), its tasks
(an image's embedding, its labels) and the classes that run it."""

from __future__ import annotations

from edgeattn.runtime.families.vision.specs import (
    TEXT_ENCODER,
    VISION_ENCODER,
    has_text,
    image_sizes,
    text_encoder_spec,
    text_sizes,
    vision_encoder_spec,
)
from edgeattn.runtime.records import Family, GraphRole

_VISION = "edgeattn.families.vision"

#: int8 of the image encoder: dynamic (MatMulInteger, QAttention), its gate held to a least cosine
#: of 0.999 on the held-out images, so that the sensitive-node search keeps in float32 what a real
#: model needs (the real DINOv2-small: its attention); the text tower's: 8-bit weights in blocks of 32
#: (MatMulNBits). docs/vision.md has both forms' figures
_INT8_LIMITS = {"int8": {"cosine_min": 0.999}}

FAMILY = Family(
    "vision",
    "vision",
    (GraphRole(VISION_ENCODER, vision_encoder_spec, f"{_VISION}.graphs:VisionEncoderGraph", image_sizes,
               f"{_VISION}.gate:encoder_calibration", f"{_VISION}.gate:encoder_metrics", lambda c: c.n_encoder_layers,
               once_per_source=True, int8_form="dynamic"),
     GraphRole(TEXT_ENCODER, text_encoder_spec, f"{_VISION}.graphs:TextEncoderGraph", text_sizes,
               f"{_VISION}.gate:text_calibration", f"{_VISION}.gate:text_metrics", lambda c: c.section.text.n_layers,
               once_per_source=True, int8_form="blockwise", applies=has_text)),  # fmt: skip
    tasks={"image-feature-extraction": (VISION_ENCODER,), "image-classification": (VISION_ENCODER,),
           "zero-shot-image-classification": (VISION_ENCODER, TEXT_ENCODER)},
    model=f"{_VISION}.model:VisionModel",
    runtime="edgeattn.runtime.families.vision.runtime:VisionRuntime",
    summary="a vision transformer (ViT, DINOv2): an image's embedding or labels",
    importers=f"{_VISION}.hf:importers",
    config_section=f"{_VISION}.config:VisionConfig",
    run_hook="edgeattn.runtime.families.vision.cli:RUN",
    benched=False,
    limits=_INT8_LIMITS,
    api="embed",
    served="edgeattn.runtime.families.vision.served:IMAGES",
    api_embed="edgeattn.runtime.families.vision.served:embed_inputs",
    gate_reference=f"{_VISION}.gate:VisionReference",
    heldout_reader=f"{_VISION}.heldout:read_heldout",
    bundle_graphs=(VISION_ENCODER, TEXT_ENCODER),
    bundle_describer=f"{_VISION}.bundle:describe_vision",
    bundle_module="edgeattn.runtime.families.vision:vision.mjs",
    bundle_assets=("edgeattn.runtime.families.vision:images.mjs",),
    bundle_check=f"{_VISION}.bundle:check_vision_bundle",
    bundle_text=False,
    random_caveat="held-out images of random pixel values: they cannot show what photographs do (a real model's "
                  "embeddings of them); give --heldout with images",
)
