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


def test_node_and_web_bundles_see_as_the_python_runtime(vision_exports: dict[str, Path], node_modules: Path,
                                                        tmp_path: Path) -> None:  # fmt: skip
    """``package --target node --check-with``: a DINOv2 classifier's bundle (no tokenizer) decodes and
    preprocesses PNG files of every kind in JavaScript to pixel values equal to the Python runtime's,
    and answers its embeddings and labels on onnxruntime-node and -web; real photographs too (PNGs,
    and a JPEG as decoded pixels). The web bundle carries the page and both ES modules."""
    from edgeattn.exporters.web import check_and_record
    from edgeattn.runtime.families.vision.images import open_image

    export = vision_exports["dinov2-classifier"]
    result = CliRunner().invoke(cli, ["package", str(export), "--target", "node", "-o", str(tmp_path / "node"),
                                      "--check-with", str(node_modules)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.count(" ok") == 2 and "DIFFER" not in result.output, result.output
    described = json.loads((tmp_path / "node" / "bundle.json").read_text())
    assert described["tokenizer"] is None and described["module"] == "vision.mjs"
    assert described["labels"] == ["LABEL_0", "LABEL_1", "LABEL_2", "LABEL_3"]
    assert described["preprocessing"]["size"] == {"shortest_edge": 64} and described["graphs"]["text"] is None
    checks = described["parity"]["checks"]
    assert all(c["tokens_equal"] and c["labels_equal"] and c["passed"] for c in checks)
    photos = {p.name: (p.read_bytes() if p.suffix == ".png" else np.asarray(open_image(p))) for p in sample_photos()}
    real = check_and_record(tmp_path / "node", export, node_modules, inputs=photos)
    assert all(c.passed and c.tokens_equal for c in real), real
    web = CliRunner().invoke(cli, ["package", str(export), "--target", "web", "-o", str(tmp_path / "web")])
    assert web.exit_code == 0, web.output
    for name in ("index.html", "vision.mjs", "images.mjs", "edgeattn.mjs"):
        assert (tmp_path / "web" / name).is_file(), name


def test_the_page_sees_image_files_in_chromium_as_the_python_runtime(vision_exports: dict[str, Path],
                                                                     node_modules: Path, browser,
                                                                     tmp_path: Path) -> None:  # fmt: skip
    """The web bundle's page in headless Chromium: PNG files chosen in it (decoded by images.mjs)
    labelled as the Python runtime labels them; a JPEG, which the browser's own decoder decodes, equal to
    Pillow's pixels to the last level (both are libjpeg-turbo here)."""
    from edgeattn.runtime.families.vision.images import open_image
    from edgeattn.serving.web_page import WebPageServer

    export = vision_exports["dinov2-classifier"]
    result = CliRunner().invoke(cli, ["package", str(export), "--target", "web", "-o", str(tmp_path / "web")])
    assert result.exit_code == 0, result.output
    pngs = [p for p in sample_photos() if p.suffix == ".png"]
    jpeg = next(p for p in sample_photos() if p.suffix == ".jpg")
    with WebPageServer(tmp_path / "web", port=0, ort_dist=node_modules / "onnxruntime-web" / "dist") as server:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server.url)
        page.wait_for_function("window.edgeattnReady === true || window.edgeattnError !== undefined", timeout=60000)
        assert page.evaluate("window.edgeattnError") is None and not errors, page.inner_text("#status")
        assert page.is_visible("#images") and not page.is_visible("#texts")
        page.set_input_files("#images", [str(p) for p in pngs])
        page.click("#run")
        page.wait_for_function("window.edgeattnResult !== undefined", timeout=60000)
        shown = page.evaluate("window.edgeattnResult")
        want = load(export, providers=["CPUExecutionProvider"]).classify([str(p) for p in pngs])
        assert [c["label"] for c in shown["classify"]] == [c.label for c in want]
        assert page.locator("td.label").all_inner_texts() == [c.label for c in want]
        decoded = page.evaluate("""async (bytes) => {
            const images = await import("./images.mjs");
            const rgb = await images.decode(new Blob([new Uint8Array(bytes)], { type: "image/jpeg" }));
            return { data: Array.from(rgb.data), width: rgb.width, height: rgb.height };
        }""", list(jpeg.read_bytes()))  # fmt: skip
    pillow = np.asarray(open_image(jpeg))
    browser_pixels = np.array(decoded["data"], np.int16).reshape(decoded["height"], decoded["width"], 3)
    assert browser_pixels.shape == pillow.shape
    levels = np.abs(browser_pixels - pillow.astype(np.int16))
    print(f"\nJPEG by Chromium's decoder against Pillow's: max {levels.max()} levels, mean {levels.mean():.4f}, "
          f"{(levels > 0).mean():.2%} of values differ")
    assert levels.max() == 0  # both libjpeg-turbo, its integer IDCT and smooth upsampling


def test_a_batch_job_labels_a_folder_of_photographs_as_the_runtime(vision_exports: dict[str, Path],
                                                                   tmp_path: Path) -> None:  # fmt: skip
    """``edgeattn batch`` over a folder (a row an image file, its path its id): embeddings and labels
    equal to the runtime's; a damaged file is that row's error."""
    pytest.importorskip("pyarrow")
    from edgeattn.serving.batch import read_output

    photos = tmp_path / "photos"
    (photos / "more").mkdir(parents=True)
    for k, path in enumerate(sample_photos()):
        (photos / ("more" if k else "") / path.name).write_bytes(path.read_bytes())
    (photos / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 20)
    export = vision_exports["vit-classifier"]
    result = CliRunner().invoke(cli, ["batch", str(export), "--input", str(photos), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "4 rows in 1 parts: 1 written, 0 already there, 1 row(s) with an error" in result.output
    records = {r["id"]: r for r in read_output(tmp_path / "out")}
    assert "damaged" in records["broken.png"]["error"] or "not an image" in records["broken.png"]["error"]
    model = load(export)
    for k, path in enumerate(sample_photos()):
        record = records[("more/" if k else "") + path.name]
        np.testing.assert_allclose(record["embedding"], model.embed(path)[0], atol=1e-5)
        assert record["label"] == model.classify(path)[0].label and record["error"] is None
