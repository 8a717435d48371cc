"""A vision export served and gated: the OpenAI API's embeddings of images sent as data URLs or
base64 equal the runtime's, hostile images answer 400 naming the limit; Triton's task answers
embeddings and labels; reduced precisions pass the gate on held-out images."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgeattn.cli import cli
from edgeattn.runtime import load
from edgeattn.runtime.families.vision.served import IMAGES
from tests.families.vision.test_vision import _png_declaring, sample_photos

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")


@pytest.fixture(scope="module")
def api(vision_exports: dict[str, Path]):
    from edgeattn.serving.openai_api import ApiThread, OpenAIApi, served_models

    models = served_models([vision_exports["dinov2"], vision_exports["vit-classifier"]], max_rows=4)
    with ApiThread(OpenAIApi(models)) as running:
        yield openai.OpenAI(base_url=running.url, api_key="unused", max_retries=0, timeout=60)


def test_openai_embeddings_of_images_equal_the_runtime(api, vision_exports: dict[str, Path]) -> None:
    photos = [p.read_bytes() for p in sample_photos()]
    want = load(vision_exports["dinov2"]).embed(photos)
    inputs = [f"data:image/jpeg;base64,{base64.b64encode(photos[0]).decode()}",
              base64.b64encode(photos[1]).decode(), f"data:image/png;base64,{base64.b64encode(photos[2]).decode()}"]
    got = api.embeddings.create(model="dinov2", input=inputs)
    np.testing.assert_allclose([d.embedding for d in got.data], want, atol=1e-6)
    assert got.usage.prompt_tokens == 0


def test_openai_refuses_hostile_images_and_addresses_with_400(api) -> None:
    bomb = base64.b64encode(_png_declaring(100_000, 100_000)).decode()
    with pytest.raises(openai.BadRequestError, match="over the limit|declares"):
        api.embeddings.create(model="dinov2", input=[f"data:image/png;base64,{bomb}"])
    with pytest.raises(openai.BadRequestError, match="not addresses to fetch"):
        api.embeddings.create(model="dinov2", input=["https://example.com/cat.jpg"])
    with pytest.raises(openai.BadRequestError, match="neither a data URL"):
        api.embeddings.create(model="dinov2", input=["not base64 at all!"])
    with pytest.raises(openai.BadRequestError, match="embeds its inputs"):
        api.chat.completions.create(model="dinov2", messages=[{"role": "user", "content": "hi"}])


def test_the_served_task_answers_embeddings_and_labels(vision_exports: dict[str, Path]) -> None:
    from edgeattn.serving.tasks import task_of, task_outputs

    photos = [p.read_bytes() for p in sample_photos()]
    classifier = load(vision_exports["vit-classifier"])
    assert task_of(classifier.config, recorded="image-classification") == IMAGES.name
    names = [t.name for t in task_outputs(IMAGES.name, classifier.config)]
    assert names == ["embedding", "label", "score", "probabilities"]
    good = {"image": np.array(photos, dtype=object).reshape(-1, 1)}
    answers = IMAGES.answer(classifier, [good, {"image": np.array([b"junk"], dtype=object)}, {}])
    np.testing.assert_allclose(answers[0]["embedding"], classifier.embed(photos), atol=1e-6)
    labels = [c.label for c in classifier.classify(photos)]
    assert [v.decode() for v in answers[0]["label"].reshape(-1)] == labels
    assert "is not an image" in str(answers[1]) and "no 'image' input" in str(answers[2])


def test_reduced_precisions_pass_the_gate_on_held_out_images(vision_folders: dict[str, Path], tmp_path: Path) -> None:
    images = tmp_path / "heldout"
    images.mkdir()
    for photo in sample_photos():
        (images / photo.name).write_bytes(photo.read_bytes())
    out = tmp_path / "dino"
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(vision_folders["dinov2-classifier"]), "-o", str(out),
                                      "--precision", "fp32-opt,int8,fp16", "--heldout", str(images)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    for precision in ("fp32-opt", "int8", "fp16"):
        gate = manifest["gates"][precision]
        metrics = gate["metrics"]["vision_encoder"]
        assert metrics["cosine_min"] > 0.9 and metrics["top1"] >= 0.5, (precision, metrics)
        assert "heldout" in json.dumps(gate)
    for precision in ("fp32-opt", "int8", "fp16"):
        model = load(out, precision=precision)
        assert model.classify(sample_photos()[0])[0].label


def test_a_triton_repository_of_a_vision_export_answers_images(vision_exports: dict[str, Path], tmp_path: Path) -> None:
    from edgeattn.serving.repository import RepositoryOptions, write_repository
    from edgeattn.serving.tasks import own_task
    from edgeattn.serving.triton_backend import served_model

    repo = write_repository(vision_exports["vit-classifier"], tmp_path / "repo", RepositoryOptions())
    assert repo.models == {"vit-classifier": "python"} and "`image`" in (tmp_path / "repo" / "README.md").read_text()
    model, settings = served_model(tmp_path / "repo" / "vit-classifier" / "1", "in-process", 8)
    photos = [p.read_bytes() for p in sample_photos()]
    answer = own_task(settings["task"]).answer(model, [{"image": np.array(photos, dtype=object).reshape(-1, 1)}])[0]
    np.testing.assert_allclose(answer["embedding"], load(vision_exports["vit-classifier"]).embed(photos), atol=1e-6)
    assert answer["probabilities"].shape == (3, 3)


def test_a_mobile_package_of_a_vision_export_proves_its_answers(vision_exports: dict[str, Path],
                                                                tmp_path: Path) -> None:  # fmt: skip
    result = CliRunner().invoke(cli, ["package", str(vision_exports["dinov2"]), "--target", "mobile", "-o",
                                      str(tmp_path / "phone")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (tmp_path / "phone" / "vision_encoder.ort").is_file()
    assert "vision_encoder.ort" in result.output and " ok" in result.output
