"""The vision family end to end on tiny random ViT and DINOv2 folders: the import and ONNX Runtime
equal transformers at image sizes never used at export, pixel values equal transformers' image
processors on real photographs and awkward files, hostile images refused in a line."""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from edgeattn.cli import cli
from edgeattn.config import ModelConfig
from edgeattn.runtime import load
from edgeattn.runtime.exported_model import InputError
from edgeattn.runtime.families.vision.images import ImagePreprocessing, open_image
from tests.families.vision.conftest import FOLDERS

_MODELS = {"vit": "ViTModel", "vit-classifier": "ViTForImageClassification", "dinov2": "Dinov2Model",
           "dinov2-classifier": "Dinov2ForImageClassification", "dinov2-registers": "Dinov2WithRegistersModel"}


def sample_photos() -> list[Path]:
    """Real photographs and drawings that ship in matplotlib: a JPEG and two PNGs (one with alpha)."""
    import matplotlib.cbook

    return [Path(matplotlib.cbook.get_sample_data(n, asfileobj=False))
            for n in ("grace_hopper.jpg", "logo2.png", "Minduka_Present_Blue_Pack.png")]  # fmt: skip


@pytest.fixture(scope="module")
def awkward_images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Grayscale, palette, RGBA, a JPEG rotated by its EXIF orientation, an animated GIF and a WebP."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    base = Image.fromarray(rng.integers(0, 256, (45, 70, 3), dtype=np.uint8))
    paths = []
    for name, image, kwargs in (
        ("gray.png", base.convert("L"), {}),
        ("palette.png", base.convert("P"), {}),
        ("alpha.png", base.convert("RGBA"), {}),
        ("small.webp", base, {"lossless": True}),
    ):
        paths.append(root / name)
        image.save(paths[-1], **kwargs)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees clockwise
    paths.append(root / "rotated.jpg")
    base.save(paths[-1], exif=exif, quality=95)
    paths.append(root / "animated.gif")
    base.save(paths[-1], save_all=True, append_images=[base.rotate(90, expand=True)])
    return paths


def transformers_model(folder: Path, name: str) -> torch.nn.Module:
    import transformers

    return getattr(transformers, _MODELS[name]).from_pretrained(folder, attn_implementation="eager").eval()


@pytest.mark.parametrize("name", FOLDERS)
def test_onnx_runtime_equals_transformers_at_new_image_sizes(name: str, vision_folders: dict[str, Path],
                                                             vision_exports: dict[str, Path]) -> None:  # fmt: skip
    theirs = transformers_model(vision_folders[name], name)
    ours = load(vision_exports[name])
    manifest = json.loads((vision_exports[name] / "manifest.json").read_text())
    assert manifest["import_check"]["passed"] and manifest["graphs"]["vision_encoder"]["parity"]["passed"]
    patch = ours.config.section.patch_size
    for batch, height, width in ((1, 5 * patch, 3 * patch + 5), (3, 2 * patch, 6 * patch)):
        pixels = np.random.default_rng(batch).standard_normal((batch, 3, height, width)).astype(np.float32)
        got = ours.encode(pixels)
        kwargs = {"interpolate_pos_encoding": True} if name.startswith("vit") else {}
        with torch.no_grad():
            want = theirs(pixel_values=torch.from_numpy(pixels), output_hidden_states=True, **kwargs)
            hidden = getattr(want, "last_hidden_state", None)
            if hidden is None:  # a classifier returns its layers' states, before the final norm
                body = theirs.vit if name.startswith("vit") else theirs.dinov2
                hidden = body.layernorm(want.hidden_states[-1])
        np.testing.assert_allclose(got["last_hidden_state"], hidden.numpy(), atol=1e-4, rtol=1e-4)
        if getattr(want, "pooler_output", None) is not None:
            np.testing.assert_allclose(got["pooler_output"], want.pooler_output.numpy(), atol=1e-4, rtol=1e-4)
        if hasattr(want, "logits"):
            np.testing.assert_allclose(got["logits"], want.logits.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["vit", "dinov2"])
def test_pixel_values_equal_transformers_image_processor(name: str, vision_folders: dict[str, Path],
                                                        vision_exports: dict[str, Path],
                                                        awkward_images: list[Path]) -> None:  # fmt: skip
    import transformers
    from transformers.image_utils import load_image

    processor = transformers.AutoImageProcessor.from_pretrained(vision_folders[name], use_fast=False)
    ours = load(vision_exports[name])
    paths = [*sample_photos(), *awkward_images]
    want = processor(images=[load_image(str(p)) for p in paths], return_tensors="np")["pixel_values"]
    got = ours.pixel_values(paths)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    # and the embeddings of those pixel values are transformers' pooled outputs of them
    theirs = transformers_model(vision_folders[name], name)
    with torch.no_grad():
        pooled = theirs(pixel_values=torch.from_numpy(want)).pooler_output.numpy()
    np.testing.assert_allclose(ours.embed(paths), pooled, atol=1e-4, rtol=1e-4)


@pytest.mark.quick
def test_every_kind_of_image_input_gives_the_same_embedding(vision_exports: dict[str, Path]) -> None:
    ours = load(vision_exports["dinov2"])
    path = sample_photos()[0]
    pillow = Image.open(path)
    embeddings = ours.embed([path, str(path), path.read_bytes(), pillow, np.asarray(pillow.convert("RGB"))])
    for row in embeddings[1:]:
        np.testing.assert_array_equal(row, embeddings[0])
    assert ours.embed(path).shape == (1, ours.config.d_model)


def _png_declaring(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + \
        chunk(b"IEND", b"")  # fmt: skip


@pytest.mark.quick
def test_hostile_images_are_refused_in_a_line(tmp_path: Path) -> None:
    bomb = _png_declaring(100_000, 100_000)
    jpeg = io.BytesIO()
    Image.new("RGB", (64, 64), "red").save(jpeg, "JPEG")
    cases = {
        "declares": bomb,  # a decompression bomb: refused before it is decoded
        "damaged or truncated": jpeg.getvalue()[: len(jpeg.getvalue()) // 2],
        "is not an image": b"%PDF-1.4 not an image at all",
    }
    for words, data in cases.items():
        with pytest.raises(InputError, match=words) as caught:
            open_image(data)
        assert "\n" not in str(caught.value)
    (tmp_path / "cat.jpg").write_text("mislabelled text", encoding="utf-8")
    with pytest.raises(InputError, match="cat.jpg is not an image"):
        open_image(tmp_path / "cat.jpg")
    with pytest.raises(InputError, match="no such file"):
        open_image(tmp_path / "missing.png")
    with pytest.raises(InputError, match="at least one"):
        open_image(np.zeros((0, 5, 3), np.uint8))
    with pytest.raises(InputError, match="uint8"):
        open_image(np.zeros((5, 5, 3), np.float32))
    with pytest.raises(InputError, match="a path, bytes"):
        open_image(12)


@pytest.mark.quick
def test_the_pixel_limit_is_the_users_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    image = np.zeros((40, 50, 3), np.uint8)
    monkeypatch.setenv("EDGEATTN_MAX_IMAGE_PIXELS", "1000")
    with pytest.raises(InputError, match="over the limit of 1,000"):
        open_image(image)
    monkeypatch.setenv("EDGEATTN_MAX_IMAGE_PIXELS", "2000")
    assert open_image(image).size == (50, 40)


@pytest.mark.quick
def test_preprocessing_refuses_what_it_cannot_do_exactly() -> None:
    with pytest.raises(InputError, match="ConvNextImageProcessor"):
        ImagePreprocessing.from_processor({"image_processor_type": "ConvNextImageProcessor"})
    with pytest.raises(InputError, match="crop_pct"):
        ImagePreprocessing.from_processor({"image_processor_type": "ViTImageProcessor", "crop_pct": 0.875})
    old = ImagePreprocessing.from_processor({"size": 224, "do_center_crop": True, "crop_size": 200})
    assert old.size == {"shortest_edge": 224} and old.crop_size == {"height": 200, "width": 200}
    assert old.output_size(300, 500) == (200, 200)


def test_run_prints_labels_or_an_embedding(vision_exports: dict[str, Path], tmp_path: Path) -> None:
    runner = CliRunner()
    photo = str(sample_photos()[0])
    result = runner.invoke(cli, ["run", str(vision_exports["vit-classifier"]), photo, "--top", "2"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == photo and len(lines) == 3 and lines[1].split()[1] in ("cat", "dog", "car")
    result = runner.invoke(cli, ["run", str(vision_exports["dinov2"]), photo, "--json"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.output)["embedding"]) == 32
    (tmp_path / "bomb.png").write_bytes(_png_declaring(100_000, 100_000))
    result = runner.invoke(cli, ["run", str(vision_exports["dinov2"]), str(tmp_path / "bomb.png")])
    assert result.exit_code != 0 and "declares" in result.output and len(result.output.strip().splitlines()) == 1
    result = runner.invoke(cli, ["run", str(vision_exports["dinov2"]), photo, "--truncate"])
    assert result.exit_code != 0 and "not for a vision export" in result.output


def test_the_config_keeps_its_vision_section(vision_exports: dict[str, Path]) -> None:
    manifest = json.loads((vision_exports["dinov2-registers"] / "manifest.json").read_text())
    config = ModelConfig.from_dict(manifest["config"])
    assert config.architecture == "vision"
    assert (config.section.registers, config.section.layer_scale, config.section.antialias) == (4, True, True)
    assert manifest["task"] == "image-feature-extraction" and manifest["architecture"] == "Dinov2WithRegistersModel"


def test_a_gate_without_held_out_images_says_what_it_cannot_show(vision_folders: dict[str, Path],
                                                                 tmp_path: Path) -> None:  # fmt: skip
    from edgeattn.exporters.export import export_model
    from edgeattn.hf import import_folder

    hf = import_folder(vision_folders["vit"])
    result = export_model(hf.model, tmp_path / "out", precisions=["int8"], settings=hf.settings)
    gate = result.gates["int8"]
    assert gate.passed and gate.heldout_random and "random pixel values" in gate.table()
    assert gate.metrics["vision_encoder"]["cosine_min"] > 0.99
