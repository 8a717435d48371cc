"""The encoder on every runtime its targets reach, side by side in one run: native ONNX Runtime
(Python), onnxruntime-node, onnxruntime-web's wasm backend in Node.js (one thread, as it runs
there) and in headless Chromium (a cross-origin isolated page, 1 and 2 threads), for a
MiniLM-shaped and a BERT-base-shaped encoder (random weights) at fp32 and int8, at 1x16, 1x128 and
8x128: session creation and the median of each inference, each runtime's ratio to native. Prints
the table, writes the JSON.

    python benchmarks/targets.py --node-modules DIR [--chromium PATH] [--models minilm,bert-base]
                                 [--repeats 20] [--out FILE]

DIR holds onnxruntime-node and onnxruntime-web (``npm install --ignore-scripts onnxruntime-node@1.30.0
onnxruntime-web@1.30.0``).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from edgeattn.benchmark.machine import machine_info
from edgeattn.benchmark.report import publish
from edgeattn.config import get_preset
from edgeattn.exporters.export import export_model
from edgeattn.model import build_model
from edgeattn.runtime.session import create_session

SHAPES = {"minilm": {"d_model": 384, "n_heads": 12, "d_ff": 1536, "n_encoder_layers": 6}, "bert-base": {}}
SIZES = ((1, 16), (1, 128), (8, 128))
THREADS = 2

RUNNER = """
import * as ort from "{package}";
import {{ readFile, writeFile }} from "node:fs/promises";
if (ort.env?.wasm) ort.env.wasm.numThreads = 1;
const bytes = await readFile({model});
const options = ort.env?.versions?.web ? {{ executionProviders: ["wasm"] }}
                                       : {{ executionProviders: ["cpu"], intraOpNumThreads: {threads} }};
let start = performance.now();
const session = await ort.InferenceSession.create(bytes, options);
const out = {{ create_ms: performance.now() - start, runs: {{}} }};
for (const [b, s] of {sizes}) {{
  const ids = new BigInt64Array(b * s).map((_, i) => BigInt(5 + (i * 7919) % 1000));
  const feeds = {{ input_ids: new ort.Tensor("int64", ids, [b, s]),
                  attention_mask: new ort.Tensor("int64", new BigInt64Array(b * s).fill(1n), [b, s]) }};
  if (session.inputNames.includes("token_type_ids")) {{
    feeds.token_type_ids = new ort.Tensor("int64", new BigInt64Array(b * s), [b, s]);
  }}
  await session.run(feeds);
  const times = [];
  for (let r = 0; r < {repeats}; r++) {{
    start = performance.now();
    await session.run(feeds);
    times.push(performance.now() - start);
  }}
  times.sort((x, y) => x - y);
  out.runs[`${{b}}x${{s}}`] = times[Math.floor(times.length / 2)];
}}
await writeFile({result}, JSON.stringify(out));
"""


PAGE = """<!doctype html><html><head><meta charset="utf-8">
<script type="importmap">{"imports": {"onnxruntime-web": "./ort/ort.wasm.bundle.min.mjs"}}</script></head><body>
<script type="module">
import * as ort from "onnxruntime-web";
const params = new URLSearchParams(location.search);
ort.env.wasm.numThreads = Number(params.get("threads"));
const bytes = new Uint8Array(await (await fetch(params.get("model"))).arrayBuffer());
let start = performance.now();
const session = await ort.InferenceSession.create(bytes, { executionProviders: ["wasm"] });
const out = { create_ms: performance.now() - start, runs: {}, isolated: self.crossOriginIsolated };
for (const [b, s] of JSON.parse(params.get("sizes"))) {
  const ids = new BigInt64Array(b * s).map((_, i) => BigInt(5 + (i * 7919) % 1000));
  const feeds = { input_ids: new ort.Tensor("int64", ids, [b, s]),
                  attention_mask: new ort.Tensor("int64", new BigInt64Array(b * s).fill(1n), [b, s]) };
  if (session.inputNames.includes("token_type_ids")) {
    feeds.token_type_ids = new ort.Tensor("int64", new BigInt64Array(b * s), [b, s]);
  }
  await session.run(feeds);
  const times = [];
  for (let r = 0; r < Number(params.get("repeats")); r++) {
    start = performance.now();
    await session.run(feeds);
    times.push(performance.now() - start);
  }
  times.sort((x, y) => x - y);
  out.runs[`${b}x${s}`] = times[Math.floor(times.length / 2)];
}
window.benchResult = out;
</script></body></html>
"""


def _chromium(models: list[Path], modules: Path, chromium: str, repeats: int) -> dict[tuple[str, int], dict]:
    """Each model in headless Chromium at 1 and 2 threads, through a page served cross-origin
    isolated (edgeattn serve-web's handler): {(model file name, threads): figures}."""
    import functools
    import threading
    from http.server import ThreadingHTTPServer

    from playwright.sync_api import sync_playwright

    from edgeattn.serving.web_page import _Handler

    with tempfile.TemporaryDirectory() as site_name:
        site = Path(site_name)
        for model in models:
            (site / model.name).symlink_to(model)
        (site / "bench.html").write_text(PAGE)
        handler = functools.partial(_Handler, bundle=site, ort_dist=modules / "onnxruntime-web" / "dist")
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        found = {}
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                for model in models:
                    for threads in (1, 2):
                        page = browser.new_page()
                        query = (f"model={model.name}&threads={threads}&repeats={repeats}"
                                 f"&sizes={json.dumps([list(s) for s in SIZES])}")  # fmt: skip
                        page.goto(f"http://127.0.0.1:{server.server_address[1]}/bench.html?{query}")
                        page.wait_for_function("window.benchResult !== undefined", timeout=3_600_000, polling=500)
                        found[(model.name, threads)] = page.evaluate("window.benchResult")
                        assert found[(model.name, threads)]["isolated"], "the page was not cross-origin isolated"
                        page.close()
                browser.close()
        finally:
            server.shutdown()
            server.server_close()
    return found


@dataclass
class TargetsBench:
    rows: list[dict] = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"benchmark": "targets", "machine": machine_info(), "settings": self.settings, "rows": self.rows}

    def table(self) -> str:
        from edgeattn.benchmark.results_page import targets_table

        return targets_table(self.to_dict())


def _native(model: Path, repeats: int) -> dict:
    start = time.perf_counter()
    session = create_session(model, threads=THREADS)
    out = {"create_ms": (time.perf_counter() - start) * 1000, "runs": {}}
    names = [i.name for i in session.get_inputs()]
    for b, s in SIZES:
        ids = (5 + (np.arange(b * s) * 7919) % 1000).astype(np.int64).reshape(b, s)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if "token_type_ids" in names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        session.run(None, feeds)
        times = []
        for _ in range(repeats):
            begin = time.perf_counter()
            session.run(None, feeds)
            times.append((time.perf_counter() - begin) * 1000)
        out["runs"][f"{b}x{s}"] = statistics.median(times)
    return out


def _node(model: Path, package: str, modules: Path, repeats: int) -> dict:
    with tempfile.TemporaryDirectory(dir=modules.parent) as work_name:
        work = Path(work_name)
        result = work / "result.json"
        (work / "run.mjs").write_text(RUNNER.format(package=package, model=json.dumps(str(model)), threads=THREADS,
                                                    sizes=json.dumps([list(s) for s in SIZES]), repeats=repeats,
                                                    result=json.dumps(str(result))))  # fmt: skip
        subprocess.run(["node", str(work / "run.mjs")], check=True, cwd=work, timeout=3600)
        return json.loads(result.read_text())


def measure(name: str, work: Path, modules: Path, repeats: int, chromium: str | None) -> list[dict]:
    config = replace(get_preset("bert-base"), **SHAPES[name], max_len=128)
    export = work / name
    export_model(build_model(config, seed=0), export, graphs=["encoder"], precisions=["int8"], verify=False)
    rows = []
    for precision, file in (("fp32", "encoder.onnx"), ("int8", "encoder.int8.onnx")):
        whole = work / f"{name}.{precision}.onnx"
        onnx.save_model(onnx.load(str(export / file)), str(whole))  # self-contained, as the bundles hold it
        found = {"native": _native(whole, repeats),
                 "onnxruntime-node": _node(whole, "onnxruntime-node", modules, repeats),
                 "onnxruntime-web wasm": _node(whole, "onnxruntime-web", modules, repeats)}  # fmt: skip
        if chromium is not None:
            browser = _chromium([whole], modules, chromium, repeats)
            for threads in (1, 2):
                found[f"chromium wasm, {threads} thread{'s' if threads > 1 else ''}"] = browser[(whole.name, threads)]
        for runtime, figures in found.items():
            for size, ms in figures["runs"].items():
                rows.append({"model": name, "precision": precision, "runtime": runtime, "size": size,
                             "ms": round(ms, 2), "create_ms": round(figures["create_ms"], 1),
                             "vs_native": round(ms / found["native"]["runs"][size], 2)})  # fmt: skip
        logging.info("%s %s done", name, precision)
    return rows


def _version(chromium: str | None) -> str | None:
    if chromium is None:
        return None
    return subprocess.run([chromium, "--version"], capture_output=True, text=True).stdout.strip() or None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node-modules", type=Path, required=True)
    parser.add_argument("--chromium", default=shutil.which("chromium"), help="Chromium's executable (default: on PATH)")
    parser.add_argument("--models", default=",".join(SHAPES))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/targets.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    bench = TargetsBench(settings={"threads": THREADS, "node_wasm_threads": 1, "repeats": args.repeats,
                                   "onnxruntime_js": "1.30.0", "chromium": _version(args.chromium)})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            bench.rows += measure(name, Path(tmp), args.node_modules.resolve(), args.repeats, args.chromium)
    publish(bench, args.out)


if __name__ == "__main__":
    main()
