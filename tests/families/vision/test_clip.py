"""CLIP and SigLIP through the vision family on tiny random folders (CLIP both ways a config finds
the end token): the image and text towers, zero-shot probabilities (CLIP's softmax, SigLIP's
sigmoid) and text embeddings equal transformers', the command line's --labels, the OpenAI API
embedding texts and images into one space, the gate over both graphs."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from edgeattn.cli import cli
from edgeattn.runtime import load
from tests.families.vision.conftest import save_clip, save_siglip
from tests.families.vision.test_vision import sample_photos

LABELS = ["cat", "dog", "red car"]


@pytest.fixture(scope="module")
def clip_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("clip")
    return {"clip": save_clip(root / "clip"), "clip-legacy": save_clip(root / "clip-legacy", legacy_eos=True),
            "siglip": save_siglip(root / "siglip")}


@pytest.fixture(scope="module")
def clip_exports(clip_folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("clip-exports")
    out = {}
    for name, folder in clip_folders.items():
        result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(root / name)])
        assert result.exit_code == 0, result.output
        out[name] = root / name
    return out


@pytest.mark.parametrize("name", ["clip", "clip-legacy", "siglip"])
def test_zero_shot_and_text_embeddings_equal_transformers(name: str, clip_folders: dict[str, Path],
                                                         clip_exports: dict[str, Path]) -> None:  # fmt: skip
    import transformers
    from transformers.image_utils import load_image

    folder = clip_folders[name]
    siglip = name == "siglip"
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                                     pad_token="<pad>" if siglip else "[PAD]")  # fmt: skip
    processor = transformers.AutoImageProcessor.from_pretrained(folder, use_fast=False)
    model_class = transformers.SiglipModel if siglip else transformers.CLIPModel
    theirs = model_class.from_pretrained(folder, attn_implementation="eager").eval()
    ours = load(clip_exports[name])
    photos = sample_photos()
    texts = [f"a photo of {label}" for label in LABELS]
    # SigLIP's texts are padded to the tower's length, as its processor pads them (max_length)
    padding = {"padding": "max_length", "max_length": 16} if siglip else {"padding": True}
    encoded = tokenizer(texts, return_tensors="pt", **padding)
    pixels = processor(images=[load_image(str(p)) for p in photos], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        want = theirs(input_ids=encoded.input_ids, attention_mask=encoded.attention_mask, pixel_values=pixels)
        text_features = theirs.get_text_features(input_ids=encoded.input_ids, attention_mask=encoded.attention_mask)
        image_features = theirs.get_image_features(pixel_values=pixels)
    np.testing.assert_array_equal(ours.pixel_values(photos), pixels.numpy())
    np.testing.assert_allclose(ours.embed(photos), image_features.numpy(), atol=1e-5)
    np.testing.assert_allclose(ours.embed_text(texts), text_features.numpy(), atol=1e-5)
    got = np.array([[found.scores[label] for label in LABELS] for found in ours.zero_shot(photos, LABELS)])
    scores = want.logits_per_image.sigmoid() if siglip else want.logits_per_image.softmax(-1)
    np.testing.assert_allclose(got, scores.numpy(), atol=1e-5)
    # the text graph at lengths and batches mixing padding, against the text tower alone
    ids, mask = encoded.input_ids.numpy(), encoded.attention_mask.numpy()
    with torch.no_grad():
        hidden = theirs.text_model(input_ids=encoded.input_ids, attention_mask=encoded.attention_mask)
    out = ours.encode_text(ids, mask)  # SigLIP's text pooler output is its head's: edgeattn's text_embeds
    np.testing.assert_allclose(out["text_embeds" if siglip else "pooler_output"], hidden.pooler_output.numpy(),
                               atol=1e-5)  # fmt: skip


def test_run_labels_and_the_errors_of_a_model_without_a_text_tower(
        clip_exports: dict[str, Path], vision_exports: dict[str, Path]) -> None:  # fmt: skip
    runner = CliRunner()
    photo = str(sample_photos()[0])
    result = runner.invoke(cli, ["run", str(clip_exports["clip"]), photo, "--labels", ",".join(LABELS)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == photo and {line.split(maxsplit=1)[1] for line in lines[1:]} == set(LABELS)
    result = runner.invoke(cli, ["run", str(vision_exports["dinov2"]), photo, "--labels", "a,b"])
    assert result.exit_code != 0 and "this one has none" in result.output
    with pytest.raises(Exception, match="no text tower"):
        load(vision_exports["dinov2"]).embed_text(["a cat"])


def test_openai_embeds_texts_and_images_into_one_space(clip_exports: dict[str, Path]) -> None:
    openai = pytest.importorskip("openai")
    from edgeattn.serving.openai_api import ApiThread, OpenAIApi, served_models

    ours = load(clip_exports["clip"])
    photo = sample_photos()[0].read_bytes()
    with ApiThread(OpenAIApi(served_models([clip_exports["clip"]], max_rows=2))) as running:
        client = openai.OpenAI(base_url=running.url, api_key="unused", max_retries=0, timeout=60)
        image = f"data:image/jpeg;base64,{base64.b64encode(photo).decode()}"
        got = client.embeddings.create(model="clip", input=["a photo of cat", image])
    vectors = np.array([d.embedding for d in got.data])
    np.testing.assert_allclose(vectors[0], ours.embed_text(["a photo of cat"])[0], atol=1e-6)
    np.testing.assert_allclose(vectors[1], ours.embed(photo)[0], atol=1e-6)


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_both_graphs_pass_the_gate(name: str, clip_folders: dict[str, Path], tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(clip_folders[name]), "-o", str(tmp_path / "c"),
                                      "--precision", "int8,fp16"])  # fmt: skip
    assert result.exit_code == 0, result.output
    for precision in ("int8", "fp16"):
        model = load(tmp_path / "c", precision=precision)
        assert model.zero_shot(sample_photos()[0], LABELS)[0].label in LABELS
    assert "text_encoder" in result.output and "vision_encoder" in result.output


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_bundles_zero_shot_in_node_and_wasm_as_the_python_runtime(
        name: str, clip_exports: dict[str, Path], node_modules: Path, tmp_path: Path) -> None:  # fmt: skip
    """A node bundle of CLIP / SigLIP (both towers, the tokenizer): pixel values and the labels' token
    ids equal to the Python runtime's, image embeddings and zero-shot scores (CLIP's softmax, SigLIP's
    sigmoid after its bias) on onnxruntime-node and -web's wasm as the Python runtime's."""
    import json

    from edgeattn.exporters.web import check_and_record, package_web

    bundle = package_web(clip_exports[name], tmp_path / "node", "node")
    assert {f["graph"] for f in bundle.files} == {"vision_encoder", "text_encoder"}
    described = json.loads((tmp_path / "node" / "bundle.json").read_text())
    assert described["tokenizer"] == "tokenizer.json" and described["graphs"]["text"] == "text_encoder"
    assert described["model"]["scores"] == ("softmax" if name == "clip" else "sigmoid")
    checks = check_and_record(tmp_path / "node", clip_exports[name], node_modules)
    assert len(checks) == 2 and all(c.passed and c.tokens_equal and c.labels_equal for c in checks), checks
