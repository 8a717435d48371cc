"""The browser and Node.js targets: an encoder export as a folder a page or a Node.js program loads
with no build step, answering as the Python runtime does.

```
<out>/
  bundle.json             what it holds: files and sha256, the model's sizes, labels, pooling, inputs
  onnx/model.onnx         the encoder graph, self-contained; int8 as onnx/model_quantized.onnx and
                          int4 as onnx/model_q4.onnx (the names transformers.js loads), others as
                          onnx/model.<precision>.onnx
  config.json, tokenizer_config.json   what transformers.js reads beside them
  tokenizer.json          the export's Hugging Face tokenizer
  edgeattn.mjs            the ES module: load(base, ort) -> embed / classify / encode / tokenize
  tokenizers.min.mjs      tokenizers.js (Hugging Face's JavaScript tokenizers, Apache-2.0), vendored
  package.json            the ONNX Runtime for JavaScript it runs on (onnxruntime-web or -node)
  index.html              web: a page that runs it (edgeattn serve-web)
```

Encoders only; tagging with WordPiece tokenizers (BERT, DistilBERT, ELECTRA), whose pieces the
module aligns to the text itself (tokenizers.js gives no character offsets). :func:`check_bundle`
runs a bundle under Node.js and compares its tokens and answers with the Python runtime's.
Torch-free (onnx).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgeattn import __version__
from edgeattn.errors import ExportError
from edgeattn.exporters.mobile import cpu_precisions
from edgeattn.exporters.outdir import check_output_dir, move_into_place
from edgeattn.runtime.layout import partial_prefix
from edgeattn.runtime.manifest import Manifest, check_file, read_manifest, sha256_file
from edgeattn.runtime.text import label_names
from edgeattn.tables import table_lines

log = logging.getLogger(__name__)

TARGETS = ("web", "node")
#: the npm package each target runs on, at the version the bundle is tested with
ORT_PACKAGES = {"web": ("onnxruntime-web", "1.30.0"), "node": ("onnxruntime-node", "1.30.0")}
BUNDLE = "bundle.json"
MODULE = "edgeattn.mjs"
#: the web bundle's page (``edgeattn serve-web`` serves it; any server with cross-origin isolation can)
PAGE = "index.html"
TOKENIZERS_JS = ("tokenizers.min.mjs", "tokenizers.LICENSE")
#: protobuf and the browser's ArrayBuffer both stop near 2 GB
WEB_LIMIT = (1 << 31) - 1
ASSETS = Path(__file__).resolve().parent / "js"


@dataclass
class WebBundle:
    """What :func:`package_web` wrote."""

    path: Path
    target: str
    files: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(f["bytes"] for f in self.files)


#: a precision's file name where transformers.js has one (its ``dtype``: fp32, q8, q4)
TRANSFORMERS_JS_NAMES = {"fp32": "model.onnx", "int8": "model_quantized.onnx", "int4": "model_q4.onnx"}
#: the ``dtype`` transformers.js loads each of those files with
TRANSFORMERS_JS_DTYPES = {"fp32": "fp32", "int8": "q8", "int4": "q4"}


def model_file(precision: str) -> str:
    """Where a precision's graph lies in the bundle (transformers.js's layout)."""
    return "onnx/" + TRANSFORMERS_JS_NAMES.get(precision, f"model.{precision}.onnx")


def package_web(export_dir: str | Path, out_dir: str | Path, target: str = "web", precisions: list[str] | None = None,
                force: bool = False) -> WebBundle:  # fmt: skip
    """Write the ``target`` (web or node) bundle of the encoder export ``export_dir`` at
    ``precisions`` (default: :func:`default_precision`) to ``out_dir``; :class:`ExportError` for an export the target
    cannot run yet, leaving ``out_dir`` as it was."""
    if target not in TARGETS:
        raise ExportError(f"target must be one of {', '.join(TARGETS)}, not {target!r}")
    export_dir, out_dir = Path(export_dir), Path(out_dir)
    manifest = read_manifest(export_dir)
    _check_runs(manifest)
    chosen = cpu_precisions(manifest, precisions or [default_precision(manifest)])
    check_output_dir(out_dir, force)
    parent = out_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=partial_prefix(out_dir.name), dir=parent))
    assert manifest.tokenizer is not None
    tagging = None
    if manifest.config.head == "token":
        tagging = tagging_settings(check_file(export_dir, manifest.tokenizer))
    try:
        bundle = WebBundle(out_dir, target)
        checked: set[tuple[str, str]] = set()
        for precision in chosen:
            model = onnx.load(str(check_file(export_dir, manifest.entry("encoder", precision), checked)))
            if model.ByteSize() > WEB_LIMIT:
                raise ExportError(f"the {precision} encoder is {model.ByteSize() / 1e9:.2f} GB; a browser takes one "
                                  "model file under 2 GB: package int8")  # fmt: skip
            path = tmp / model_file(precision)
            path.parent.mkdir(exist_ok=True)
            onnx.save_model(model, str(path))
            bundle.files.append({"file": model_file(precision), "precision": precision, "sha256": sha256_file(path),
                                 "bytes": path.stat().st_size,
                                 "transformers_js_dtype": TRANSFORMERS_JS_DTYPES.get(precision)})  # fmt: skip
        assert manifest.tokenizer is not None
        shutil.copy2(check_file(export_dir, manifest.tokenizer, checked), tmp / "tokenizer.json")
        for name in (MODULE, *TOKENIZERS_JS, *([PAGE] if target == "web" else [])):
            shutil.copy2(ASSETS / name, tmp / name)
        package, version = ORT_PACKAGES[target]
        npm = {"name": _npm_name(out_dir.name), "private": True, "type": "module", "main": MODULE,
               "dependencies": {package: version}}  # fmt: skip
        (tmp / "package.json").write_text(json.dumps(npm, indent=2) + "\n")
        described = {**_describe(bundle, manifest, export_dir, tmp), "tagging": tagging}
        (tmp / BUNDLE).write_text(json.dumps(described, indent=2) + "\n")
        _transformers_js_files(manifest, tmp)
        move_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("wrote the %s bundle %s (%s)", target, out_dir, ", ".join(f["file"] for f in bundle.files))
    return bundle


def default_precision(manifest: Manifest) -> str:
    """What a web or node bundle holds when no precision is named: the export's int8 encoder where it
    passed the accuracy gate (measured, benchmarks/results/targets.json: BERT-base at 1x128 2.4x
    faster than fp32 in Chromium's wasm on 2 threads, 1.6x on 1, and a quarter of the bytes to
    download), else fp32."""
    variant = manifest.graphs["encoder"].precisions.get("int8")
    return "int8" if variant is not None and not variant.degraded else "fp32"


def _check_runs(manifest: Manifest) -> None:
    """An ExportError saying why the web and node targets cannot run this export, if they cannot."""
    if manifest.family_name != "encoder":
        raise ExportError(f"the web and node targets run encoder exports (embed, classify, encode) today; this is a "
                          f"{manifest.family_name} export: package it for --target mobile, or serve it")  # fmt: skip
    if manifest.tokenizer is None or not manifest.tokenizer.file.endswith(".json"):
        raise ExportError("the web and node targets take text through the export's Hugging Face tokenizer.json, "
                          "which this export lacks")  # fmt: skip


def tagging_settings(tokenizer_path: Path) -> dict[str, Any]:
    """What the module needs to give each token its character span (tokenizers.js gives none): the
    WordPiece settings and the Bert normalizer's; ExportError for a tokenizer it cannot align."""
    described = json.loads(tokenizer_path.read_text(encoding="utf-8"))
    model, normalizer = described.get("model") or {}, described.get("normalizer") or {}
    if model.get("type") != "WordPiece" or normalizer.get("type") not in ("BertNormalizer", None):
        raise ExportError("the web and node targets tag with WordPiece tokenizers (BERT, DistilBERT, ELECTRA), "
                          f"whose pieces they align to the text; this one is {model.get('type')} with "
                          f"{normalizer.get('type')}")  # fmt: skip
    return {"specials": [t["content"] for t in described.get("added_tokens", []) if t.get("special")],
            "prefix": model.get("continuing_subword_prefix", "##"), "unk": model.get("unk_token"),
            "lowercase": bool(normalizer.get("lowercase", False)), "strip_accents": normalizer.get("strip_accents")}


def _transformers_js_files(manifest: Manifest, out: Path) -> None:
    """``config.json`` and ``tokenizer_config.json`` as transformers.js reads them beside ``onnx/``:
    the architecture, the labels, the tokenizer's padding token and length."""
    from tokenizers import Tokenizer

    config = manifest.config
    architecture = manifest.architecture or ("BertForSequenceClassification" if config.head == "sequence"
                                             else "BertModel")  # fmt: skip
    model_type = {"Bert": "bert", "Roberta": "roberta", "XLMRoberta": "xlm-roberta", "DistilBert": "distilbert",
                  "Electra": "electra", "MPNet": "mpnet"}  # fmt: skip
    found = next((t for prefix, t in sorted(model_type.items(), key=lambda kv: -len(kv[0]))
                  if architecture.startswith(prefix)), "bert")  # fmt: skip
    described: dict[str, Any] = {"model_type": found, "architectures": [architecture], "hidden_size": config.d_model,
                                 "num_attention_heads": config.n_heads, "num_hidden_layers": config.n_encoder_layers,
                                 "max_position_embeddings": config.max_len, "pad_token_id": config.pad_id}  # fmt: skip
    if config.head in ("sequence", "token"):
        labels = label_names(manifest.labels, config.num_labels)
        described["id2label"] = {str(i): name for i, name in enumerate(labels)}
        described["label2id"] = {name: i for i, name in enumerate(labels)}
    (out / "config.json").write_text(json.dumps(described, indent=2) + "\n")
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    pad = tokenizer.id_to_token(config.pad_id)
    (out / "tokenizer_config.json").write_text(json.dumps({"model_max_length": config.max_len, "pad_token": pad},
                                                          indent=2) + "\n")  # fmt: skip


def _npm_name(text: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-._" else "-" for c in text.lower()).strip("-._")
    return cleaned or "edgeattn-bundle"


def _closing_specials(tokenizer_path: Path) -> int:
    """How many special tokens the tokenizer's template closes a text with ([SEP], </s>): what
    truncation keeps, as the Python runtime does."""
    from tokenizers import Tokenizer

    encoding = Tokenizer.from_file(str(tokenizer_path)).encode("a")
    special = list(encoding.special_tokens_mask)
    tail = 0
    while tail < len(special) and special[len(special) - 1 - tail]:
        tail += 1
    return tail


def _describe(bundle: WebBundle, manifest: Manifest, export_dir: Path, tmp: Path) -> dict[str, Any]:
    config = manifest.config
    task = manifest.task or {"sequence": "classify", "token": "tag"}.get(config.head or "", "embed")
    pooling = manifest.pooling
    return {
        "target": bundle.target,
        "edgeattn_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "export": {"path": str(export_dir.resolve()), "source": manifest.source, "architecture": manifest.architecture,
                   "created": manifest.created},  # fmt: skip
        "task": task,
        "model": {"max_len": config.max_len, "pad_id": config.pad_id, "head": config.head,
                  "num_labels": config.num_labels, "token_types": config.token_types, "d_model": config.d_model},
        "labels": label_names(manifest.labels, config.num_labels) if config.head in ("sequence", "token") else None,
        "pooling": {"mode": pooling.mode if pooling else "mean", "normalize": pooling.normalize if pooling else True},
        "tokenizer": "tokenizer.json",
        "tokenizer_config": {},
        "closing_special_tokens": _closing_specials(tmp / "tokenizer.json"),
        "runtime": dict(zip(("package", "version"), ORT_PACKAGES[bundle.target], strict=True)),
        "inputs": [asdict(t) for t in manifest.graphs["encoder"].inputs],
        "outputs": [asdict(t) for t in manifest.graphs["encoder"].outputs],
        "files": bundle.files,
    }  # fmt: skip


# ------------------------------------------------------------------------------------ checking
RUNNER = """
import * as ort from "{package}";
import {{ load }} from "{module}";
import {{ writeFile }} from "node:fs/promises";
if (ort.env?.wasm) ort.env.wasm.numThreads = 1;
const texts = {texts};
const out = {{}};
for (const precision of {precisions}) {{
  const model = await load({base}, ort, {{ precision }});
  const tokens = model.tokenize(texts);
  const row = {{ ids: Array.from(tokens.ids, Number), width: tokens.width }};
  row.embed = (await model.embed(texts)).map((v) => Array.from(v));
  if (model.bundle.model.head === "sequence") row.classify = await model.classify(texts);
  if (model.bundle.model.head === "token") {{
    row.tag = await model.tag(texts);
    row.tag_first = await model.tag(texts, {{ aggregation: "first" }});
  }}
  out[precision] = row;
}}
await writeFile({result}, JSON.stringify(out));
"""


#: texts a bundle is checked on when none are given (any tokenizer takes them)
SAMPLE_TEXTS = ["The sea is calm tonight.", "A small model runs in the browser, and answers at once.",
                "Angela Merkel visited Paris in May 2019.", "ok"]  # fmt: skip


@dataclass
class BundleCheck:
    """One precision of a bundle run under Node.js against the Python runtime."""

    runtime: str
    precision: str
    tokens_equal: bool
    max_abs: float
    worst_cosine: float
    labels_equal: bool | None
    passed: bool


def _same_entities(want: list[list[Any]], got: list[list[dict[str, Any]]]) -> bool:
    """The same entities (type, span, word) in every text, their scores within 1e-4."""
    if len(want) != len(got) or any(len(w) != len(g) for w, g in zip(want, got, strict=True)):
        return False
    return all(e.entity_group == f["entity_group"] and (e.start, e.end, e.word) == (f["start"], f["end"], f["word"])
               and abs(e.score - f["score"]) <= 1e-4
               for w, g in zip(want, got, strict=True) for e, f in zip(w, g, strict=True))  # fmt: skip


def parity_table(checks: list[BundleCheck]) -> str:
    """The checks as a plain-text table (one row per runtime and precision)."""
    rows = [("runtime", "precision", "tokens", "max abs err", "worst cosine", "labels", "result")]
    for c in checks:
        labels = "-" if c.labels_equal is None else "equal" if c.labels_equal else "DIFFER"
        rows.append((c.runtime, c.precision, "equal" if c.tokens_equal else "DIFFER", f"{c.max_abs:.2e}",
                     f"{c.worst_cosine:.6f}", labels, "ok" if c.passed else "FAIL"))  # fmt: skip
    return "\n".join(table_lines(rows))


def check_and_record(bundle_dir: str | Path, export_dir: str | Path, node_modules: str | Path,
                     texts: list[str] | None = None) -> list[BundleCheck]:  # fmt: skip
    """:func:`check_bundle` on every ONNX Runtime for JavaScript installed in ``node_modules``
    (onnxruntime-node, onnxruntime-web), recorded in the bundle's ``bundle.json`` (``parity``);
    ExportError naming the table when a check fails."""
    bundle_dir = Path(bundle_dir)
    runtimes = [name for name in ("onnxruntime-node", "onnxruntime-web") if (Path(node_modules) / name).is_dir()]
    if not runtimes:
        raise ExportError(f"{node_modules} holds neither onnxruntime-node nor onnxruntime-web: npm install "
                          "--ignore-scripts onnxruntime-node@1.30.0 onnxruntime-web@1.30.0 there")  # fmt: skip
    checks = [c for runtime in runtimes for c in check_bundle(bundle_dir, export_dir, node_modules,
                                                              texts or SAMPLE_TEXTS, runtime)]  # fmt: skip
    described = json.loads((bundle_dir / BUNDLE).read_text())
    described["parity"] = {"texts": texts or SAMPLE_TEXTS, "against": "the Python runtime (ONNX Runtime CPU)",
                           "checks": [asdict(c) for c in checks]}  # fmt: skip
    (bundle_dir / BUNDLE).write_text(json.dumps(described, indent=2) + "\n")
    if not all(c.passed for c in checks):
        raise ExportError("the bundle does not answer as the Python runtime does:\n" + parity_table(checks))
    return checks


def check_bundle(bundle_dir: str | Path, export_dir: str | Path, node_modules: str | Path, texts: list[str],
                 runtime: str = "onnxruntime-node", node: str = "node", timeout: float = 300.0
                 ) -> list[BundleCheck]:  # fmt: skip
    """Run the bundle under Node.js on ``runtime`` (an npm package installed in ``node_modules``:
    onnxruntime-node, or onnxruntime-web's wasm backend) on ``texts``, and compare the token ids and
    answers with the Python runtime's at each precision: float32 embeddings within 1e-4, others at
    a worst cosine of 0.999; the same labels."""
    from edgeattn.runtime import load

    bundle_dir, node_modules = Path(bundle_dir).resolve(), Path(node_modules).resolve()
    described = json.loads((bundle_dir / BUNDLE).read_text())
    precisions = [f["precision"] for f in described["files"]]
    with tempfile.TemporaryDirectory(dir=node_modules.parent) as work_name:
        work = Path(work_name)
        result = work / "result.json"
        (work / "run.mjs").write_text(RUNNER.format(package=runtime, module=(bundle_dir / MODULE).as_uri(),
                                                    texts=json.dumps(texts), precisions=json.dumps(precisions),
                                                    base=json.dumps(str(bundle_dir) + "/"),
                                                    result=json.dumps(str(result))))  # fmt: skip
        done = subprocess.run([node, str(work / "run.mjs")], capture_output=True, text=True, timeout=timeout,
                              cwd=work)  # fmt: skip
        if done.returncode != 0:
            raise ExportError(f"the bundle failed under Node.js ({runtime}): {done.stderr.strip()[-2000:]}")
        got = json.loads(result.read_text())
    checks = []
    for precision in precisions:
        model = load(export_dir, providers=["CPUExecutionProvider"], precision=precision)
        batch = model.text_batch(texts)
        row = got[precision]
        ids = np.array(row["ids"], np.int64).reshape(len(texts), row["width"])
        tokens_equal = ids.shape == batch.ids.shape and bool((ids == batch.ids).all())
        want, have = model.embed(texts), np.array(row["embed"], np.float32)
        diff = float(np.abs(want - have).max())
        cosine = float(((want * have).sum(-1) / np.linalg.norm(want, axis=-1) / np.linalg.norm(have, axis=-1)).min())
        labels_equal = None
        if "classify" in row:
            labels_equal = [c.label for c in model.classify(texts)] == [c["label"] for c in row["classify"]]
        if "tag" in row:
            labels_equal = all(_same_entities(model.tag(texts, aggregation=how), row[key])
                               for how, key in (("simple", "tag"), ("first", "tag_first")))  # fmt: skip
        close = diff <= 1e-4 if precision in ("fp32", "fp32-opt") else cosine >= 0.999
        checks.append(BundleCheck(runtime, precision, tokens_equal, diff, cosine, labels_equal,
                                  tokens_equal and close and labels_equal is not False))  # fmt: skip
    return checks
