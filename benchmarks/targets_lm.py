"""A language model's web / node bundle on every runtime it reaches, side by side in one run: the
Python runtime (native ONNX Runtime, 2 threads), the bundle's ES module on onnxruntime-node (2
threads) and on onnxruntime-web's wasm backend in Node.js (1 thread, as it runs there), for a
SmolLM2-135M-shaped Llama (random weights) at fp32, int8 and int4 (at MatMulNBits' accuracy levels 4
and 0): the prompt's time (128 tokens),
greedy decoding in tokens per second (32 new tokens, no stop token) and its ratio to native,
session creation, and the bytes a page downloads. Prints the table, writes the JSON.

    python benchmarks/targets_lm.py --node-modules DIR [--models smollm2-135m] [--repeats 3] [--out FILE]

DIR holds onnxruntime-node and onnxruntime-web (``npm install --ignore-scripts onnxruntime-node@1.30.0
onnxruntime-web@1.30.0``). The export keeps degraded int8 / int4 (random weights give flat logits),
as ``--allow-degraded`` does; the bundle's int8 and int4 are remade from the plain graph for ONNX
Runtime 1.30, as ``edgeattn package --target node`` makes them.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeattn.benchmark.machine import machine_info
from edgeattn.benchmark.report import publish

sys.path.insert(0, str(Path(__file__).resolve().parent))
from causal_generation import SHAPES, make_folder  # noqa: E402

PRECISIONS = ("fp32", "int8", "int4")
#: MatMulNBits' accuracy levels an int4 bundle is made at: 4 (int8 activations) and 0 (float32)
LEVELS = (4, 0)
PROMPT, NEW = 128, 32
THREADS = 2

RUNNER = """
import * as ort from "{package}";
import {{ load }} from {module};
import {{ writeFile }} from "node:fs/promises";
const web = !!ort.env?.versions?.web;
if (web) ort.env.wasm.numThreads = 1;
const out = {{}};
for (const precision of {precisions}) {{
  let start = performance.now();
  const sessionOptions = web ? {{}} : {{ intraOpNumThreads: {threads} }};
  const model = await load({base}, ort, {{ precision, sessionOptions }});
  const row = {{ create_ms: performance.now() - start, prefill_ms: [], decode_ms: [] }};
  model.stopIds = [];  // random weights: every row runs all its steps
  const ids = [Array.from({{ length: {prompt} }}, (_, i) => 5 + (i * 7919) % 200)];
  const mask = [ids[0].map(() => 1)];
  for (let r = 0; r <= {repeats}; r++) {{  // the first run warms up
    start = performance.now();
    const steps = model.steps(ids, mask, {{ maxNewTokens: {new} }});
    await steps.next();
    const prefill = performance.now() - start;
    start = performance.now();
    let n = 0;
    for await (const _ of steps) n++;
    if (r > 0) {{ row.prefill_ms.push(prefill); row.decode_ms.push((performance.now() - start) / n); }}
  }}
  out[precision] = row;
}}
await writeFile({result}, JSON.stringify(out));
"""


@dataclass
class TargetsLmBench:
    rows: list[dict] = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"benchmark": "targets lm", "machine": machine_info(), "settings": self.settings, "rows": self.rows}

    def table(self) -> str:
        from edgeattn.benchmark.results_page import targets_lm_table

        return targets_lm_table(self.to_dict())


def _tokenizer(folder: Path) -> None:
    """A small BPE tokenizer.json (its ids within the model's vocabulary): the bundle carries one."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    words = ["sea", "wave", "moon", "sand", "edge", "model", "runs", "small", "fast", "token"]
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator([" ".join(words[(i * j) % 10] for j in range(12)) for i in range(200)], trainer)
    tokenizer.save(str(folder / "tokenizer.json"))


def _export(name: str, work: Path) -> Path:
    from edgeattn.exporters.export import export_model
    from edgeattn.exporters.precision_builds import PrecisionOptions
    from edgeattn.sources import resolve_model

    folder = make_folder(name, work / f"{name}-hf", None)
    _tokenizer(folder)
    out = work / name
    source = resolve_model(from_hf=folder)
    export_model(source.model, out, precisions=["int8", "int4"], verify=False,
                 precision_options=PrecisionOptions(allow_degraded=True, sensitive_search=False),
                 **source.export_fields())  # fmt: skip
    return out


def _native(export: Path, bundle: Path, precision: str, repeats: int) -> dict:
    from edgeattn.exporters.web import bundle_runtime

    start = time.perf_counter()
    model = bundle_runtime(export, bundle, precision)
    model.sessions["causal_decoder"]  # noqa: B018 - made here, timed as the session's creation
    row: dict = {"create_ms": (time.perf_counter() - start) * 1000, "prefill_ms": [], "decode_ms": []}
    ids = (5 + (np.arange(PROMPT) * 7919) % 200).astype(np.int64)[None]
    for r in range(repeats + 1):
        start = time.perf_counter()
        state = model.state(ids, np.ones_like(ids), capacity=PROMPT + NEW)
        token = state.step(ids[:, -1]).argmax(-1)
        prefill = (time.perf_counter() - start) * 1000
        start = time.perf_counter()
        for _ in range(NEW - 1):
            token = state.step(token).argmax(-1)
        if r > 0:
            row["prefill_ms"].append(prefill)
            row["decode_ms"].append((time.perf_counter() - start) * 1000 / (NEW - 1))
    return row


def _node(bundle: Path, package: str, modules: Path, repeats: int, precisions: list[str]) -> dict:
    with tempfile.TemporaryDirectory(dir=modules.parent) as work_name:
        work = Path(work_name)
        result = work / "result.json"
        (work / "run.mjs").write_text(RUNNER.format(
            package=package, module=json.dumps((bundle / "edgeattn.mjs").as_uri()), base=json.dumps(str(bundle)),
            precisions=json.dumps(precisions), threads=THREADS, prompt=PROMPT, new=NEW, repeats=repeats,
            result=json.dumps(str(result))))  # fmt: skip
        subprocess.run(["node", str(work / "run.mjs")], check=True, cwd=work, timeout=3600)
        return json.loads(result.read_text())


def measure(name: str, work: Path, modules: Path, repeats: int) -> list[dict]:
    from edgeattn.exporters.web import entry_bytes, package_web

    export = _export(name, work)
    rows = []
    for level in LEVELS:  # one bundle per int4 accuracy level; fp32 and int8 measured with the first
        bundle = work / f"{name}-node-{level}"
        precisions = list(PRECISIONS) if level == LEVELS[0] else ["int4"]
        made = package_web(export, bundle, "node", precisions, int4_accuracy_level=level)
        sizes = {f["precision"]: entry_bytes(f) for f in made.files}
        found = {"native": {p: _native(export, bundle, p, repeats) for p in precisions},
                 "onnxruntime-node": _node(bundle, "onnxruntime-node", modules, repeats, precisions),
                 "onnxruntime-web wasm": _node(bundle, "onnxruntime-web", modules, repeats, precisions)}  # fmt: skip
        rows += _rows(name, found, sizes, level)
    return rows


def _rows(name: str, found: dict[str, dict[str, dict]], sizes: dict[str, int], level: int) -> list[dict]:
    rows = []
    for runtime, by_precision in found.items():
        for precision, figures in by_precision.items():
            decode = statistics.median(figures["decode_ms"])
            native = statistics.median(found["native"][precision]["decode_ms"])
            label = f"int4 (level {level})" if precision == "int4" else precision
            rows.append({"model": name, "precision": label, "runtime": runtime, "bytes": sizes[precision],
                         "prefill_ms": round(statistics.median(figures["prefill_ms"]), 1),
                         "tokens_per_s": round(1000 / decode, 2), "vs_native": round(native / decode, 2),
                         "create_ms": round(figures["create_ms"], 1)})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node-modules", type=Path, required=True)
    parser.add_argument("--models", default="smollm2-135m", help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/targets-lm.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    bench = TargetsLmBench(settings={"threads": THREADS, "node_wasm_threads": 1, "repeats": args.repeats,
                                     "prompt_tokens": PROMPT, "new_tokens": NEW,
                                     "onnxruntime_js": "1.30.0"})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            bench.rows += measure(name, Path(tmp), args.node_modules.resolve(), args.repeats)
    publish(bench, args.out)


if __name__ == "__main__":
    main()
