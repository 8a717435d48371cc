"""The browser and Node.js targets (``edgeattn package --target web|node``): an encoder bundle whose
ES module, run under Node.js on onnxruntime-node and on onnxruntime-web's wasm backend, gives the
token ids, embeddings and labels the Python runtime gives."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.helpers.bundles import BUNDLE_TEXTS, HARD_TEXTS, bert_export

pytest.importorskip("transformers")

from edgeattn.cli import cli  # noqa: E402
from edgeattn.errors import ExportError  # noqa: E402
from edgeattn.exporters.export import export_model  # noqa: E402
from edgeattn.exporters.web import ORT_PACKAGES, check_and_record, check_bundle, package_web  # noqa: E402
from edgeattn.runtime import load  # noqa: E402
from edgeattn.runtime.manifest import sha256_file  # noqa: E402
from edgeattn.sources import resolve_model  # noqa: E402


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    return bert_export(tmp_path_factory.mktemp("classifier"), "ForSequenceClassification")


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Path:
    return bert_export(tmp_path_factory.mktemp("embedder"), "Model")


@pytest.mark.parametrize("target", ["node", "web"])
def test_a_classifier_bundle_answers_as_the_python_runtime_on_both_runtimes(classifier, node_modules, tmp_path,
                                                                           target):  # fmt: skip
    out = tmp_path / target
    bundle = package_web(classifier, out, target, ["fp32", "int8"])
    page = ["index.html"] if target == "web" else []
    assert {p.name for p in out.iterdir()} == {"bundle.json", "package.json", "tokenizer.json", "edgeattn.mjs",
                                               "tokenizers.min.mjs", "tokenizers.LICENSE", "onnx", "config.json",
                                               "tokenizer_config.json", *page}  # fmt: skip
    assert sorted(p.name for p in (out / "onnx").iterdir()) == ["model.onnx", "model_quantized.onnx"]
    described = json.loads((out / "bundle.json").read_text())
    assert described["task"] == "classify" and described["labels"] and described["closing_special_tokens"] == 1
    assert all(f["sha256"] == sha256_file(out / f["file"]) for f in described["files"])
    package = ORT_PACKAGES[target][0]
    assert json.loads((out / "package.json").read_text())["dependencies"] == {package: ORT_PACKAGES[target][1]}
    assert bundle.total_bytes == sum(f["bytes"] for f in described["files"])
    for runtime in ("onnxruntime-node", "onnxruntime-web"):  # either runs the same module
        checks = check_bundle(out, classifier, node_modules, BUNDLE_TEXTS, runtime)
        assert [c.precision for c in checks] == ["fp32", "int8"]
        for c in checks:
            assert c.passed and c.tokens_equal and c.labels_equal, c
            if c.precision == "fp32":
                assert c.max_abs < 1e-4, c


def test_an_embedding_bundle_pools_as_the_export_says(embedder, node_modules, tmp_path):
    out = tmp_path / "web"
    bundle = package_web(embedder, out, "web")
    assert [f["precision"] for f in bundle.files] == ["int8"]  # the gated int8 by default
    described = json.loads((out / "bundle.json").read_text())
    assert described["task"] == "encode" and described["pooling"] == {"mode": "mean", "normalize": True}
    checks = check_bundle(out, embedder, node_modules, BUNDLE_TEXTS, "onnxruntime-web")
    assert len(checks) == 1 and checks[0].passed and checks[0].worst_cosine > 0.99999, checks


def test_a_check_that_differs_fails(embedder, node_modules, tmp_path, monkeypatch):
    """The same bundle judged against answers 1e-2 away fails: the check can fail."""
    import numpy as np

    import edgeattn.runtime as rt

    out = tmp_path / "node"
    package_web(embedder, out, "node")
    real = rt.load

    def shifted(*args, **kwargs):
        model = real(*args, **kwargs)
        embed = model.embed
        model.embed = lambda texts: embed(texts) + np.float32(1e-2)
        return model

    monkeypatch.setattr(rt, "load", shifted)
    checks = check_bundle(out, embedder, node_modules, BUNDLE_TEXTS, "onnxruntime-node")
    assert not checks[0].passed and checks[0].max_abs > 5e-3, checks


def test_what_the_targets_cannot_run_is_refused_with_the_reason(tmp_path):
    source = resolve_model()
    export_model(source.model, tmp_path / "sorter", verify=False, tokenizer=source.tokenizer, task=source.task)
    with pytest.raises(ExportError, match="take text through the export's Hugging Face tokenizer.json"):
        package_web(tmp_path / "sorter", tmp_path / "x", "web")  # edgeattn's word tokenizer: no tokenizers.js
    assert not (tmp_path / "x").exists()


def test_tagging_needs_a_tokenizer_the_module_can_align(tmp_path):
    from edgeattn.exporters.web import tagging_settings

    unigram = tmp_path / "tokenizer.json"
    unigram.write_text(json.dumps({"model": {"type": "Unigram"}, "normalizer": {"type": "Nmt"},
                                   "pre_tokenizer": {"type": "Metaspace"}, "added_tokens": []}))  # fmt: skip
    with pytest.raises(ExportError, match="WordPiece .* byte-level BPE .* this one is Unigram with Nmt"):
        tagging_settings(unigram)


def test_a_tagger_bundle_finds_the_entities_the_python_runtime_finds(node_modules, tmp_path):
    """Entities (type, character span, word, score within 1e-4), simple and first aggregation, on
    both runtimes: the module places each WordPiece piece in the text itself."""
    from tests.helpers.encoder_folders import text_export

    _, _, runtime = text_export(tmp_path, "Bert", "ForTokenClassification")
    assert sum(len(found) for found in runtime.tag(HARD_TEXTS)) > 5
    package_web(tmp_path / "out", tmp_path / "node", "node")
    described = json.loads((tmp_path / "node" / "bundle.json").read_text())
    assert described["task"] == "tag" and described["tagging"]["prefix"] == "##"
    checks = check_and_record(tmp_path / "node", tmp_path / "out", node_modules, HARD_TEXTS)
    assert len(checks) == 2 and all(c.passed and c.labels_equal for c in checks), checks


def _bytelevel_tokenizer() -> tuple:
    """A byte-level BPE tokenizer trained here with RoBERTa's settings (no prefix space, offsets
    trimmed of the spaces tokens carry)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok, trainers.BpeTrainer(vocab_size=360, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()), \
        lambda t: processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False)


def _unigram_tokenizer() -> tuple:
    """A SentencePiece-style Unigram tokenizer trained here, as XLM-R's is made (Metaspace, NFKC,
    runs of spaces made one; its Precompiled character map aside, which only training by
    sentencepiece writes)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace()
    return tok, trainers.UnigramTrainer(vocab_size=150, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                        unk_token="<unk>"), \
        lambda t: processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])


def _roberta_tagger(root: Path, tokenizer: tuple) -> Path:
    """A RoBERTa tagger with ``tokenizer`` (a tokenizer, its trainer and post-processor) trained
    here on the corpus and the hard texts, exported at fp32."""
    import torch
    import transformers

    from tests.helpers.encoder_folders import CORPUS, LABELS

    tok, trainer, post = tokenizer
    tok.train_from_iterator(CORPUS * 3 + HARD_TEXTS, trainer)
    tok.post_processor = post(tok)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>", pad_token="<pad>", cls_token="<s>", sep_token="</s>")
    torch.manual_seed(0)
    config = transformers.RobertaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=37,
                                        num_hidden_layers=2, num_attention_heads=4, pad_token_id=1, type_vocab_size=1,
                                        max_position_embeddings=130, id2label=LABELS,
                                        label2id={v: k for k, v in LABELS.items()})  # fmt: skip
    model = transformers.RobertaForTokenClassification(config).eval()
    with torch.no_grad():  # sharper logits: entities of several kinds
        model.classifier.weight.mul_(40.0)
    model.save_pretrained(root / "hf")
    fast.save_pretrained(root / "hf")
    source = resolve_model(from_hf=root / "hf")
    fields = {k: v for k, v in source.export_fields().items() if k != "heldout_texts"}
    export_model(source.model, root / "out", graphs=["encoder"], verify=False, **fields)
    return root / "out"


@pytest.mark.parametrize(("tokenizer", "kind"), [(_bytelevel_tokenizer, "bytelevel"),
                                                 (_unigram_tokenizer, "metaspace")])  # fmt: skip
def test_bpe_and_unigram_taggers_find_the_entities_the_python_runtime_finds(node_modules, tmp_path, tokenizer, kind):
    """RoBERTa's byte-level BPE (each token placed by the UTF-8 bytes it holds, multi-byte
    characters split across tokens among them, spaces trimmed as Python's tokenizers trims them)
    and XLM-R's kind of Unigram (pieces found in the normalised text: NFKC's ligatures, runs of
    spaces made one, unknown pieces)."""
    export = _roberta_tagger(tmp_path, tokenizer())
    runtime = load(export, providers=["CPUExecutionProvider"])
    # a ligature NFKC makes two letters; characters no training text held (unknown pieces)
    texts = [*HARD_TEXTS, "The \ufb01nal  word, in   Paris", "\u03a9mega \u2603 snow in Warsaw"]
    assert sum(len(found) for found in runtime.tag(texts)) > 5
    package_web(export, tmp_path / "node", "node", ["fp32"])
    described = json.loads((tmp_path / "node" / "bundle.json").read_text())
    assert described["tagging"]["kind"] == kind
    checks = check_and_record(tmp_path / "node", export, node_modules, texts)
    assert len(checks) == 2 and all(c.passed and c.labels_equal for c in checks), checks


def test_the_command_line_writes_a_node_bundle(embedder, tmp_path):
    result = CliRunner().invoke(cli, ["package", str(embedder), "--target", "node", "-o", str(tmp_path / "n"),
                                      "--precision", "int8"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"wrote {tmp_path / 'n'} (node: 1 files" in result.output
    assert (tmp_path / "n" / "onnx" / "model_quantized.onnx").is_file()
    assert not (tmp_path / "n" / "onnx" / "model.onnx").exists()


def test_packaging_for_the_web_needs_no_torch(embedder, tmp_path):
    from tests.helpers.torch_free import run_without_torch

    run_without_torch("from edgeattn.exporters.web import package_web\n"
                      f"package_web({str(embedder)!r}, {str(tmp_path / 'web')!r}, 'web', ['int8'])\n")  # fmt: skip
    assert (tmp_path / "web" / "onnx" / "model_quantized.onnx").is_file()


def test_serve_web_serves_the_page_cross_origin_isolated_and_refuses_other_bundles(embedder, tmp_path):
    import urllib.request

    from edgeattn.errors import EdgeattnError
    from edgeattn.serving.web_page import WebPageServer, cdn_module

    package_web(embedder, tmp_path / "node", "node")
    with pytest.raises(EdgeattnError, match="is a 'node' bundle; serve-web serves --target web bundles"):
        WebPageServer(tmp_path / "node", port=0)
    package_web(embedder, tmp_path / "web", "web")
    with WebPageServer(tmp_path / "web", port=0) as server:
        with urllib.request.urlopen(server.url, timeout=10) as response:
            page = response.read().decode()
            assert response.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
            assert response.headers["Cross-Origin-Opener-Policy"] == "same-origin"
        assert cdn_module("1.30.0") in page and "__ORT_MODULE__" not in page  # no local runtime: the CDN's
        with urllib.request.urlopen(server.url + "edgeattn.mjs", timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/javascript")


TRANSFORMERS_RUNNER = """
import {{ pipeline, env }} from "@huggingface/transformers";
import {{ writeFile }} from "node:fs/promises";
env.allowRemoteModels = false;
env.localModelPath = {root};
const out = {{}};
for (const dtype of ["fp32", "q8"]) {{
  const pipe = await pipeline({task}, {name}, {{ dtype }});
  out[dtype] = {task} === "text-classification" ? await pipe({texts}, {{ top_k: null }})
             : (await pipe({texts}, {{ pooling: "mean", normalize: true }})).tolist();
}}
await writeFile({result}, JSON.stringify(out));
"""


@pytest.mark.parametrize("which", ["classifier", "embedder"])
def test_transformers_js_loads_the_bundle_and_agrees(which, request, node_modules, tmp_path):
    """transformers.js (npm @huggingface/transformers) takes the bundle as a model folder of its own:
    its text-classification and feature-extraction pipelines, fp32 and q8, answer as the Python
    runtime does."""
    import numpy as np

    from edgeattn.runtime import load

    export = request.getfixturevalue(which)
    package_web(export, tmp_path / "bundle", "node", ["fp32", "int8"])
    task = "text-classification" if which == "classifier" else "feature-extraction"
    result = tmp_path / "result.json"
    script = node_modules.parent / f"run-{os.getpid()}-{which}.mjs"  # beside node_modules, to resolve the package
    script.write_text(TRANSFORMERS_RUNNER.format(root=json.dumps(str(tmp_path) + "/"), name=json.dumps("bundle"),
                                                 task=json.dumps(task), texts=json.dumps(BUNDLE_TEXTS),
                                                 result=json.dumps(str(result))))  # fmt: skip
    try:
        done = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=300)
    finally:
        script.unlink()
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(result.read_text())
    for dtype, precision in (("fp32", "fp32"), ("q8", "int8")):
        model = load(export, providers=["CPUExecutionProvider"], precision=precision)
        if which == "classifier":
            for found, want in zip(got[dtype], model.classify(BUNDLE_TEXTS), strict=True):
                assert found[0]["label"] == want.label
                assert max(abs(f["score"] - want.scores[f["label"]]) for f in found) < 1e-4
        else:
            np.testing.assert_allclose(np.array(got[dtype], np.float32), model.embed(BUNDLE_TEXTS), atol=1e-4)


SATURATING = """
import * as ort from "onnxruntime-node";
import {{ readFile, writeFile }} from "node:fs/promises";
import {{ createOptions }} from "{module}";
const session = await ort.InferenceSession.create(await readFile({model}), createOptions(ort));
const a = new ort.Tensor("uint8", Uint8Array.from({a}), [{rows}, 64]);
const out = await session.run({{ a }});
await writeFile({result}, JSON.stringify(Array.from(out.y.data)));
"""


def test_the_module_keeps_signed_int8_from_saturating_on_onnxruntime_node(node_modules, tmp_path):
    """The bundle's session options ask ONNX Runtime to turn signed int8 weights unsigned where the
    CPU lacks VNNI: products of 255 x 127 come out exact (on an AVX2 CPU without the option they
    saturate: 410,032 instead of 922,080)."""
    import numpy as np
    import onnx

    from edgeattn.exporters.web import ASSETS
    from tests.helpers.saturation import saturating_product

    model, a, want = saturating_product()
    onnx.save_model(model, str(tmp_path / "m.onnx"))
    script = node_modules.parent / f"saturate-{os.getpid()}.mjs"
    script.write_text(SATURATING.format(module=(ASSETS / "edgeattn.mjs").as_uri(),
                                        model=json.dumps(str(tmp_path / "m.onnx")), a=json.dumps(a.ravel().tolist()),
                                        rows=len(a), result=json.dumps(str(tmp_path / "y.json"))))  # fmt: skip
    try:
        done = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=120)
    finally:
        script.unlink()
    assert done.returncode == 0, done.stderr[-2000:]
    got = np.array(json.loads((tmp_path / "y.json").read_text())).reshape(want.shape)
    np.testing.assert_array_equal(got, want)


def test_the_command_line_checks_a_bundle_on_both_runtimes_and_keeps_the_table(classifier, node_modules, tmp_path):
    out = tmp_path / "w"
    result = CliRunner().invoke(cli, ["package", str(classifier), "--target", "web", "-o", str(out), "--precision",
                                      "fp32,int8", "--check-with", str(node_modules)])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("onnxruntime-")]
    assert len(rows) == 4 and all(line.rstrip().endswith("ok") for line in rows), result.output
    parity = json.loads((out / "bundle.json").read_text())["parity"]
    assert {(c["runtime"], c["precision"]) for c in parity["checks"]} == {
        (r, p) for r in ("onnxruntime-node", "onnxruntime-web") for p in ("fp32", "int8")}  # fmt: skip
    refused = CliRunner().invoke(cli, ["package", str(classifier), "--target", "mobile", "-o", str(tmp_path / "m"),
                                       "--check-with", str(node_modules)])  # fmt: skip
    assert refused.exit_code == 2 and "--check-with is for the web and node targets" in refused.output


def test_the_default_precision_is_the_gated_int8_else_fp32(embedder, tmp_path):
    from edgeattn.exporters.web import default_precision
    from edgeattn.runtime.manifest import read_manifest

    assert default_precision(read_manifest(embedder)) == "int8"
    plain = tmp_path / "plain"
    source = resolve_model(from_hf=embedder.parent / "hf")
    export_model(source.model, plain, graphs=["encoder"], verify=False, tokenizer=source.tokenizer, task=source.task)
    assert default_precision(read_manifest(plain)) == "fp32"
    manifest = json.loads((embedder / "manifest.json").read_text())
    manifest["graphs"]["encoder"]["precisions"]["int8"]["degraded"] = True
    (tmp_path / "degraded").mkdir()
    (tmp_path / "degraded" / "manifest.json").write_text(json.dumps(manifest))
    assert default_precision(read_manifest(tmp_path / "degraded")) == "fp32"
