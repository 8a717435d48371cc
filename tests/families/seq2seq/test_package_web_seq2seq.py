"""A seq2seq model (T5) for the browser and Node.js: its encoder, cross projections and decoder
over a cache of fixed capacity in one bundle, the ES module's answers, streams and first-step
logits equal to the Python runtime's on onnxruntime-node and onnxruntime-web."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.t5_folders import T5_CORPUS, t5_folder

pytest.importorskip("transformers")
from edgeattn.exporters.export import export_model  # noqa: E402
from edgeattn.exporters.web import FP32_ABSOLUTE, FP32_RELATIVE, check_and_record, default_precision, package_web  # noqa: E402
from edgeattn.runtime.manifest import read_manifest, sha256_file  # noqa: E402
from edgeattn.sources import resolve_model  # noqa: E402


@pytest.fixture(scope="module")
def t5_export(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("web-t5")
    source = resolve_model(from_hf=t5_folder(root / "hf", "v1.1"))
    export_model(source.model, root / "out", **source.export_fields())
    return root / "out"


@pytest.mark.parametrize("target", ["node", "web"])
def test_a_seq2seq_bundle_answers_as_the_python_runtime(t5_export, node_modules, tmp_path, target):
    assert default_precision(read_manifest(t5_export), target) == "fp32"
    bundle = package_web(t5_export, tmp_path / target, target)
    assert [(f["graph"], f["file"]) for f in bundle.files] == [(g, f"onnx/{g}.onnx")
                                                               for g in ("encoder", "cross_kv", "decoder_fixed")]
    described = json.loads((tmp_path / target / "bundle.json").read_text())
    assert described["task"] == "generate" and described["family"] == "seq2seq"
    assert all(f["sha256"] == sha256_file(tmp_path / target / f["file"]) for f in described["files"])
    assert not (tmp_path / target / "config.json").exists()  # transformers.js's seq2seq decoders take another cache
    texts = T5_CORPUS[:3]
    checks = check_and_record(tmp_path / target, t5_export, node_modules, texts)
    assert [c.runtime for c in checks] == ["onnxruntime-node", "onnxruntime-web"]
    for c in checks:  # the source ids, first-step logits (within the float32 bar), greedy answers and a stream
        assert c.passed and c.tokens_equal and c.labels_equal and c.agreement == 1.0, c
        assert c.max_abs <= FP32_ABSOLUTE + FP32_RELATIVE * 100, c  # logits far below 100: never the loose end


STOP_RUN = """
import * as ort from "onnxruntime-node";
import {{ load }} from {module};
const model = await load({base}, ort, {{ precision: "fp32" }});
const out = {{ stop: await model.generateText({texts}, {{ maxNewTokens: 10, stop: [{stop}] }}), stream: [] }};
for await (const piece of model.stream({texts}[{row}], {{ maxNewTokens: 10, stop: [{stop}] }})) out.stream.push(piece);
console.log(JSON.stringify(out));
"""


def test_a_seq2seq_bundle_stops_at_stop_strings_as_the_python_runtime(t5_export, node_modules, tmp_path):
    """The ES module's answers and streams end before a stop string, as the Python runtime's: the
    text assembly both language families share, on each side."""
    import subprocess
    import tempfile

    from edgeattn.exporters.web import bundle_runtime

    package_web(t5_export, tmp_path / "node", "node")
    model = bundle_runtime(t5_export, tmp_path / "node", "fp32")
    texts = T5_CORPUS[:3]
    answers = model.generate_text(texts, 10)
    longest = max(answers, key=len)
    row, stop = answers.index(longest), longest[len(longest) // 2 :][:2]
    want = model.generate_text(texts, 10, stop=[stop])
    assert want[row] == longest[: longest.index(stop)]
    with tempfile.TemporaryDirectory(dir=node_modules.parent) as work:  # where "onnxruntime-node" resolves
        script = Path(work) / "run.mjs"
        script.write_text(STOP_RUN.format(module=json.dumps((tmp_path / "node" / "edgeattn.mjs").as_uri()),
                                          base=json.dumps(str(tmp_path / "node")), texts=json.dumps(texts),
                                          stop=json.dumps(stop), row=row))  # fmt: skip
        done = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=300, cwd=work)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["stop"] == want
    assert "".join(got["stream"]) == want[row] == "".join(model.stream_text(texts[row], 10, stop=[stop]))
