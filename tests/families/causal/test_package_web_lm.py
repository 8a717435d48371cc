"""A language model for the browser and Node.js (``edgeattn package --target web|node`` of a
decoder-only export): the ES module generates, streams and chats as the Python runtime does on
onnxruntime-node and onnxruntime-web, over graphs the targets' ONNX Runtime 1.30 can run (the lint
finds what it cannot; int8 and int4 are remade from the plain graph and held to the gate's floor),
split into files under the size limit."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.helpers import causal_folders
from tests.helpers.bundles import PROMPTS

pytest.importorskip("transformers")
from edgeattn.exporters.web import FP32_ABSOLUTE, FP32_RELATIVE, bundle_runtime, check_and_record, package_web  # noqa: E402
from edgeattn.runtime.manifest import sha256_file  # noqa: E402


@pytest.fixture(scope="module")
def lm_export(tmp_path_factory) -> Path:
    return causal_folders.export_trained(tmp_path_factory.mktemp("web-lm"), "int8,int4")


@pytest.fixture(scope="module")
def lm_bundle(lm_export, tmp_path_factory) -> Path:
    """The node bundle at every precision, its files split at 30 KB (the 2 GB rule, scaled down)."""
    out = tmp_path_factory.mktemp("lm-bundle") / "node"
    package_web(lm_export, out, "node", ["fp32", "int8", "int4"], file_limit=30_000)
    return out


def test_a_language_model_bundle_generates_as_the_python_runtime_on_both_runtimes(lm_export, lm_bundle,
                                                                                node_modules):  # noqa: F811
    described = json.loads((lm_bundle / "bundle.json").read_text())
    assert described["task"] == "complete" and described["stop_ids"] and described["chat_template"]
    assert {"chat_template.json", "jinja.mjs", "jinja.LICENSE"} <= {p.name for p in lm_bundle.iterdir()}
    assert not (lm_bundle / "config.json").exists()  # transformers.js's decoders take another cache
    for entry in described["files"]:
        assert entry["sha256"] == sha256_file(lm_bundle / entry["file"])
        # split: no file over the limit (fp32's weights fill three files, the quantised ones' one)
        assert len(entry["external_data"]) >= (3 if entry["precision"] == "fp32" else 1), entry
        for part in entry["external_data"]:
            assert part["bytes"] <= 30_000 and part["sha256"] == sha256_file(lm_bundle / part["file"])
        made = entry.get("made_for_target")
        if entry["precision"] == "fp32":
            assert made is None  # the export's own graph: it passes the lint
        else:  # the export's fused GroupQueryAttention takes an input ONNX Runtime 1.30 lacks
            assert "GroupQueryAttention" in made["because"] and "takes 7 to 16" in made["because"], made
            assert made["top1_vs_fp32"] >= made["floor"] >= 0.85, made
            if entry["precision"] == "int4":  # remade as the export made it, GPTQ's fitted levels carried over
                quantization = made["quantization"]
                assert quantization["method"] == "gptq" and quantization["fitted_products"] > 0, quantization
                assert quantization["output_layer_bits"] == 8, quantization
    checks = check_and_record(lm_bundle, lm_export, node_modules, PROMPTS)
    assert [(c.runtime, c.precision) for c in checks] == [(r, p) for r in ("onnxruntime-node", "onnxruntime-web")
                                                          for p in ("fp32", "int8", "int4")]  # fmt: skip
    for c in checks:
        assert c.passed and c.tokens_equal, c
        if c.precision == "fp32":
            assert c.labels_equal and c.agreement == 1.0, c  # passed: logits within the float32 bar
            assert c.max_abs <= FP32_ABSOLUTE + FP32_RELATIVE * 100, c
    assert json.loads((lm_bundle / "bundle.json").read_text())["parity"]["checks"][0]["agreement"] == 1.0


def test_each_target_takes_the_precision_measured_fastest_for_it(lm_export):
    from edgeattn.exporters.web import default_precision
    from edgeattn.runtime.manifest import read_manifest

    manifest = read_manifest(lm_export)
    assert default_precision(manifest, "web") == "int8"  # wasm's int4 kernels decode ~12x slower
    assert default_precision(manifest, "node") == "int4"


RUN = """
import * as ort from "{package}";
import {{ load }} from {module};
const model = await load({base}, ort, {{ precision: "fp32" }});
const prompts = {prompts};
const out = {{}};
out.penalty = (await model.generate(prompts, {{ maxNewTokens: 12, repetitionPenalty: 3 }})).map((a) => a.tokens);
out.stop = await model.generateText(prompts, {{ maxNewTokens: 12, stop: ["sand", " the"] }});
out.streamStop = [];
for await (const piece of model.stream(prompts[3], {{ maxNewTokens: 12, stop: ["moon"] }})) out.streamStop.push(piece);
const sample = () => model.generate(prompts, {{ maxNewTokens: 12, temperature: 0.9, topK: 8, topP: 0.9, seed: 7 }});
out.sampled = [(await sample()).map((a) => a.tokens), (await sample()).map((a) => a.tokens)];
out.alone = (await model.generate([prompts[3]], {{ maxNewTokens: 12 }}))[0].tokens;
try {{ await model.generate(prompts, {{ maxNewTokens: 1000 }}); }} catch (e) {{ out.tooLong = e.message; }}
try {{ await model.generate(prompts, {{ strategy: "beam" }}); }} catch (e) {{ out.beam = e.message; }}
console.log(JSON.stringify(out));
"""


def test_penalty_stop_strings_sampling_and_errors_in_javascript(lm_export, lm_bundle, node_modules):  # noqa: F811
    with tempfile.TemporaryDirectory(dir=node_modules.parent) as work:  # where "onnxruntime-node" resolves
        script = Path(work) / "run.mjs"
        module = json.dumps((lm_bundle / "edgeattn.mjs").as_uri())
        script.write_text(RUN.format(package="onnxruntime-node", module=module, base=json.dumps(str(lm_bundle)),
                                     prompts=json.dumps(PROMPTS)))  # fmt: skip
        done = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=300, cwd=work)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    model = bundle_runtime(lm_export, lm_bundle, "fp32")
    penalised = model.generate_answers(PROMPTS, 12, repetition_penalty=3.0)
    assert got["penalty"] == [t.tolist() for _, t in penalised]
    assert got["penalty"] != [t.tolist() for _, t in model.generate_answers(PROMPTS, 12)]  # the penalty acts
    assert got["stop"] == model.generate_text(PROMPTS, 12, stop=["sand", " the"])
    assert "".join(got["streamStop"]) == "".join(model.stream_text(PROMPTS[3], 12, stop=["moon"]))
    assert got["sampled"][0] == got["sampled"][1]  # a seed repeats
    assert got["alone"] == model.generate_answers([PROMPTS[3]], 12)[0][1].tolist()  # batch-mates change nothing
    assert "leave no room for a prompt (max_len 128)" in got["tooLong"]
    assert "beam search is the Python runtime's" in got["beam"]
