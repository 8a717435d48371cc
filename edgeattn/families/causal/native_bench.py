"""A language model's export beside llama.cpp's own ``llama-bench``, built from source, on the same
machine in one run: prompt processing (prefill tokens/s of a P-token prompt, llama-bench's ``-p P``)
and generation after it (tokens/s of N single-token steps at depth P, its ``-n N -d P``), at batch
1, with each process's peak resident memory beside each figure.

Every cell runs in processes of its own (edgeattn's worker; llama-bench once for prefill and once
for generation), the engines interleaved round by round; each process runs one untimed warm-up,
then ``repetitions`` timed ones. edgeattn decodes greedily (argmax each step, as its users'
generation does); llama-bench feeds a token without sampling. The llama.cpp build (commit, its
CMake flags) and the machine are recorded in the JSON.

    python -m edgeattn.families.causal.native_bench EXPORT [--precision int4]
        --llama-bench llama.cpp/build/bin/llama-bench --gguf q4_0=model-q4_0.gguf [--gguf q4_k_m=...]
        [--prompts 128,512,2048] [--new-tokens 64] [--threads 2] [--rounds 2] [--repetitions 3]
        [--out benchmarks/results/native-speed.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from edgeattn.benchmark.memory import peak_mb, status_mb

log = logging.getLogger("native_bench")

#: the CMake settings of a llama.cpp build that decide its CPU kernels (recorded beside its figures)
BUILD_FLAGS = ("CMAKE_BUILD_TYPE", "GGML_NATIVE", "GGML_AVX2", "GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
               "GGML_AVX_VNNI", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16", "GGML_OPENMP")  # fmt: skip
#: how often a peer's peak resident memory is read while it runs (seconds)
POLL_S = 0.02


class BenchError(RuntimeError):
    """A measurement that could not run (a missing file, a process that failed): the message says which."""


def watched(command: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[str, float | None]:
    """``command``'s standard output and its peak resident memory (MiB, read while it runs: a
    parent's getrusage would report the peak it carried across fork and exec)."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        peak: float | None = None
        start = time.monotonic()
        out: list[str] = []
        err: list[str] = []
        readers = [threading.Thread(target=lambda s=s, b=b: b.append(s.read()), daemon=True)
                   for s, b in ((proc.stdout, out), (proc.stderr, err))]  # fmt: skip
        for r in readers:
            r.start()
        while proc.poll() is None:
            now = status_mb("VmHWM", proc.pid)
            if now is not None:
                peak = max(peak or 0.0, now)
            if time.monotonic() - start > timeout:
                proc.kill()
                raise BenchError(f"{Path(command[0]).name} ran past {timeout:.0f} s: {' '.join(command[1:])}")
            time.sleep(POLL_S)
        for r in readers:
            r.join()
    if proc.returncode:
        tail = "".join(err).strip().splitlines()[-3:]
        raise BenchError(f"{' '.join(command[:3])} ... exited {proc.returncode}: {' | '.join(tail)}")
    return "".join(out), peak


# ------------------------------------------------------------------ edgeattn's side (its own process)
def edgeattn_cell(export: str, precision: str, prompt: int, new_tokens: int, threads: int, repetitions: int,
                  vocab_low: int = 3) -> dict[str, Any]:  # fmt: skip
    """Prefill and generation tokens/s of ``export`` at ``precision`` (one warm-up, then
    ``repetitions``), with this process's peak memory and the greedy tokens of the last run."""
    import numpy as np

    from edgeattn.runtime import load

    model = load(export, precision=precision, threads=threads, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(prompt)
    prefill, decode, tokens = [], [], []
    for run in range(repetitions + 1):
        ids = rng.integers(vocab_low, model.config.vocab_size, size=(1, prompt), dtype=np.int64)
        start = time.perf_counter()
        state = model.state(ids, np.ones_like(ids), capacity=prompt + new_tokens + 1)
        token = state.step(ids[:, -1]).argmax(-1)  # the prompt's next token: computed with the prompt
        middle = time.perf_counter()
        tokens = [int(token[0])]
        for _ in range(new_tokens):
            token = state.step(token).argmax(-1)
            tokens.append(int(token[0]))
        end = time.perf_counter()
        del state
        if run:
            prefill.append(prompt / (middle - start))
            decode.append(new_tokens / (end - middle))
    return {"prefill_tok_s": prefill, "decode_tok_s": decode, "peak_mb": peak_mb(), "tokens": tokens}


def measure_edgeattn(export: Path, precision: str, prompt: int, args: argparse.Namespace) -> dict[str, Any]:
    spec = [str(export), precision, prompt, args.new_tokens, args.threads, args.repetitions]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    out, _ = watched([sys.executable, "-m", "edgeattn.families.causal.native_bench",
                      "--worker", json.dumps(spec)], args.timeout, env)  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


# ------------------------------------------------------------------ llama.cpp's side
def llama_bench_command(binary: Path, gguf: Path, threads: int, repetitions: int, prompt: int, new_tokens: int,
                        depth: int) -> list[str]:  # fmt: skip
    """llama-bench measuring one test: ``prompt`` tokens processed, or ``new_tokens`` generated
    after ``depth`` tokens of context."""
    return [str(binary), "-m", str(gguf), "-t", str(threads), "-r", str(repetitions), "-p", str(prompt),
            "-n", str(new_tokens), "-d", str(depth), "-o", "json"]  # fmt: skip


def parse_llama_bench(out: str) -> dict[str, Any]:
    """The one test of a llama-bench ``-o json`` run: its tokens/s samples and the build it ran."""
    start = out.find("[")
    if start < 0:
        raise BenchError(f"llama-bench printed no JSON: {out.strip()[-300:]}")
    tests = json.loads(out[start:])
    if len(tests) != 1:
        raise BenchError(f"llama-bench ran {len(tests)} tests where one was asked")
    test = tests[0]
    samples = test.get("samples_ts") or [test["avg_ts"]]
    keep = ("build_commit", "build_number", "cpu_info", "backends", "model_type", "model_size", "model_n_params",
            "n_threads", "type_k", "type_v", "flash_attn", "n_batch", "n_ubatch")  # fmt: skip
    return {"samples": [float(s) for s in samples], "build": {k: test[k] for k in keep if k in test}}


def measure_llama(binary: Path, gguf: Path, prompt: int, args: argparse.Namespace) -> dict[str, Any]:
    """Prefill and generation tokens/s of ``gguf`` at ``prompt`` by llama-bench, two processes."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    pp, pp_peak = watched(llama_bench_command(binary, gguf, args.threads, args.repetitions, prompt, 0, 0),
                          args.timeout, env)  # fmt: skip
    tg, tg_peak = watched(llama_bench_command(binary, gguf, args.threads, args.repetitions, 0, args.new_tokens,
                                              prompt), args.timeout, env)  # fmt: skip
    pp_test, tg_test = parse_llama_bench(pp), parse_llama_bench(tg)
    peaks = [p for p in (pp_peak, tg_peak) if p is not None]
    return {"prefill_tok_s": pp_test["samples"], "decode_tok_s": tg_test["samples"],
            "peak_mb": max(peaks) if peaks else None, "build": tg_test["build"]}  # fmt: skip


def build_flags(binary: Path) -> dict[str, str]:
    """The kernel-deciding CMake settings of the build ``binary`` came from (its build folder's
    CMakeCache.txt, a folder or two up), where that file is there."""
    for folder in (binary.parent, *binary.parents[:3]):
        cache = folder / "CMakeCache.txt"
        if cache.is_file():
            flags = {}
            for line in cache.read_text(errors="replace").splitlines():
                name, _, value = line.partition("=")
                key = name.split(":", 1)[0]
                if key in BUILD_FLAGS:
                    flags[key] = value
            return flags
    return {}


# ------------------------------------------------------------------ the run
def bench(args: argparse.Namespace) -> dict[str, Any]:
    from edgeattn.benchmark.machine import machine_info
    from edgeattn.runtime.manifest import read_manifest
    from edgeattn.runtime.safety import graph_bytes

    export: Path = args.export
    manifest = read_manifest(export)
    entry = manifest.entry("causal_decoder", args.precision)
    engines: dict[str, dict[str, Any]] = {
        f"edgeattn {args.precision}": {"kind": "edgeattn", "mb": graph_bytes(export / entry.file) / 1e6}
    }
    for name, path in args.gguf:
        if not path.is_file():
            raise BenchError(f"no GGUF at {path}")
        engines[f"llama.cpp {name}"] = {"kind": "llama", "path": path, "mb": path.stat().st_size / 1e6}
    if not args.llama_bench.is_file():
        raise BenchError(f"no llama-bench at {args.llama_bench}: build llama.cpp from source (cmake --build)")
    prompts = [int(p) for p in args.prompts.split(",")]
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
    from tqdm import tqdm

    bar = tqdm(total=args.rounds * len(prompts) * len(engines), desc="native bench", unit="cell")
    for round_ in range(args.rounds):
        for prompt in prompts:
            order = list(engines) if round_ % 2 == 0 else list(reversed(engines))
            for name in order:
                engine = engines[name]
                if engine["kind"] == "edgeattn":
                    got = measure_edgeattn(export, args.precision, prompt, args)
                else:
                    got = measure_llama(args.llama_bench, engine["path"], prompt, args)
                samples.setdefault((name, prompt), []).append(got)
                bar.update()
                log.info("round %d, prompt %d, %s: prefill %.1f tok/s, decode %.1f tok/s", round_, prompt, name,
                         statistics.median(got["prefill_tok_s"]), statistics.median(got["decode_tok_s"]))  # fmt: skip
    bar.close()
    rows = []
    for (name, prompt), runs in samples.items():
        rows.append({
            "engine": name, "prompt": prompt,
            "prefill_tok_s": statistics.median(s for r in runs for s in r["prefill_tok_s"]),
            "decode_tok_s": statistics.median(s for r in runs for s in r["decode_tok_s"]),
            "decode_rounds": [statistics.median(r["decode_tok_s"]) for r in runs],
            "prefill_rounds": [statistics.median(r["prefill_tok_s"]) for r in runs],
            "peak_mb": max((r["peak_mb"] for r in runs if r.get("peak_mb") is not None), default=None),
            "on_disk_mb": round(engines[name]["mb"], 1),
        })  # fmt: skip
    mine = {r["prompt"]: r for r in rows if engines[r["engine"]]["kind"] == "edgeattn"}
    for r in rows:
        if engines[r["engine"]]["kind"] == "llama":
            ours = mine[r["prompt"]]
            ours.setdefault("vs", {})[r["engine"]] = {
                "prefill": ours["prefill_tok_s"] / r["prefill_tok_s"],
                "decode": ours["decode_tok_s"] / r["decode_tok_s"],
            }
    build = next((r["build"] for runs in samples.values() for r in runs if "build" in r), {})
    return {
        "benchmark": "native speed",
        "date": time.strftime("%Y-%m-%d"),
        "export": str(export),
        "parameters": args.parameters,
        "precision": args.precision,
        "prompts": prompts,
        "new_tokens": args.new_tokens,
        "threads": args.threads,
        "rounds": args.rounds,
        "repetitions": args.repetitions,
        "harness": "each cell in its own processes: edgeattn's worker (runtime.load, state + greedy steps); "
        "llama-bench -p P -n 0 and -p 0 -n N -d P; one warm-up each, medians of all timed runs",
        "llama_cpp": {"binary": str(args.llama_bench), **build, "cmake": build_flags(args.llama_bench)},
        "machine": machine_info(),
        "rows": rows,
    }


def table(result: dict[str, Any]) -> str:
    lines = [f"{result['precision']} beside llama-bench (build {result['llama_cpp'].get('build_commit', '?')}), "
             f"batch 1, {result['new_tokens']} new tokens, {result['threads']} threads, {result['rounds']} rounds x "
             f"{result['repetitions']} runs",
             f"{'engine':<20} {'prompt':>6} {'prefill tok/s':>13} {'decode tok/s':>12} {'peak MiB':>8} "
             f"{'disk MB':>8}  ratios (edgeattn / peer: prefill, decode)"]  # fmt: skip
    for r in sorted(result["rows"], key=lambda r: (r["prompt"], r["engine"])):
        peak = f"{r['peak_mb']:>8.0f}" if r.get("peak_mb") is not None else f"{'-':>8}"
        vs = "  ".join(f"{k}: {v['prefill']:.2f}x, {v['decode']:.2f}x" for k, v in r.get("vs", {}).items())
        lines.append(f"{r['engine']:<20} {r['prompt']:>6} {r['prefill_tok_s']:>13.1f} {r['decode_tok_s']:>12.1f} "
                     f"{peak} {r['on_disk_mb']:>8.0f}  {vs}")  # fmt: skip
    return "\n".join(lines)


def _gguf(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--gguf takes NAME=FILE (q4_0=model-q4_0.gguf), not {text!r}")
    return name, Path(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path, nargs="?")
    parser.add_argument("--precision", default="int4")
    parser.add_argument("--llama-bench", type=Path)
    parser.add_argument("--gguf", type=_gguf, action="append", default=[], help="NAME=FILE, repeatable")
    parser.add_argument("--prompts", default="128,512,2048")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repetitions", type=int, default=3, help="timed runs per process, after a warm-up")
    parser.add_argument("--parameters", default=None, help="the model's size in words, for the JSON (1.5B)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a process may run")
    parser.add_argument("--out", type=Path, default=None, help="the JSON result (default: print only)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(edgeattn_cell(*json.loads(args.worker))))  # noqa: T201 - the worker's answer
        return
    if args.export is None or args.llama_bench is None or not args.gguf:
        parser.error("EXPORT, --llama-bench and at least one --gguf are needed")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        result = bench(args)
    except BenchError as exc:
        raise SystemExit(f"native bench: {exc}") from None
    print(table(result))  # noqa: T201 - the script's output
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {args.out}")  # noqa: T201


if __name__ == "__main__":
    main()
