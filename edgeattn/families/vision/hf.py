"""The vision family's Hugging Face import: ViT (``ViTModel``, ``ViTForImageClassification``) and
DINOv2 (``Dinov2Model``, ``Dinov2ForImageClassification``, and DINOv2 with registers) become an
edgeattn :class:`~edgeattn.families.vision.model.VisionModel`; every tensor lands on exactly one
parameter with its shape asserted, and ``preprocessor_config.json`` becomes the export's image
preprocessing.

Facts the mapping encodes: both are pre-norm encoders with exact GELU and biased projections; a
ViT's pooled output is its pooler (a dense layer and tanh over the class token) where the folder
has one, DINOv2's the class token after the final norm; ViT's classifier reads the class token,
DINOv2's the class token beside the mean of the patch tokens; DINOv2 scales each residual branch
per channel (``layer_scale1/2.lambda1``); registers follow the class token and take no position.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from edgeattn.config import ModelConfig
from edgeattn.errors import CheckpointError, ConfigError
from edgeattn.families.vision.config import VisionConfig
from edgeattn.families.vision.model import VisionModel
from edgeattn.model import build_model
from edgeattn.runtime.families.vision.images import ImagePreprocessing
from edgeattn.weight_file import parameters_on_meta
from edgeattn.weights import load_state

if TYPE_CHECKING:
    from edgeattn.hf import HFModel, Importer

log = logging.getLogger(__name__)

#: the tasks of the family's exports (named as transformers' pipelines name them)
EMBED, CLASSIFY, ZERO_SHOT = "image-feature-extraction", "image-classification", "zero-shot-image-classification"
PREPROCESSOR_CONFIG = "preprocessor_config.json"

#: (architecture, layout, task, the model_type values it accepts)
_ARCHITECTURES = (
    ("ViTModel", "vit", EMBED, ("vit",)),
    ("ViTForImageClassification", "vit", CLASSIFY, ("vit",)),
    ("Dinov2Model", "dinov2", EMBED, ("dinov2",)),
    ("Dinov2ForImageClassification", "dinov2", CLASSIFY, ("dinov2",)),
    ("Dinov2WithRegistersModel", "dinov2", EMBED, ("dinov2_with_registers",)),
    ("Dinov2WithRegistersForImageClassification", "dinov2", CLASSIFY, ("dinov2_with_registers",)),
    ("CLIPModel", "clip", ZERO_SHOT, ("clip",)),
    ("SiglipModel", "siglip", ZERO_SHOT, ("siglip",)),
)


def importers() -> list[Importer]:
    """The vision family's architectures: ViT and DINOv2 (with registers), bare or classifying."""
    from edgeattn.hf import Importer

    return [Importer(name, "vision", layout, task, _import_vision, vision_reference, types)
            for name, layout, task, types in _ARCHITECTURES]  # fmt: skip


def reference_pixels(model: VisionModel, rows: int) -> torch.Tensor:
    """Seeded pixel values at a size other than the model's own (the position table interpolated)."""
    vision = model.config.section
    side = vision.image_size + vision.patch_size
    generator = torch.Generator().manual_seed(0)
    return torch.randn(rows, vision.channels, side, side - 2 * vision.patch_size, generator=generator)


def vision_reference(model: VisionModel, reference: Any, ids: torch.Tensor, mask: torch.Tensor
                     ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """Hidden states, the pooled output (and logits) of seeded pixel values at a size whose grid
    differs from the position table's, beside transformers' (its ``interpolate_pos_encoding``)."""
    pixels = reference_pixels(model, ids.shape[0])
    ours = model.outputs(pixels)
    if model.text is not None:  # CLIP: both towers, the embeddings normalised as CLIPModel returns them
        ids, mask = ids[:, :model.text.text.max_len], mask[:, :model.text.text.max_len]
        text = model.text.outputs(ids, mask)
        theirs = reference(input_ids=ids, attention_mask=mask, pixel_values=pixels, interpolate_pos_encoding=True)
        vision = theirs.vision_model_output
        return {"hidden states": (ours["last_hidden_state"], vision.last_hidden_state),
                "pooled output": (ours["pooler_output"], vision.pooler_output),
                "image embeddings": (_unit(ours["image_embeds"]), theirs.image_embeds),
                "text hidden states": (text["last_hidden_state"], theirs.text_model_output.last_hidden_state),
                "text embeddings": (_unit(text["text_embeds"]), theirs.text_embeds)}  # fmt: skip
    kwargs: dict[str, Any] = {"pixel_values": pixels, "output_hidden_states": True}
    if not model.config.section.layer_scale:  # a ViT resizes its table only when asked (DINOv2 always does)
        kwargs["interpolate_pos_encoding"] = True
    theirs = reference(**kwargs)
    out = {}
    if getattr(theirs, "last_hidden_state", None) is not None:
        out["hidden states"] = (ours["last_hidden_state"], theirs.last_hidden_state)
    if getattr(theirs, "pooler_output", None) is not None:
        out["pooled output"] = (ours["pooler_output"], theirs.pooler_output)
    if "logits" in ours and getattr(theirs, "logits", None) is not None:
        out["logits"] = (ours["logits"], theirs.logits)
    return out


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def map_config(hf: dict[str, Any], layout: str, task: str, labels: list[str] | None, pooler: bool,
               registers: int, path: Path) -> ModelConfig:  # fmt: skip
    """The edgeattn config of a ViT or DINOv2 config.json (``pooler``: the folder has ViT's pooler)."""

    def need(key: str) -> Any:
        if key not in hf:
            raise ConfigError(f"{path} lacks {key!r}")
        return hf[key]

    if hf.get("hidden_act", "gelu") != "gelu":
        raise ConfigError(f"{path}: hidden_act {hf['hidden_act']!r} is not supported (gelu is)")
    if hf.get("use_swiglu_ffn"):
        raise ConfigError(f"{path}: use_swiglu_ffn (DINOv2 giant's feed-forward) is not supported yet")
    if hf.get("qkv_bias", True) is not True:
        raise ConfigError(f"{path}: a model without query/key/value biases is not supported")
    image, patch = need("image_size"), need("patch_size")
    if not isinstance(image, int) or not isinstance(patch, int):
        raise ConfigError(f"{path}: image_size and patch_size must be single integers (square images)")
    d = int(need("hidden_size"))
    d_ff = int(hf["intermediate_size"]) if layout == "vit" else int(d * float(hf.get("mlp_ratio", 4)))
    classifier = {"vit": "cls", "dinov2": "cls+mean"}[layout] if task == CLASSIFY else "none"
    vision = VisionConfig(image_size=image, patch_size=patch, channels=int(hf.get("num_channels", 3)),
                          registers=registers, layer_scale=layout == "dinov2", antialias=registers > 0,
                          pooled="pooler" if pooler else "cls", classifier=classifier)  # fmt: skip
    grid = vision.grid
    try:
        return ModelConfig(
            architecture="vision", vocab_size=1, d_model=d, n_heads=int(need("num_attention_heads")), d_ff=d_ff,
            n_encoder_layers=int(need("num_hidden_layers")), n_decoder_layers=0, max_len=1 + registers + grid * grid,
            dropout=0.0, activation="gelu", norm="layernorm", norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            norm_first=True, position="none", scale_embedding=False, embedding_norm=False, tie_embeddings=False,
            num_labels=len(labels) if labels else int(hf.get("num_labels", 2)), pad_id=0, bos_id=0, eos_id=0,
            section=vision,
        )  # fmt: skip
    except (ConfigError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path} does not describe a model edgeattn can build: {exc}") from exc


def map_clip_config(hf: dict[str, Any], logit_scale: float, path: Path, siglip: bool = False,
                    logit_bias: float = 0.0) -> ModelConfig:  # fmt: skip
    """The edgeattn config of a CLIPModel's (or ``siglip``: a SiglipModel's) config.json: the vision
    tower as the model, the text tower in its section, both in one space (CLIP's ``projection_dim``;
    SigLIP's text head projects into its image encoder's width)."""
    from edgeattn.families.vision.config import TextTowerConfig

    vision, text = hf.get("vision_config"), hf.get("text_config")
    if not isinstance(vision, dict) or not isinstance(text, dict):
        raise ConfigError(f"{path} lacks vision_config or text_config")

    def need(section: dict[str, Any], key: str, where: str) -> Any:
        if key not in section:
            raise ConfigError(f"{path} lacks {where}.{key}")
        return section[key]

    activations = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                   "gelu_new": "gelu_tanh"}  # fmt: skip
    default_act = "gelu_pytorch_tanh" if siglip else "quick_gelu"
    for where, part in (("vision_config", vision), ("text_config", text)):
        if part.get("hidden_act", default_act) not in activations:
            raise ConfigError(f"{path}: {where}.hidden_act {part['hidden_act']!r} is not supported")
    if siglip and vision.get("vision_use_head", True) is not True:
        raise ConfigError(f"{path}: a SigLIP vision tower without its pooling head is not supported")
    eos = int(text.get("eos_token_id", 2))
    width = int(need(vision, "hidden_size", "vision_config"))
    projection = int(text.get("projection_size") or need(text, "hidden_size", "text_config")) if siglip else \
        int(hf.get("projection_dim", 512))  # fmt: skip
    if siglip and projection != width:
        raise ConfigError(f"{path}: the text head's width {projection} is not the image tower's {width}")
    tower = TextTowerConfig(
        vocab_size=int(need(text, "vocab_size", "text_config")), d_model=int(need(text, "hidden_size", "text_config")),
        n_heads=int(need(text, "num_attention_heads", "text_config")),
        d_ff=int(need(text, "intermediate_size", "text_config")),
        n_layers=int(need(text, "num_hidden_layers", "text_config")),
        max_len=int(text.get("max_position_embeddings", 64 if siglip else 77)),
        eos_id=-1 if eos == 2 or siglip else eos, norm_eps=float(text.get("layer_norm_eps", 1e-6 if siglip else 1e-5)),
        activation=activations[text.get("hidden_act", default_act)], causal=not siglip,
        pool="last" if siglip else "eos", head_bias=siglip, pad_id=int(text.get("pad_token_id") or 0) if siglip else 0,
    )  # fmt: skip
    clip = not siglip
    section = VisionConfig(image_size=int(need(vision, "image_size", "vision_config")),
                           patch_size=int(need(vision, "patch_size", "vision_config")),
                           channels=int(vision.get("num_channels", 3)), embedding_norm=clip,
                           final_norm="pooled" if clip else "all", patch_bias=siglip, projection=projection,
                           text=tower, logit_scale=logit_scale, project_images=clip, class_token=clip,
                           pooled="map" if siglip else "cls", scores="sigmoid" if siglip else "softmax",
                           logit_bias=logit_bias)  # fmt: skip
    try:
        return ModelConfig(
            architecture="vision", vocab_size=tower.vocab_size, d_model=width,
            n_heads=int(need(vision, "num_attention_heads", "vision_config")),
            d_ff=int(need(vision, "intermediate_size", "vision_config")),
            n_encoder_layers=int(need(vision, "num_hidden_layers", "vision_config")), n_decoder_layers=0,
            max_len=section.extra_tokens + section.grid**2, dropout=0.0,
            activation=activations[vision.get("hidden_act", default_act)], norm="layernorm",
            norm_eps=float(vision.get("layer_norm_eps", 1e-6 if siglip else 1e-5)), norm_first=True, position="none",
            scale_embedding=False, embedding_norm=False, tie_embeddings=False, pad_id=0, bos_id=0, eos_id=0,
            section=section,
        )  # fmt: skip
    except (ConfigError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path} does not describe a model edgeattn can build: {exc}") from exc


_CLIP_LAYER = {"self_attn.q_proj": "self_attn.q_proj", "self_attn.k_proj": "self_attn.k_proj",
               "self_attn.v_proj": "self_attn.v_proj", "self_attn.out_proj": "self_attn.out_proj",
               "layer_norm1": "norm1", "layer_norm2": "norm2", "mlp.fc1": "ff.linear1", "mlp.fc2": "ff.linear2"}
_CLIP_FIXED = {"vision_model.embeddings.class_embedding": "cls_token",
               "vision_model.embeddings.patch_embedding.weight": "patch.weight",
               "vision_model.embeddings.position_embedding.weight": "position",
               "vision_model.pre_layrnorm.weight": "embedding_norm.weight",
               "vision_model.pre_layrnorm.bias": "embedding_norm.bias",
               "vision_model.post_layernorm.weight": "encoder.final_norm.weight",
               "vision_model.post_layernorm.bias": "encoder.final_norm.bias",
               "visual_projection.weight": "projection.weight",
               "text_model.embeddings.token_embedding.weight": "text.embed.weight",
               "text_model.embeddings.position_embedding.weight": "text.position",
               "text_model.final_layer_norm.weight": "text.encoder.final_norm.weight",
               "text_model.final_layer_norm.bias": "text.encoder.final_norm.bias",
               "text_projection.weight": "text.projection.weight"}  # fmt: skip


_SIGLIP_FIXED = {"vision_model.embeddings.patch_embedding.weight": "patch.weight",
                 "vision_model.embeddings.patch_embedding.bias": "patch.bias",
                 "vision_model.embeddings.position_embedding.weight": "position",
                 "vision_model.post_layernorm.weight": "encoder.final_norm.weight",
                 "vision_model.post_layernorm.bias": "encoder.final_norm.bias",
                 "vision_model.head.probe": "attention_pool.probe",
                 "vision_model.head.attention.in_proj_weight": "attention_pool.in_proj.weight",
                 "vision_model.head.attention.in_proj_bias": "attention_pool.in_proj.bias",
                 "vision_model.head.attention.out_proj.weight": "attention_pool.out_proj.weight",
                 "vision_model.head.attention.out_proj.bias": "attention_pool.out_proj.bias",
                 "vision_model.head.layernorm.weight": "attention_pool.norm.weight",
                 "vision_model.head.layernorm.bias": "attention_pool.norm.bias",
                 "vision_model.head.mlp.fc1.weight": "attention_pool.fc1.weight",
                 "vision_model.head.mlp.fc1.bias": "attention_pool.fc1.bias",
                 "vision_model.head.mlp.fc2.weight": "attention_pool.fc2.weight",
                 "vision_model.head.mlp.fc2.bias": "attention_pool.fc2.bias",
                 "text_model.embeddings.token_embedding.weight": "text.embed.weight",
                 "text_model.embeddings.position_embedding.weight": "text.position",
                 "text_model.final_layer_norm.weight": "text.encoder.final_norm.weight",
                 "text_model.final_layer_norm.bias": "text.encoder.final_norm.bias",
                 "text_model.head.weight": "text.projection.weight", "text_model.head.bias": "text.projection.bias"}


def siglip_name(key: str) -> str | None:
    """The edgeattn name of a SiglipModel tensor, or None."""
    if key in _SIGLIP_FIXED:
        return _SIGLIP_FIXED[key]
    return _tower_layer(key)


def clip_name(key: str) -> str | None:
    """The edgeattn name of a CLIPModel tensor, or None."""
    if key in _CLIP_FIXED:
        return _CLIP_FIXED[key]
    return _tower_layer(key)


def _tower_layer(key: str) -> str | None:
    """The edgeattn name of a tensor of a CLIP or SigLIP tower's layer, or None."""
    layer = re.match(r"(vision|text)_model\.encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$", key)
    if layer and layer.group(3) in _CLIP_LAYER:
        tower = "" if layer.group(1) == "vision" else "text."
        return f"{tower}encoder.layers.{layer.group(2)}.{_CLIP_LAYER[layer.group(3)]}.{layer.group(4)}"
    return None


_VIT_LAYER = {"attention.attention.query": "self_attn.q_proj", "attention.attention.key": "self_attn.k_proj",
              "attention.attention.value": "self_attn.v_proj", "attention.output.dense": "self_attn.out_proj",
              "layernorm_before": "norm1", "layernorm_after": "norm2", "intermediate.dense": "ff.linear1",
              "output.dense": "ff.linear2"}  # fmt: skip
_DINO_LAYER = {"attention.attention.query": "self_attn.q_proj", "attention.attention.key": "self_attn.k_proj",
               "attention.attention.value": "self_attn.v_proj", "attention.output.dense": "self_attn.out_proj",
               "norm1": "norm1", "norm2": "norm2", "mlp.fc1": "ff.linear1", "mlp.fc2": "ff.linear2"}  # fmt: skip
_FIXED = {"embeddings.cls_token": "cls_token", "embeddings.register_tokens": "registers",
          "embeddings.position_embeddings": "position", "embeddings.patch_embeddings.projection.weight": "patch.weight",
          "embeddings.patch_embeddings.projection.bias": "patch.bias", "layernorm.weight": "encoder.final_norm.weight",
          "layernorm.bias": "encoder.final_norm.bias", "pooler.dense.weight": "pooler.weight",
          "pooler.dense.bias": "pooler.bias", "classifier.weight": "classifier.weight",
          "classifier.bias": "classifier.bias"}  # fmt: skip


def map_tensors(tensors: dict[str, torch.Tensor], layout: str, config: ModelConfig, source: str
                ) -> dict[str, torch.Tensor]:  # fmt: skip
    """The checkpoint's tensors under edgeattn's names (DINOv2's layer scales stacked into one
    (layers, 2, d) table); a tensor with no place is an error naming it."""
    from edgeattn.hf import renamed

    if layout in ("clip", "siglip"):
        kept = {k: v for k, v in tensors.items() if k not in ("logit_scale", "logit_bias")
                and not k.endswith("position_ids")}  # fmt: skip
        out = renamed(kept, clip_name if layout == "clip" else siglip_name, source, layout)
        if "position" in out:
            out["position"] = out["position"].reshape(1, *out["position"].shape)
        if "cls_token" in out:
            out["cls_token"] = out["cls_token"].reshape(1, 1, -1)
        return out
    table = _VIT_LAYER if layout == "vit" else _DINO_LAYER
    scales: dict[tuple[int, int], torch.Tensor] = {}
    kept = {}
    for key, value in tensors.items():
        short = re.sub(r"^(vit|dinov2|dinov2_with_registers)\.", "", key)
        scale = re.match(r"encoder\.layer\.(\d+)\.layer_scale([12])\.lambda1$", short)
        if scale:
            scales[int(scale.group(1)), int(scale.group(2)) - 1] = value
        elif short != "embeddings.mask_token":  # masked-image training only
            kept[key] = value

    def name_of(key: str) -> str | None:
        short = re.sub(r"^(vit|dinov2|dinov2_with_registers)\.", "", key)
        layer = re.match(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$", short)
        if short in _FIXED:
            return _FIXED[short]
        if layer and layer.group(2) in table:
            return f"encoder.layers.{layer.group(1)}.{table[layer.group(2)]}.{layer.group(3)}"
        return None

    out = renamed(kept, name_of, source, layout)
    if "cls_token" in out:
        out["cls_token"] = out["cls_token"].reshape(1, 1, -1)
    if config.section.layer_scale:
        layers = config.n_encoder_layers
        missing = [f"layer {i} scale {j + 1}" for i in range(layers) for j in range(2) if (i, j) not in scales]
        if missing:
            raise CheckpointError(f"{source} lacks DINOv2's layer scales: {', '.join(missing[:4])}")
        out["layer_scale"] = torch.stack([torch.stack([scales[i, 0], scales[i, 1]]) for i in range(layers)]).float()
    elif scales:
        raise CheckpointError(f"{source} has layer scales a {layout} model does not use")
    return out


def preprocessing(folder: Path, config: ModelConfig) -> ImagePreprocessing:
    """The folder's ``preprocessor_config.json`` as the export's preprocessing; without one, a square
    of the model's image size scaled to [-1, 1] (ViT's processor's defaults), with a warning."""
    from edgeattn.hf import read_json
    from edgeattn.runtime.exported_model import InputError

    path = folder / PREPROCESSOR_CONFIG
    if not path.is_file():
        side = config.section.image_size
        log.warning("%s has no %s: images will be resized to %d x %d and scaled to [-1, 1]", folder,
                    PREPROCESSOR_CONFIG, side, side)  # fmt: skip
        return ImagePreprocessing(size={"height": side, "width": side})
    try:
        return ImagePreprocessing.from_processor(read_json(path), str(path))
    except InputError as exc:
        raise ConfigError(str(exc)) from exc


def _import_vision(folder: Path, hf: dict[str, Any], importer: Importer, task: str) -> HFModel:
    """A ViT or DINOv2 checkpoint as a :class:`VisionModel` for ``task`` (empty: what its head implies)."""
    from edgeattn.hf import GENERATE, HFModel, label_names, read_tensors, tokenizer_of

    config_file = folder / "config.json"
    implied = importer.task
    task = task or implied
    if task not in (EMBED, implied) or task == GENERATE:
        raise ConfigError(f"{importer.architecture}'s tasks are {EMBED}" + (f" and {implied}" if implied != EMBED
                                                                             else "") + f", not {task}")  # fmt: skip
    tensors = read_tensors(folder)
    if task == EMBED and implied == CLASSIFY:
        dropped = [k for k in tensors if k.startswith("classifier.")]
        log.info("task %s: leaving out the classifier's tensors %s", task, dropped)
        tensors = {k: v for k, v in tensors.items() if k not in dropped}
    labels = label_names(hf, config_file) if task == CLASSIFY else None
    if importer.layout in ("clip", "siglip"):
        if "logit_scale" not in tensors or (importer.layout == "siglip" and "logit_bias" not in tensors):
            raise CheckpointError(f"{folder} lacks its logit scale (or SigLIP's logit bias)")
        bias = float(tensors["logit_bias"].float().reshape(-1)[0]) if "logit_bias" in tensors else 0.0
        config = map_clip_config(hf, float(tensors["logit_scale"].float().reshape(-1)[0].exp()), config_file,
                                 siglip=importer.layout == "siglip", logit_bias=bias)  # fmt: skip
    else:
        registers = int(hf.get("num_register_tokens", 0)) if importer.model_types == ("dinov2_with_registers",) else 0
        pooler = any(k.endswith("pooler.dense.weight") for k in tensors)
        config = map_config(hf, importer.layout, task, labels, pooler, registers, config_file)
    with parameters_on_meta():
        model = build_model(config)
    assert isinstance(model, VisionModel)
    source = str(folder)
    load_state(model, map_tensors(tensors, importer.layout, config, source), source)
    log.info("imported %s from %s for %s", importer.architecture, folder, task)
    settings = {"preprocessing": preprocessing(folder, config).to_dict()}
    tokenizer = tokenizer_of(folder) if config.section.text is not None else None
    return HFModel(model.eval(), importer.architecture, task, labels, None, folder, tokenizer, settings=settings)
