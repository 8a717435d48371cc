"""Tiny random ViT and DINOv2 folders saved by transformers, and their exports, made once per module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

#: name -> (transformers class, config class, config, processor kind)
_DINO_PROCESSOR = {"size": {"shortest_edge": 64}, "crop_size": {"height": 56, "width": 56}, "do_center_crop": True,
                   "resample": 3, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}


def _folders() -> dict[str, tuple[str, str, dict, str, dict]]:
    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
    vit = {**small, "intermediate_size": 64, "image_size": 32, "patch_size": 8}
    dino = {**small, "mlp_ratio": 4, "image_size": 56, "patch_size": 14}
    labels = {"num_labels": 3, "id2label": {0: "cat", 1: "dog", 2: "car"}, "label2id": {"cat": 0, "dog": 1, "car": 2}}
    vit_processor = {"size": {"height": 32, "width": 32}}
    return {
        "vit": ("ViTModel", "ViTConfig", vit, "ViTImageProcessor", vit_processor),
        "vit-classifier": ("ViTForImageClassification", "ViTConfig", {**vit, **labels}, "ViTImageProcessor",
                           vit_processor),
        "dinov2": ("Dinov2Model", "Dinov2Config", dino, "BitImageProcessor", _DINO_PROCESSOR),
        "dinov2-classifier": ("Dinov2ForImageClassification", "Dinov2Config", {**dino, "num_labels": 4},
                              "BitImageProcessor", _DINO_PROCESSOR),
        "dinov2-registers": ("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig",
                             {**dino, "num_register_tokens": 4}, "BitImageProcessor", _DINO_PROCESSOR),
    }  # fmt: skip


FOLDERS = tuple(_folders())


def save_folder(name: str, out: Path) -> Path:
    """A tiny random folder of ``name`` (weights moved off their initial values, so that layer scales,
    registers and the class token matter)."""
    import transformers

    model_class, config_class, config, processor, processor_config = _folders()[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(out)
    getattr(transformers, processor)(**processor_config).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def vision_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vision-folders")
    return {name: save_folder(name, root / name) for name in FOLDERS}


@pytest.fixture(scope="session")
def vision_exports(vision_folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from edgeattn.exporters.export import export_model
    from edgeattn.hf import import_folder
    from edgeattn.hf_reference import require_transformers_agreement
    from edgeattn.runtime.manifest import ImportCheck

    root = tmp_path_factory.mktemp("vision-exports")
    out = {}
    for name, folder in vision_folders.items():
        hf = import_folder(folder)
        check = require_transformers_agreement(hf)
        export_model(hf.model, root / name, source=str(folder), task=hf.task, architecture=hf.architecture,
                     labels=hf.labels, source_folder=folder, settings=hf.settings,
                     import_check=ImportCheck(check.transformers_version, check.line(), check.passed))  # fmt: skip
        out[name] = root / name
    return out


def save_clip(out: Path, legacy_eos: bool = False) -> Path:
    """A tiny random CLIPModel folder with a word-level tokenizer.json (start and end tokens added,
    the end token the highest id; ``legacy_eos``: config.json's eos_token_id 2, as CLIP's first
    configs have it, so that the end is found as the highest id)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["a", "photo", "of", "cat", "dog", "car", "the", "sea", "red", "blue", "[UNK]", "[PAD]"]
    vocab = {w: i for i, w in enumerate(words)}
    start, end = len(vocab), len(vocab) + 1
    vocab.update({"<|startoftext|>": start, "<|endoftext|>": end})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>", special_tokens=[("<|startoftext|>", start), ("<|endoftext|>", end)])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    text = {"vocab_size": end + 1, "hidden_size": 24, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 16, "eos_token_id": 2 if legacy_eos else end,
            "bos_token_id": start, "pad_token_id": vocab["[PAD]"]}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "image_size": 32, "patch_size": 8}
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    torch.manual_seed(0)
    model = transformers.CLIPModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(out)
    processor = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor.save_pretrained(out)
    return out


def save_siglip(out: Path) -> Path:
    """A tiny random SiglipModel folder with a word-level tokenizer.json (an end token appended)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["<pad>", "</s>", "[UNK]", "a", "photo", "of", "cat", "dog", "car", "the", "sea", "red", "blue"]
    vocab = {w: i for i, w in enumerate(words)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    text = {"vocab_size": len(words), "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 16, "pad_token_id": 0, "eos_token_id": 1}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "image_size": 32, "patch_size": 8}
    torch.manual_seed(0)
    model = transformers.SiglipModel(transformers.SiglipConfig(text_config=text, vision_config=vision)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(out)
    transformers.SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(out)
    return out
