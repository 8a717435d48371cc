"""The web bundle in a real browser: ``edgeattn serve-web``'s page in headless Chromium (Debian's
chromium, driven by Playwright), cross-origin isolated, giving the labels, probabilities and
nearest texts the Python runtime gives; a screenshot of what it shows."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.bundles import BUNDLE_TEXTS, bert_export  # noqa: F401 - the npm fixture

pytest.importorskip("transformers")
from edgeattn.exporters.web import package_web  # noqa: E402
from edgeattn.runtime import load  # noqa: E402
from edgeattn.serving.web_page import WebPageServer  # noqa: E402


def _open(browser, server: WebPageServer):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url)
    page.wait_for_function("window.edgeattnReady === true || window.edgeattnError !== undefined", timeout=60000)
    assert page.evaluate("window.edgeattnError") is None and not errors, (page.inner_text("#status"), errors)
    return page


def _run(page, texts: list[str]) -> dict:
    page.evaluate("window.edgeattnResult = undefined")
    page.fill("#texts", "\n".join(texts))
    page.click("#run")
    page.wait_for_function("window.edgeattnResult !== undefined", timeout=60000)
    return page.evaluate("window.edgeattnResult")


def test_the_page_classifies_in_chromium_as_the_python_runtime(tmp_path, node_modules, browser):
    export = bert_export(tmp_path / "classifier", "ForSequenceClassification")
    package_web(export, tmp_path / "web", "web", ["fp32", "int8"])
    with WebPageServer(tmp_path / "web", port=0, ort_dist=node_modules / "onnxruntime-web" / "dist") as server:
        page = _open(browser, server)
        status = page.inner_text("#status")
        assert "loaded onnx/model.onnx" in status and "not cross-origin isolated" not in status, status
        for precision, file in (("fp32", "onnx/model.onnx"), ("int8", "onnx/model_quantized.onnx")):
            if precision != "fp32":
                page.select_option("#precision", precision)
                page.wait_for_function(f"document.querySelector('#status').textContent.includes('loaded {file}')")
            shown = _run(page, BUNDLE_TEXTS)
            want = load(export, providers=["CPUExecutionProvider"], precision=precision).classify(BUNDLE_TEXTS)
            assert [c["label"] for c in shown["classify"]] == [c.label for c in want]
            for got, expected in zip(shown["classify"], want, strict=True):
                assert max(abs(got["scores"][k] - v) for k, v in expected.scores.items()) < 1e-4
            cells = page.locator("td.label").all_inner_texts()
            assert cells == [c.label for c in want]  # what the page shows
        page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
        assert (tmp_path / "page.png").stat().st_size > 5000
        assert "text(s) in" in page.inner_text("#timing")


def test_the_page_finds_nearest_texts_in_chromium(tmp_path, node_modules, browser):
    export = bert_export(tmp_path / "embedder", "Model")
    bundle = package_web(export, tmp_path / "web", "web")  # the default: the gated int8
    assert [f["precision"] for f in bundle.files] == ["int8"]
    with WebPageServer(tmp_path / "web", port=0, ort_dist=node_modules / "onnxruntime-web" / "dist") as server:
        page = _open(browser, server)
        shown = _run(page, BUNDLE_TEXTS)
        want = load(export, providers=["CPUExecutionProvider"], precision="int8").embed(BUNDLE_TEXTS)
        np.testing.assert_allclose(np.array(shown["embed"], np.float32), want, atol=1e-4)
        cosine = want @ want.T
        np.fill_diagonal(cosine, -np.inf)
        nearest = [BUNDLE_TEXTS[j] for j in cosine.argmax(1)]
        assert page.locator("td.label").all_inner_texts() == nearest


def test_the_page_shows_the_entities_in_chromium(tmp_path, node_modules, browser):
    from tests.helpers.bundles import HARD_TEXTS
    from tests.helpers.encoder_folders import text_export

    _, _, runtime = text_export(tmp_path, "Bert", "ForTokenClassification")
    package_web(tmp_path / "out", tmp_path / "web", "web", ["fp32"])
    with WebPageServer(tmp_path / "web", port=0, ort_dist=node_modules / "onnxruntime-web" / "dist") as server:
        page = _open(browser, server)
        shown = _run(page, HARD_TEXTS)
        want = runtime.tag(HARD_TEXTS)
        assert [[(e["entity_group"], e["start"], e["end"], e["word"]) for e in row] for row in shown["tag"]] == [
            [(e.entity_group, e.start, e.end, e.word) for e in row] for row in want]  # fmt: skip
        cells = page.locator("td.label").all_inner_texts()
        assert cells[0] == (", ".join(f"{e.entity_group}: {e.word}" for e in want[0]) or "-")


def test_the_page_streams_a_language_models_continuations_in_chromium(tmp_path, node_modules, browser):
    """A page's default precision of a language model (its gated int8, remade for ONNX Runtime
    1.30): each prompt's continuation, streamed into the page, as the Python runtime over the same
    file gives it."""
    from edgeattn.exporters.web import bundle_runtime
    from tests.helpers import causal_folders
    from tests.helpers.bundles import PROMPTS

    export = causal_folders.export_trained(tmp_path, "int8")
    bundle = package_web(export, tmp_path / "web", "web")
    assert [f["precision"] for f in bundle.files] == ["int8"]
    with WebPageServer(tmp_path / "web", port=0, ort_dist=node_modules / "onnxruntime-web" / "dist") as server:
        page = _open(browser, server)
        page.evaluate("window.edgeattnSteps = 12")
        shown = _run(page, PROMPTS)
        runtime = bundle_runtime(export, tmp_path / "web", "int8")
        want = ["".join(runtime.stream_text(p, 12)) for p in PROMPTS]
        assert shown["complete"] == want
        assert page.locator("td.label").all_inner_texts() == [w.strip() for w in want]  # what the page shows
        assert "at most 12 new tokens each" in page.inner_text("#timing")


#: Chromium's software WebGPU adapter (SwiftShader): WebGPU with no GPU, as CI has none
WEBGPU_FLAGS = ["--no-sandbox", "--enable-unsafe-webgpu", "--enable-unsafe-swiftshader",
                "--use-webgpu-adapter=swiftshader"]  # fmt: skip


@pytest.fixture(scope="module")
def gpu_browser(chromium, driver):
    launched = driver.chromium.launch(executable_path=chromium, args=WEBGPU_FLAGS)
    yield launched
    launched.close()


def _on_webgpu(page, precision: str, file: str) -> None:
    """The page's model at ``precision`` (its ``file``) loaded on the WebGPU backend (a skip where
    the browser offers no adapter)."""
    if "webgpu" not in page.locator("#backend option").all_inner_texts():
        pytest.skip("this Chromium offers no WebGPU adapter, not even SwiftShader's")
    page.select_option("#backend", "webgpu")
    page.select_option("#precision", precision)
    page.wait_for_function(f"document.querySelector('#status').textContent.includes('loaded {file} in') && "
                           "document.querySelector('#status').textContent.includes('on webgpu')")  # fmt: skip


def test_the_page_classifies_on_webgpu_as_the_python_runtime(tmp_path, node_modules, gpu_browser):
    """onnxruntime-web's WebGPU backend (on Chromium's software adapter): the labels and
    probabilities of the Python runtime at fp32 and int8."""
    export = bert_export(tmp_path / "classifier", "ForSequenceClassification")
    package_web(export, tmp_path / "web", "web", ["fp32", "int8"])
    with WebPageServer(tmp_path / "web", port=0, ort_dist=node_modules / "onnxruntime-web" / "dist") as server:
        page = _open(gpu_browser, server)
        for precision, file in (("fp32", "onnx/model.onnx"), ("int8", "onnx/model_quantized.onnx")):
            _on_webgpu(page, precision, file)
            shown = _run(page, BUNDLE_TEXTS)
            assert shown["backend"] == "webgpu"
            want = load(export, providers=["CPUExecutionProvider"], precision=precision).classify(BUNDLE_TEXTS)
            assert [c["label"] for c in shown["classify"]] == [c.label for c in want]
            for got, expected in zip(shown["classify"], want, strict=True):
                assert max(abs(got["scores"][k] - v) for k, v in expected.scores.items()) < 1e-4


def test_a_language_model_streams_on_webgpu_as_the_python_runtime(tmp_path, node_modules, gpu_browser):
    """A language model's int8 and int4 (remade for ONNX Runtime 1.30) on the WebGPU backend: each
    prompt's continuation as the Python runtime over the same file gives it."""
    from edgeattn.exporters.web import bundle_runtime
    from tests.helpers import causal_folders
    from tests.helpers.bundles import PROMPTS

    export = causal_folders.export_trained(tmp_path, "int8,int4")
    bundle = package_web(export, tmp_path / "web", "web", ["int8", "int4"])
    assert all(f["webgpu"] == {"runs": True, "why": None} for f in bundle.files)  # nothing the WebGPU build refuses
    with WebPageServer(tmp_path / "web", port=0, ort_dist=node_modules / "onnxruntime-web" / "dist") as server:
        page = _open(gpu_browser, server)
        page.evaluate("window.edgeattnSteps = 12")
        for precision, file in (("int8", "onnx/model_quantized.onnx"), ("int4", "onnx/model_q4.onnx")):
            _on_webgpu(page, precision, file)
            shown = _run(page, PROMPTS)
            runtime = bundle_runtime(export, tmp_path / "web", precision)
            assert shown["backend"] == "webgpu"
            assert shown["complete"] == ["".join(runtime.stream_text(p, 12)) for p in PROMPTS]


def test_the_page_streams_a_seq2seq_models_answers_in_chromium(tmp_path, node_modules, browser):
    """A T5 export's bundle: each text's answer streamed into the page, as the Python runtime gives it."""
    from edgeattn.exporters.export import export_model
    from edgeattn.sources import resolve_model
    from tests.helpers.t5_folders import T5_CORPUS, t5_folder

    source = resolve_model(from_hf=t5_folder(tmp_path / "hf", "v1.1"))
    export_model(source.model, tmp_path / "out", **source.export_fields())
    package_web(tmp_path / "out", tmp_path / "web", "web")
    with WebPageServer(tmp_path / "web", port=0, ort_dist=node_modules / "onnxruntime-web" / "dist") as server:
        page = _open(browser, server)
        page.evaluate("window.edgeattnSteps = 10")
        shown = _run(page, T5_CORPUS[:2])
        runtime = load(tmp_path / "out", providers=["CPUExecutionProvider"])
        assert shown["complete"] == ["".join(runtime.stream_text(t, 10)) for t in T5_CORPUS[:2]]
