"""The browser and Node.js targets: an encoder, seq2seq or language-model export as a folder a page
or a Node.js program loads with no build step, answering as the Python runtime does.

```
<out>/
  bundle.json             what it holds: files and sha256, the model's sizes, labels, pooling, inputs
  onnx/model.onnx         the family's graph (encoder, causal_decoder), self-contained up to 2 GB,
                          else its weights in onnx/model.onnx_data, _data_1, ... files under 2 GB
                          each; int8 as onnx/model_quantized.onnx and int4 as onnx/model_q4.onnx
                          (the names transformers.js loads), others as onnx/model.<precision>.onnx;
                          a seq2seq model's three as onnx/<graph>[.<precision>].onnx
  config.json, tokenizer_config.json   what transformers.js reads beside them (encoders)
  tokenizer.json          the export's Hugging Face tokenizer
  chat_template.json      a language model's chat template, rendered by jinja.mjs (MIT, vendored)
  edgeattn.mjs            the ES module: load(base, ort) -> embed / classify / tag / encode, or
                          generate / stream / chat
  tokenizers.min.mjs      tokenizers.js (Hugging Face's JavaScript tokenizers, Apache-2.0), vendored
  package.json            the ONNX Runtime for JavaScript it runs on (onnxruntime-web or -node)
  index.html              web: a page that runs it (edgeattn serve-web)
```

Encoders (embed, classify, tag, encode), seq2seq models (generate, stream: encoder, cross_kv and
decoder_fixed graphs) and decoder-only language models (greedy and sampled generation, stop
strings, streaming, chat); tagging with WordPiece (BERT), byte-level BPE (RoBERTa) and Unigram
(XLM-R) tokenizers, whose pieces the module aligns to the text itself (tokenizers.js gives no
character offsets). :func:`check_bundle` runs a bundle under Node.js and compares its tokens and answers with
the Python runtime's.
Torch-free (onnx).
"""

from __future__ import annotations

import importlib.resources
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
from edgeattn.config import ModelConfig
from edgeattn.errors import ExportError
from edgeattn.exporters.mobile import cpu_precisions, worst_cosine
from edgeattn.exporters.outdir import check_output_dir, move_into_place
from edgeattn.exporters.target_lint import webgpu_gaps
from edgeattn.runtime.families import FAMILIES, family_of, resolve
from edgeattn.runtime.layout import external_data_file, partial_prefix
from edgeattn.runtime.manifest import Manifest, check_file, read_manifest, sha256_file
from edgeattn.runtime.precisions import FP32, get_precision
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
#: @huggingface/jinja 0.5.13 (MIT), which renders a language model's chat template in JavaScript
JINJA_JS = ("jinja.mjs", "jinja.LICENSE")
CHAT_TEMPLATE = "chat_template.json"
#: the export's own settings its family's runtime reads (a speech model's features and decoding)
SETTINGS = "settings.json"
#: the family of a bundle.json that names none (written before bundles named their family: an encoder's)
UNNAMED_FAMILY = "encoder"
#: protobuf and the browser's ArrayBuffer both stop near 2 GB: no file of a bundle passes this
WEB_LIMIT = (1 << 31) - 1
#: what a page's wasm32 memory can address: a web bundle's graph and weights must fit in it
WASM_MEMORY = 1 << 32
ASSETS = Path(__file__).resolve().parent / "js"


@dataclass
class WebBundle:
    """What :func:`package_web` wrote."""

    path: Path
    target: str
    files: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        """The graph files and their external data."""
        return sum(entry_bytes(f) for f in self.files)


def entry_bytes(entry: dict[str, Any]) -> int:
    """A bundle entry's graph file and its external data, in bytes."""
    return entry["bytes"] + sum(d["bytes"] for d in entry.get("external_data", []))


def bundle_graphs(family_name: str, config: ModelConfig | None = None) -> tuple[str, ...]:
    """The graphs a bundle of a family carries (its record's ``bundle_graphs``; none: not run); with
    ``config``, those its model has (a role's ``applies``: the text tower only some image models have)."""
    family = FAMILIES.get(family_name)
    if family is None:
        return ()
    return tuple(g for g in family.bundle_graphs
                 if config is None or family.graphs[g].applies is None or family.graphs[g].applies(config))


def model_file(precision: str, graph: str | None = None) -> str:
    """Where a precision's graph lies in the bundle: transformers.js's names for a family of one
    graph (its record's ``transformers_js``), ``onnx/<graph>[.<precision>].onnx`` for one of several."""
    if graph is not None:
        return f"onnx/{graph}.onnx" if precision == FP32 else f"onnx/{graph}.{precision}.onnx"
    named = get_precision(precision).transformers_js
    return "onnx/" + (named[0] if named else f"model.{precision}.onnx")


def package_web(export_dir: str | Path, out_dir: str | Path, target: str = "web", precisions: list[str] | None = None,
                force: bool = False, file_limit: int = WEB_LIMIT, int4_accuracy_level: int | None = None
                ) -> WebBundle:  # fmt: skip
    """Write the ``target`` (web or node) bundle of the encoder or language-model export
    ``export_dir`` at ``precisions`` (default: :func:`default_precision`) to ``out_dir``, no file
    over ``file_limit`` bytes; an int4 graph remade for the target at ``int4_accuracy_level``
    (default: the export's; measured in benchmarks/results/targets-lm.json, level 4 decoded as fast
    as 0 in wasm and faster natively). :class:`ExportError` for an export the target cannot run
    yet, leaving ``out_dir`` as it was."""
    if target not in TARGETS:
        raise ExportError(f"target must be one of {', '.join(TARGETS)}, not {target!r}")
    export_dir, out_dir = Path(export_dir), Path(out_dir)
    manifest = read_manifest(export_dir)
    _check_runs(manifest, export_dir)
    graphs = bundle_graphs(manifest.family_name, manifest.config)
    slow = family_of(manifest.config).graphs[graphs[-1]].bundle_slow
    chosen = cpu_precisions(manifest, precisions or [default_precision(manifest, target)])
    check_output_dir(out_dir, force)
    parent = out_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=partial_prefix(out_dir.name), dir=parent))
    tagging = None
    if manifest.config.head == "token":
        tagging = tagging_settings(check_file(export_dir, manifest.tokenizer))
    try:
        bundle = WebBundle(out_dir, target)
        checked: set[tuple[str, str]] = set()
        for precision, graph in ((p, g) for p in chosen for g in graphs):
            if graph == graphs[-1] and (target, precision) in slow:
                log.warning("%s %s for --target %s: %s", graph, precision, target, slow[(target, precision)])
            model, made = runnable_graph(export_dir, manifest, graph, precision, checked, tmp, int4_accuracy_level)
            name = model_file(precision, graph if len(graphs) > 1 else None)
            entry = write_graph(model, tmp, name, file_limit)
            if made is not None:
                entry["made_for_target"] = made
            weight = entry_bytes(entry)
            if target == "web" and weight > WASM_MEMORY:
                raise ExportError(f"the {precision} {graph} weighs {weight / 1e9:.2f} GB; a page's wasm memory "
                                  "addresses 4 GB in all: package int4 or int8, or --target node")  # fmt: skip
            if target == "web":  # whether the page's WebGPU backend takes it, and why not
                gaps = webgpu_gaps(model)
                entry["webgpu"] = {"runs": not gaps, "why": str(gaps[0]) if gaps else None}
            named = get_precision(precision).transformers_js
            bundle.files.append({**entry, "precision": precision, "graph": graph,
                                 "transformers_js_dtype": named[1] if named and len(graphs) == 1 else None})
        if manifest.tokenizer is not None:
            shutil.copy2(check_file(export_dir, manifest.tokenizer, checked), tmp / "tokenizer.json")
        assets = [MODULE, *TOKENIZERS_JS, *([PAGE] if target == "web" else [])]
        if manifest.chat_template is not None:
            shutil.copy2(check_file(export_dir, manifest.chat_template, checked), tmp / CHAT_TEMPLATE)
            assets += JINJA_JS
        if manifest.settings is not None:
            shutil.copy2(check_file(export_dir, manifest.settings, checked), tmp / SETTINGS)
        for name in assets:
            shutil.copy2(ASSETS / name, tmp / name)
        family = family_of(manifest.config)
        for own in filter(None, (family.bundle_module, *family.bundle_assets)):  # the family's ES modules
            package, name = own.split(":")
            shutil.copy2(Path(str(importlib.resources.files(package).joinpath(name))), tmp / name)
        package, version = ORT_PACKAGES[target]
        npm = {"name": _npm_name(out_dir.name), "private": True, "type": "module", "main": MODULE,
               "dependencies": {package: version}}  # fmt: skip
        (tmp / "package.json").write_text(json.dumps(npm, indent=2) + "\n")
        described = {**_describe(bundle, manifest, export_dir, tmp), "tagging": tagging}
        (tmp / BUNDLE).write_text(json.dumps(described, indent=2) + "\n")
        if family_of(manifest.config).transformers_js:
            _transformers_js_files(manifest, tmp)
        move_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("wrote the %s bundle %s (%s)", target, out_dir, ", ".join(f["file"] for f in bundle.files))
    return bundle


def runnable_graph(export_dir: Path, manifest: Manifest, graph: str, precision: str, checked: set[tuple[str, str]],
                   work: Path, int4_accuracy_level: int | None = None
                   ) -> tuple[onnx.ModelProto, dict[str, Any] | None]:  # fmt: skip
    """``graph`` at ``precision`` as the targets' ONNX Runtime (1.30) runs it: the export's own file
    where every node passes the lint (:mod:`edgeattn.exporters.target_lint`), else, for a
    converted precision made from a fused form the target lacks (a language model's
    GroupQueryAttention takes an input ONNX Runtime 1.32 added), the same conversion of the
    export's plain float32 graph, held to the export's gated graph (:func:`hold_to_export`); with
    what was remade and measured, or None; an int4 graph remade at ``int4_accuracy_level``
    (default: the export's). ExportError naming the nodes otherwise."""
    from edgeattn.exporters.compact import fold_transposes
    from edgeattn.exporters.fitted_weights import carry_fitted
    from edgeattn.exporters.quantize import ConversionJob, converter
    from edgeattn.exporters.target_lint import lint, summary

    model = onnx.load(str(check_file(export_dir, manifest.entry(graph, precision), checked)))
    findings = lint(model)
    if not findings:
        return model, None
    release = f"ONNX Runtime {ORT_PACKAGES['node'][1]} (onnxruntime-web and -node)"
    plain = onnx.load(str(check_file(export_dir, manifest.entry(graph, FP32), checked)))
    if get_precision(precision).converter is None or lint(plain):
        raise ExportError(f"the {precision} {graph} holds nodes {release} cannot run:\n{summary(findings)}")
    variant = manifest.graphs[graph].precisions[precision]
    quantization = variant.quantization or {}
    # int4 as the export made it: its output layer's bits, and its role's wide products at them
    wide = family_of(manifest.config).role(graph).int4_wide_products if "output_layer_bits" in quantization else ()
    job = ConversionJob(block_size=int(quantization.get("block_size", 32)),
                        int8_activations=quantization.get("accuracy_level") == 4,
                        head_bits=int(quantization.get("output_layer_bits", 4)), wide_products=wide,
                        accuracy_level=int4_accuracy_level)  # fmt: skip
    dst = work / "remade" / f"{graph}.{precision}.onnx"
    dst.parent.mkdir(exist_ok=True)
    # the weights the plain graph shares with the checkpoint through Transpose nodes, folded back
    # into initializers: the quantisers take a MatMul's weight only as an initializer
    src = dst.parent / f"{graph}.fp32-folded.onnx"
    onnx.save_model(fold_transposes(plain), str(src), save_as_external_data=True,
                    location=src.name + ".data")  # fmt: skip
    info = converter(precision)(src, dst, job)
    remade = onnx.load(str(dst))
    if quantization.get("method") == "gptq":  # the export's fitted levels, where they stand for the same weights
        carried = carry_fitted(remade, model, onnx.load(str(src)))
        dst.with_name(external_data_file(dst.name)).unlink(missing_ok=True)
        onnx.save_model(remade, str(dst))  # a target's graph is under protobuf's 2 GB (the bundle splits it)
        info = {**info, "method": "gptq" if carried else info["method"], "fitted_products": len(carried),
                "fitted_on": "carried over from the export's graph"}  # fmt: skip
    still = lint(remade)
    if still:
        raise ExportError(f"the {precision} {graph} remade from the plain graph still holds nodes {release} cannot "
                          f"run:\n{summary(still)}")  # fmt: skip
    held = hold_to_export(export_dir, precision, dst, degraded=variant.degraded, graph=graph)
    shutil.rmtree(dst.parent)
    log.info("%s %s: the export's graph holds nodes the target cannot run (%s); remade from the plain fp32 graph",
             graph, precision, findings[0])  # fmt: skip
    return remade, {"from": "the export's plain fp32 graph, by the same conversion", "because": str(findings[0]),
                    "quantization": info, **held}  # fmt: skip


def hold_to_export(export_dir: Path, precision: str, remade: Path, texts: list[str] | None = None,
                   degraded: bool = False, graph: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The remade ``precision`` graph and the export's gated one against fp32 on the next-token
    logits of ``texts`` (teacher forced): top-1 agreement and worst cosine of each. ExportError
    where the remade graph's agreement is below the accuracy gate's own floor for that precision
    (``teacher_top1``: 0.95 for int8, 0.85 for int4), unless the export kept its own graph
    ``degraded`` (``--allow-degraded``): the remade one is then marked degraded too."""
    from edgeattn.runtime import load
    from edgeattn.runtime.exported_model import ExportedModel

    reference = load(export_dir, providers=["CPUExecutionProvider"])
    gated = load(export_dir, providers=["CPUExecutionProvider"], precision=precision)
    made = ExportedModel.from_graphs(reference.config, {graph or reference.family.primary_graph: remade},
                                     precision=precision)  # fmt: skip
    ids, mask = reference.encode_prompts(texts or HOLD_TEXTS)
    want = reference.next_token_logits(ids, mask)
    real = mask.astype(bool)

    def measure(model: Any) -> tuple[float, float]:
        got = model.next_token_logits(ids, mask)
        top1 = float((got.argmax(-1) == want.argmax(-1))[real].mean())
        cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
        return top1, float(cos[real].min())

    (gated_top1, gated_cos), (made_top1, made_cos) = measure(gated), measure(made)
    held = {"top1_vs_fp32": round(made_top1, 5), "worst_cosine_vs_fp32": round(made_cos, 6),
            "export_top1_vs_fp32": round(gated_top1, 5), "export_worst_cosine_vs_fp32": round(gated_cos, 6)}
    thresholds = get_precision(precision).thresholds
    floor = thresholds.teacher_top1 if thresholds is not None else 1.0
    if made_top1 < floor and degraded:
        return {**held, "floor": floor, "degraded": True}
    if made_top1 < floor:
        raise ExportError(f"the {precision} graph remade for the target agrees with fp32 on {made_top1:.3f} of next "
                          f"tokens (the gate asks {floor}; the export's gated graph {gated_top1:.3f}): not packaged")
    return {**held, "floor": floor}


#: texts a language model's remade graph is held to its export's on (any tokenizer takes them)
HOLD_TEXTS = ["The sea is calm tonight, and the waves fold over the sand under the moon.",
              "Write a haiku about the sea.", "A small model runs at the edge of the network.",
              "Hello, how are you today? Stop here and rest."]  # fmt: skip


def write_graph(model: onnx.ModelProto, out: Path, name: str, file_limit: int = WEB_LIMIT) -> dict[str, Any]:
    """Save ``model`` at ``out / name``: self-contained when it fits in ``file_limit`` bytes, else
    its weights in ``name``_data, ``name``_data_1, ... files of at most ``file_limit`` bytes each
    (what onnxruntime-web loads through its ``externalData`` option and onnxruntime-node finds
    beside the model). Returns the bundle's entry: file, sha256, bytes, external_data."""
    from onnx.external_data_helper import set_external_data, uses_external_data

    path = out / name
    path.parent.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {"file": name}
    if model.ByteSize() > file_limit:
        parts: list[tuple[str, int]] = []  # (file name, bytes written)
        for tensor in sorted(model.graph.initializer, key=lambda t: -len(t.raw_data)):
            size = len(tensor.raw_data)
            if size < 1024 or uses_external_data(tensor):
                continue  # small tensors stay in the graph
            if size > file_limit:
                raise ExportError(f"the tensor {tensor.name} alone is {size / 1e9:.2f} GB, over the "
                                  f"{file_limit / 1e9:.2f} GB a file may hold")  # fmt: skip
            fits = next((i for i, (_, used) in enumerate(parts) if used + size <= file_limit), None)
            if fits is None:
                parts.append((f"{path.name}_data" + (f"_{len(parts)}" if parts else ""), 0))
                fits = len(parts) - 1
            data_name, used = parts[fits]
            with open(path.parent / data_name, "ab") as handle:
                handle.write(tensor.raw_data)
            set_external_data(tensor, data_name, offset=used, length=size)
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            parts[fits] = (data_name, used + size)
        if model.ByteSize() > file_limit:
            raise ExportError(f"{name} is still {model.ByteSize():,} bytes without its weights of 1 KB and more, over "
                              f"the {file_limit:,} a file may hold")  # fmt: skip
        entry["external_data"] = [{"file": str(Path(name).parent / data_name), "bytes": used,
                                   "sha256": sha256_file(path.parent / data_name)}
                                  for data_name, used in parts]  # fmt: skip
    onnx.save_model(model, str(path))
    entry.update(sha256=sha256_file(path), bytes=path.stat().st_size)
    return entry


def default_precision(manifest: Manifest, target: str = "web") -> str:
    """What a ``target`` bundle holds when no precision is named: the first of its last graph's
    role's ``bundle_precisions`` for the target that every graph has, not degraded; else fp32."""
    graphs = bundle_graphs(manifest.family_name, manifest.config)
    for name in family_of(manifest.config).graphs[graphs[-1]].bundle_precisions.get(target, ()):
        variants = [manifest.graphs[g].precisions.get(name) for g in graphs]
        if all(v is not None and not v.degraded for v in variants):
            return name
    return FP32


def _check_runs(manifest: Manifest, export_dir: Path) -> None:
    """An ExportError saying why the web and node targets cannot run this export, if they cannot."""
    if not bundle_graphs(manifest.family_name):
        runs = ", ".join(f.name for f in FAMILIES.values() if f.bundle_graphs)
        raise ExportError(f"the web and node targets run {runs} exports; this is a {manifest.family_name} "
                          "export: package it for --target mobile, or serve it")  # fmt: skip
    missing = [g for g in bundle_graphs(manifest.family_name, manifest.config) if g not in manifest.graphs]
    if missing:
        raise ExportError(f"the web and node targets need the export's {', '.join(missing)} graph(s), which it "
                          "lacks: export it again with this edgeattn (--graphs decoder for a seq2seq model)")
    if not family_of(manifest.config).bundle_text:
        return
    if manifest.tokenizer is None or not _hugging_face_tokenizer(check_file(export_dir, manifest.tokenizer)):
        raise ExportError("the web and node targets take text through the export's Hugging Face tokenizer.json, "
                          "which this export lacks")  # fmt: skip


def _hugging_face_tokenizer(path: Path) -> bool:
    """Whether ``path`` is a Hugging Face tokenizer.json (edgeattn's own word tokenizer is JSON too)."""
    try:
        described = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(described, dict) and isinstance(described.get("model"), dict)


def tagging_settings(tokenizer_path: Path) -> dict[str, Any]:
    """What the module needs to give each token its character span (tokenizers.js gives none):
    WordPiece with the Bert normalizer (BERT, DistilBERT, ELECTRA), byte-level BPE with no
    normalizer (RoBERTa, GPT-2), or Unigram with Metaspace (XLM-R) and a normalizer tokenizers.js
    has; ExportError for a tokenizer it cannot align."""
    described = json.loads(tokenizer_path.read_text(encoding="utf-8"))
    model, normalizer = described.get("model") or {}, described.get("normalizer") or {}
    pre, post = described.get("pre_tokenizer") or {}, described.get("post_processor") or {}
    specials = [t["content"] for t in described.get("added_tokens", []) if t.get("special")]
    if model.get("type") == "WordPiece" and normalizer.get("type") in ("BertNormalizer", None):
        return {"kind": "wordpiece", "specials": specials, "prefix": model.get("continuing_subword_prefix", "##"),
                "unk": model.get("unk_token"), "lowercase": bool(normalizer.get("lowercase", False)),
                "strip_accents": normalizer.get("strip_accents")}  # fmt: skip
    if model.get("type") == "BPE" and not normalizer and pre.get("type") == "ByteLevel":
        return {"kind": "bytelevel", "specials": specials, "add_prefix_space": bool(pre.get("add_prefix_space")),
                "trim_offsets": bool(post.get("trim_offsets", pre.get("trim_offsets", False)))}  # fmt: skip
    if model.get("type") == "Unigram" and pre.get("type") == "Metaspace" and _js_normalizer(normalizer):
        return {"kind": "metaspace", "specials": specials, "replacement": pre.get("replacement", "\u2581"),
                "unk": _unigram_unk(model), "prepend": pre.get("prepend_scheme", "always") != "never"
                and pre.get("add_prefix_space", True), "collapse_spaces": _collapses_spaces(normalizer)}  # fmt: skip
    raise ExportError("the web and node targets tag with WordPiece tokenizers (BERT, DistilBERT, ELECTRA), "
                      "byte-level BPE ones (RoBERTa) and SentencePiece-style Unigram ones (XLM-R) whose "
                      "normalizer tokenizers.js has, aligning their pieces to the text; this one is "
                      f"{model.get('type')} with {normalizer.get('type')} and {pre.get('type')}")  # fmt: skip


#: the normalizers tokenizers.js applies (a Unigram tagger's text is normalised character by character)
JS_NORMALIZERS = {"Precompiled", "Sequence", "Replace", "NFC", "NFD", "NFKC", "NFKD", "Strip", "StripAccents",
                  "Lowercase", "Prepend"}  # fmt: skip


def _js_normalizer(normalizer: dict[str, Any]) -> bool:
    if not normalizer:
        return True
    inner = normalizer.get("normalizers") or [] if normalizer.get("type") == "Sequence" else []
    return normalizer.get("type") in JS_NORMALIZERS and all(_js_normalizer(n) for n in inner)


def _collapses_spaces(normalizer: dict[str, Any]) -> bool:
    """Whether the normalizer makes runs of spaces one (XLM-R's Replace of " {2,}")."""
    parts = normalizer.get("normalizers") or [] if normalizer.get("type") == "Sequence" else [normalizer]
    return any(p.get("type") == "Replace" and (p.get("pattern") or {}).get("Regex") == " {2,}" for p in parts)


def _unigram_unk(model: dict[str, Any]) -> str | None:
    vocab, unk = model.get("vocab") or [], model.get("unk_id")
    return vocab[unk][0] if isinstance(unk, int) and 0 <= unk < len(vocab) else None


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


def closing_specials(tokenizer_path: Path) -> int:
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
    """bundle.json: what every bundle says, and what its family's ``bundle_describer`` adds."""
    family = family_of(manifest.config)
    graph = manifest.graphs[family.bundle_graphs[0]]
    described: dict[str, Any] = {
        "target": bundle.target,
        "edgeattn_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "export": {"path": str(export_dir.resolve()), "source": manifest.source, "architecture": manifest.architecture,
                   "created": manifest.created},  # fmt: skip
        "family": manifest.family_name,
        "tokenizer": "tokenizer.json" if manifest.tokenizer is not None else None,
        "tokenizer_config": {},
        "runtime": dict(zip(("package", "version"), ORT_PACKAGES[bundle.target], strict=True)),
        "inputs": [asdict(t) for t in graph.inputs],
        "outputs": [asdict(t) for t in graph.outputs],
        "files": bundle.files,
    }  # fmt: skip
    assert family.bundle_describer is not None
    return {**described, **resolve(family.bundle_describer)(manifest, tmp)}


# ------------------------------------------------------------------------------------ checking
#: what every check script under Node.js starts with: the runtime, the module's load, one wasm
#: thread (as :func:`bundle_runtime`'s Python reference runs on one)
NODE_PRELUDE = """
import * as ort from "{package}";
import {{ load }} from "{module}";
import {{ readFile, writeFile }} from "node:fs/promises";
if (ort.env?.wasm) ort.env.wasm.numThreads = 1;
"""
#: the script a bundle is checked with under Node.js: each precision loaded, its answers kept
RUNNER_FRAME = NODE_PRELUDE + """const texts = {texts};
const out = {{}};
for (const precision of {precisions}) {{
  const model = await load({base}, ort, {{ precision }});
__BODY__
  out[precision] = row;
}}
await writeFile({result}, JSON.stringify(out));
"""
#: what is kept of an encoder: token ids, embeddings, labels or entities
RUNNER = RUNNER_FRAME.replace("__BODY__", """
  const tokens = model.tokenize(texts);
  const row = {{ ids: Array.from(tokens.ids, Number), width: tokens.width }};
  row.embed = (await model.embed(texts)).map((v) => Array.from(v));
  if (model.bundle.model.head === "sequence") row.classify = await model.classify(texts);
  if (model.bundle.model.head === "token") {{
    row.tag = await model.tag(texts);
    row.tag_first = await model.tag(texts, {{ aggregation: "first" }});
  }}""")
#: what is kept of a language model: prompt ids, the prompts' logits, greedy answers, a stream, a chat
CAUSAL_RUNNER = RUNNER_FRAME.replace("__BODY__", """
  const {{ ids, mask }} = await model.encodePrompts(texts, {{ room: {steps} }});
  const row = {{ ids: ids.flat(), width: ids[0].length }};
  row.answers = await model.generate(texts, {{ maxNewTokens: {steps} }});
  row.logits = model.promptLogits.map((r) => Array.from(r));
  row.stream = [];
  for await (const piece of model.stream(texts[0], {{ maxNewTokens: {steps} }})) row.stream.push(piece);
  if (model.chatTemplate) row.chat = await model.chat({chat}, {{ maxNewTokens: {steps} }});""")
#: new tokens a language-model bundle is checked over, and the conversation its chat is checked on
CHECK_STEPS = 16
CHECK_CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello how are you"}]

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
    #: a language model's greedy answers: the share of their tokens equal to the Python runtime's
    #: (each answer up to where it first differs), and whether streamed and chat answers are equal
    agreement: float | None = None


def _same_entities(want: list[list[Any]], got: list[list[dict[str, Any]]]) -> bool:
    """The same entities (type, span, word) in every text, their scores within 1e-4."""
    if len(want) != len(got) or any(len(w) != len(g) for w, g in zip(want, got, strict=True)):
        return False
    return all(e.entity_group == f["entity_group"] and (e.start, e.end, e.word) == (f["start"], f["end"], f["word"])
               and abs(e.score - f["score"]) <= 1e-4
               for w, g in zip(want, got, strict=True) for e, f in zip(w, g, strict=True))  # fmt: skip


def parity_table(checks: list[BundleCheck]) -> str:
    """The checks as a plain-text table (one row per runtime and precision)."""
    rows = [("runtime", "precision", "tokens", "max abs err", "worst cosine", "answers", "result")]
    for c in checks:
        labels = "-" if c.labels_equal is None else "equal" if c.labels_equal else "DIFFER"
        if c.agreement is not None and c.agreement < 1:
            labels = f"{c.agreement:.3f} agree"
        rows.append((c.runtime, c.precision, "equal" if c.tokens_equal else "DIFFER", f"{c.max_abs:.2e}",
                     f"{c.worst_cosine:.6f}", labels, "ok" if c.passed else "FAIL"))  # fmt: skip
    return "\n".join(table_lines(rows))


def check_and_record(bundle_dir: str | Path, export_dir: str | Path, node_modules: str | Path,
                     texts: list[str] | None = None, inputs: Any = None) -> list[BundleCheck]:  # fmt: skip
    """:func:`check_bundle` on every ONNX Runtime for JavaScript installed in ``node_modules``
    (onnxruntime-node, onnxruntime-web), recorded in the bundle's ``bundle.json`` (``parity``);
    ExportError naming the table when a check fails. ``inputs``: what a family's own check runs on
    (its record's ``bundle_check``; a speech bundle's audio, name -> samples)."""
    bundle_dir = Path(bundle_dir)
    runtimes = [name for name in ("onnxruntime-node", "onnxruntime-web") if (Path(node_modules) / name).is_dir()]
    if not runtimes:
        raise ExportError(f"{node_modules} holds neither onnxruntime-node nor onnxruntime-web: npm install "
                          "--ignore-scripts onnxruntime-node@1.30.0 onnxruntime-web@1.30.0 there")  # fmt: skip
    checks = [c for runtime in runtimes for c in check_bundle(bundle_dir, export_dir, node_modules,
                                                              texts or SAMPLE_TEXTS, runtime, inputs=inputs)]
    described = json.loads((bundle_dir / BUNDLE).read_text())
    own = FAMILIES[described["family"]].bundle_check is not None
    on = {"inputs": list(inputs) if isinstance(inputs, dict) else "the family's own"} if own else {
        "texts": texts or SAMPLE_TEXTS}  # fmt: skip
    described["parity"] = {**on, "against": "the Python runtime (ONNX Runtime CPU)",
                           "checks": [asdict(c) for c in checks]}  # fmt: skip
    (bundle_dir / BUNDLE).write_text(json.dumps(described, indent=2) + "\n")
    if not all(c.passed for c in checks):
        raise ExportError("the bundle does not answer as the Python runtime does:\n" + parity_table(checks))
    return checks


def check_bundle(bundle_dir: str | Path, export_dir: str | Path, node_modules: str | Path, texts: list[str],
                 runtime: str = "onnxruntime-node", node: str = "node", timeout: float = 300.0, inputs: Any = None
                 ) -> list[BundleCheck]:  # fmt: skip
    """Run the bundle under Node.js on ``runtime`` (an npm package installed in ``node_modules``:
    onnxruntime-node, or onnxruntime-web's wasm backend) on ``texts``, and compare the token ids and
    answers with the Python runtime's over the same files at each precision: float32 outputs
    (embeddings, or a language model's next-token logits after each prompt) within 1e-4 + 1e-5 of
    their largest magnitude, others at a worst cosine of 0.999; the same labels or entities; a
    language model's greedy answers, their stream and a chat answer the same (at reduced
    precisions, 0.9 of the answers' tokens)."""
    bundle_dir, node_modules = Path(bundle_dir).resolve(), Path(node_modules).resolve()
    described = json.loads((bundle_dir / BUNDLE).read_text())
    own = FAMILIES[described["family"]].bundle_check
    if own is not None:  # a family whose answers are not text checks its bundles itself, on ``inputs``
        return resolve(own)(bundle_dir, Path(export_dir), node_modules, runtime, node, timeout, inputs)
    precisions = list(dict.fromkeys(f["precision"] for f in described["files"]))
    causal = described["task"] in ("complete", "generate")
    with tempfile.TemporaryDirectory(dir=node_modules.parent) as work_name:
        work = Path(work_name)
        result = work / "result.json"
        script = (CAUSAL_RUNNER if causal else RUNNER).format(
            package=runtime, module=(bundle_dir / MODULE).as_uri(), texts=json.dumps(texts),
            precisions=json.dumps(precisions), base=json.dumps(str(bundle_dir) + "/"), result=json.dumps(str(result)),
            steps=CHECK_STEPS, chat=json.dumps(CHECK_CHAT))  # fmt: skip
        got = run_check_script(script, work, node, timeout, runtime)
    check = _check_causal if causal else _check_encoder  # a seq2seq model is checked as a language model
    return [check(runtime, precision, bundle_runtime(export_dir, bundle_dir, precision), texts, got[precision])
            for precision in precisions]  # fmt: skip


def run_check_script(script: str, work: Path, node: str, timeout: float, runtime: str) -> Any:
    """Run a check script under Node.js in ``work``: what it wrote to ``work/result.json``
    (ExportError with Node's error where it failed)."""
    (work / "run.mjs").write_text(script)
    done = subprocess.run([node, str(work / "run.mjs")], capture_output=True, text=True, timeout=timeout, cwd=work)
    if done.returncode != 0:
        raise ExportError(f"the bundle failed under Node.js ({runtime}): {done.stderr.strip()[-2000:]}")
    return json.loads((work / "result.json").read_text())


def bundle_runtime(export_dir: str | Path, bundle_dir: str | Path, precision: str) -> Any:
    """The Python runtime (ONNX Runtime CPU) over the bundle's own graph file at ``precision``, with
    the export's tokenizer and settings: what the JavaScript runtimes are compared with. One thread,
    as the checks run onnxruntime-web's wasm: its sums then come in the order the wasm's do (a seq2seq
    bundle's logits 3.0e-5 from it, against 5.5e-5 on two threads and 1.66e-4 when two threads split
    the work otherwise under CI's load)."""
    from edgeattn.runtime import load
    from edgeattn.runtime.session import create_session

    described = json.loads((Path(bundle_dir) / BUNDLE).read_text())
    model = load(export_dir, providers=["CPUExecutionProvider"], precision=precision, threads=1)
    for entry in described["files"]:
        if entry["precision"] == precision:
            graph = entry.get("graph") or bundle_graphs(described.get("family", UNNAMED_FAMILY))[0]
            model.sessions.put(graph, create_session(Path(bundle_dir) / entry["file"], threads=1))
    return model


#: float32 outputs of a JavaScript runtime against ONNX Runtime's: within this plus ``FP32_RELATIVE``
#: of the output's largest magnitude (the export's own float32 bar, 1e-4 + 1e-5·|reference|:
#: onnxruntime-web's wasm kernels sum in another order, and a T5's logits of up to ~20 came 1.66e-4
#: from ONNX Runtime's when its threads split the work otherwise under load, every token equal)
FP32_ABSOLUTE, FP32_RELATIVE = 1e-4, 1e-5


def _close(precision: str, diff: float, cosine: float, scale: float = 0.0) -> bool:
    """Whether a runtime's outputs (max abs error ``diff`` against outputs of largest magnitude
    ``scale``, worst row cosine ``cosine``) are close enough at ``precision``."""
    if get_precision(precision).float32_parity:
        return diff <= FP32_ABSOLUTE + FP32_RELATIVE * scale
    return cosine >= 0.999


def compare_outputs(want: np.ndarray, have: np.ndarray) -> tuple[float, float]:
    """Max abs error and worst row cosine."""
    return float(np.abs(want - have).max()), worst_cosine(want, have)


def _check_encoder(runtime: str, precision: str, model: Any, texts: list[str], row: dict[str, Any]) -> BundleCheck:
    batch = model.text_batch(texts)
    ids = np.array(row["ids"], np.int64).reshape(len(texts), row["width"])
    tokens_equal = ids.shape == batch.ids.shape and bool((ids == batch.ids).all())
    want = model.embed(texts)
    diff, cosine = compare_outputs(want, np.array(row["embed"], np.float32))
    labels_equal = None
    if "classify" in row:
        labels_equal = [c.label for c in model.classify(texts)] == [c["label"] for c in row["classify"]]
    if "tag" in row:
        labels_equal = all(_same_entities(model.tag(texts, aggregation=how), row[key])
                           for how, key in (("simple", "tag"), ("first", "tag_first")))  # fmt: skip
    return BundleCheck(runtime, precision, tokens_equal, diff, cosine, labels_equal,
                       tokens_equal and _close(precision, diff, cosine, float(np.abs(want).max()))
                       and labels_equal is not False)  # fmt: skip


def _first_logits(model: Any, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The ids the Python runtime makes of ``texts`` and the first new token's logits after them: a
    language model's prompt ids (padded on the left), or a seq2seq model's source (on the right)
    and its decoder's first step."""
    if hasattr(model, "encode_prompts"):
        ids, mask = model.encode_prompts(texts, room=CHECK_STEPS)
        return ids, model.state(ids, mask).step(np.zeros(len(texts), np.int64))
    ids, mask = model._text_source(texts, False)
    stepper = model.stepper(ids, mask, capacity=CHECK_STEPS)
    return ids, stepper.step(np.full(len(texts), model.config.bos_id, np.int64))


def _check_causal(runtime: str, precision: str, model: Any, texts: list[str], row: dict[str, Any]) -> BundleCheck:
    """A language model's or a seq2seq model's bundle against the Python runtime: ids, the first
    new token's logits, greedy answers, a stream, and a chat where the model has a template."""
    ids, want_logits = _first_logits(model, texts)
    have_ids = np.array(row["ids"], np.int64).reshape(len(texts), row["width"])
    tokens_equal = have_ids.shape == ids.shape and bool((have_ids == ids).all())
    diff, cosine = compare_outputs(want_logits, np.array(row["logits"], np.float32))
    answers = model.generate_answers(texts, CHECK_STEPS)
    shared = []
    for (_, want), have in zip(answers, row["answers"], strict=True):
        want, have = want.tolist(), have["tokens"]
        common = min(len(want), len(have))
        common = next((k for k, (a, b) in enumerate(zip(want, have, strict=False)) if a != b), common)
        shared.append(common / max(len(want), len(have)) if want or have else 1.0)
    agreement = float(np.mean(shared))
    same_text = [text for text, _ in answers] == [a["text"] for a in row["answers"]]
    same_stream = "".join(model.stream_text(texts[0], CHECK_STEPS)) == "".join(row["stream"])
    same_chat = "chat" not in row or model.chat(CHECK_CHAT, CHECK_STEPS) == row["chat"]
    exact = get_precision(precision).float32_parity
    answers_ok = (agreement == 1.0 and same_text and same_stream and same_chat) if exact else agreement >= 0.9
    equal = agreement == 1.0 and same_text and same_stream and same_chat
    return BundleCheck(runtime, precision, tokens_equal, diff, cosine, equal,
                       tokens_equal and _close(precision, diff, cosine, float(np.abs(want_logits).max()))
                       and answers_ok, agreement)  # fmt: skip
