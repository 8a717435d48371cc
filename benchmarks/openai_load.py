"""Concurrent streaming chat clients against OpenAI-compatible servers: edgeattn's
(``edgeattn serve EXPORT --api openai``, continuous batching) and llama.cpp's native
``llama-server`` built from source (continuous batching over as many slots as the most clients;
``--llama-server PATH``; ``llama-cpp-python``, that binding's own server, which answers one request
at a time, is kept as the peer of the older figures), the same real checkpoint, the same threads:
throughput in tokens/s, time to first token and inter-token latency (p50 / p99).
``--servers edgeattn,ray1,ray2`` sets edgeattn's server in one process beside the same API as Ray
Serve replicas behind its ingress (``serve --ray``) on a local cluster of this machine: one replica
of all the threads, or two of half each (ratios against the one process).
``--soak SECONDS`` instead runs 32 clients against edgeattn's server (its own process) for that
long, one in four going mid-stream, and reports errors, rows left and the server's memory over time.

Usage: ``python benchmarks/openai_load.py EXPORT --gguf Q4_0.gguf [--servers edgeattn,llama-server]
[--clients 1,8,32] [--requests 2] [--new-tokens 128 | 16-128] [--threads 2] [--json OUT]`` where EXPORT is the
real SmolLM2-135M-Instruct's export (int4) and the GGUF its llama.cpp Q4_0
(``benchmarks/real_quality.py`` writes both into ``~/.cache/edgeattn-real/gguf``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(os.environ.get("EDGEATTN_PEERS", Path.home() / ".cache" / "edgeattn-peers"))
PROMPTS = ["Write a long story about the sea.", "Explain how a lighthouse works, in detail.",
           "Describe a walk along the beach at night.", "Tell me everything you know about the moon.",
           "Write a letter to a friend about your summer.", "Describe how bread is made, step by step.",
           "Write a poem about waves, then explain it.", "What makes a good teacher? Explain at length."]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server stopped (exit {process.returncode}); its log is in the temporary directory")
        try:
            with urllib.request.urlopen(url + "/models", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{url} did not answer within {timeout} s")


def one_chat(url: str, model: str, prompt: str, new_tokens: int, go: threading.Event | None = None) -> dict[str, Any]:
    """One streamed chat: when each content piece came, and the answer's token count."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    start = time.perf_counter()
    times, usage = [], None
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                            max_tokens=new_tokens, temperature=0, stream=True,
                                            stream_options={"include_usage": True})  # fmt: skip
    for i, chunk in enumerate(stream):
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter() - start)
        if go is not None and i == 3:  # a client that goes mid-stream
            stream.close()
            return {"times": times, "tokens": None, "went": True}
    return {"times": times, "tokens": usage if usage is not None else len(times), "went": False}


def token_range(spec: str) -> tuple[int, int]:
    """``--new-tokens``: ``N`` (every answer up to N tokens) or ``A-B`` (each answer's limit drawn
    from A to B, so that rows end at different times, as real traffic's do)."""
    low, _, high = spec.partition("-")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--new-tokens takes N or A-B, not {spec!r}") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"--new-tokens {spec}: need 1 <= A <= B")
    return bounds


def load_round(url: str, model: str, clients: int, requests: int, new_tokens: tuple[int, int]) -> dict[str, Any]:
    """``clients`` clients streaming ``requests`` chats each in turn; each chat's token limit drawn
    from ``new_tokens`` by a seed of the client count, so every server gets the same jobs."""
    limits = np.random.default_rng(clients).integers(new_tokens[0], new_tokens[1] + 1, clients * requests)
    jobs = [(PROMPTS[i % len(PROMPTS)], int(limits[i])) for i in range(clients * requests)]
    start = time.perf_counter()
    errors = 0

    def client(k: int) -> list[dict[str, Any]]:
        nonlocal errors
        done = []
        for prompt, limit in jobs[k::clients]:
            try:
                done.append(one_chat(url, model, prompt, limit))
            except Exception:  # counted, never silently dropped
                errors += 1
        return done

    with ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(client, range(clients)) for r in rs]
    wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    ttft = [r["times"][0] for r in results if r["times"]]
    gaps = [b - a for r in results for a, b in zip(r["times"], r["times"][1:], strict=False)]
    return {"clients": clients, "requests": len(jobs), "errors": errors, "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "ttft_p50_ms": 1e3 * float(np.percentile(ttft, 50)),
            "ttft_p99_ms": 1e3 * float(np.percentile(ttft, 99)), "itl_p50_ms": 1e3 * float(np.percentile(gaps, 50)),
            "itl_p99_ms": 1e3 * float(np.percentile(gaps, 99))}  # fmt: skip


def _log(name: str) -> Any:
    """A file for a server's log (a pipe nobody reads would fill and stop it)."""
    import tempfile

    return open(Path(tempfile.gettempdir()) / f"openai-load-{name}.log", "w")  # noqa: SIM115


def start_edgeattn(export: Path, port: int, threads: int, rows: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return subprocess.Popen([sys.executable, "-m", "edgeattn.cli", "serve", str(export), "--api", "openai",
                             "--precision", "int4", "--port", str(port), "--max-rows", str(rows)],
                            stdout=subprocess.DEVNULL, stderr=_log("edgeattn"), text=True, env=env)  # fmt: skip


def start_ray(export: Path, port: int, threads: int, rows: int, replicas: int) -> subprocess.Popen:
    """``serve --api openai --ray`` on a local cluster: ``replicas`` of ``threads // replicas`` threads."""
    each = max(1, threads // replicas)
    return subprocess.Popen([sys.executable, "-m", "edgeattn.cli", "serve", str(export), "--api", "openai", "--ray",
                             "--precision", "int4", "--port", str(port), "--max-rows", str(rows),
                             "--min-replicas", str(replicas), "--max-replicas", str(replicas),
                             "--threads", str(each)],
                            stdout=subprocess.DEVNULL, stderr=_log(f"ray{replicas}"), text=True,
                            env={**os.environ, "RAY_ADDRESS": ""})  # fmt: skip


def start_llama_server(binary: Path, gguf: Path, port: int, threads: int, slots: int) -> subprocess.Popen:
    """llama.cpp's own server: ``slots`` sequences decoded together (continuous batching), 512
    positions each."""
    if not binary.is_file():
        raise SystemExit(f"{binary} is not a llama-server binary; build llama.cpp (cmake --build build --target "
                         "llama-server) and pass --llama-server PATH")  # fmt: skip
    return subprocess.Popen([str(binary), "-m", str(gguf), "--threads", str(threads), "--threads-batch", str(threads),
                             "-np", str(slots), "-c", str(512 * slots), "--cont-batching", "--host", "127.0.0.1",
                             "--port", str(port), "--alias", "q4_0", "--no-webui"],
                            stdout=subprocess.DEVNULL, stderr=_log("llama-server"), text=True)  # fmt: skip


def start_llama(gguf: Path, port: int, threads: int) -> subprocess.Popen:
    return subprocess.Popen([str(PEERS / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(gguf),
                             "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", "4096",
                             "--port", str(port), "--model_alias", "q4_0",
                             "--interrupt_requests", "False"],  # queued, as a server must: not cut off
                            stdout=subprocess.DEVNULL, stderr=_log("llama-cpp"), text=True)  # fmt: skip


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))


def soak(export: Path, seconds: float, clients: int, new_tokens: int, threads: int) -> dict[str, Any]:
    """``clients`` streaming clients for ``seconds`` against ``edgeattn serve`` in its own process,
    one in four going after a few pieces: errors, the rows left (its /health), and the server's
    memory every few seconds (growth over the second half says whether it is bounded)."""
    port = free_port()
    process = start_edgeattn(export, port, threads, clients)
    url = f"http://127.0.0.1:{port}/v1"
    name = export.resolve().name
    stats = {"answers": 0, "went": 0, "errors": 0, "tokens": 0}
    lock = threading.Lock()
    try:
        wait_ready(url, process)
        one_chat(url, name, PROMPTS[0], 16)  # warm-up
        start = time.time()
        end = start + seconds
        samples: list[tuple[float, float]] = []

        def client(k: int) -> None:
            i = 0
            while time.time() < end:
                goes = (k + i) % 4 == 0
                try:
                    r = one_chat(url, name, PROMPTS[(k + i) % len(PROMPTS)], new_tokens,
                                 threading.Event() if goes else None)  # fmt: skip
                    with lock:
                        stats["went" if r["went"] else "answers"] += 1
                        stats["tokens"] += r["tokens"] or 0
                except Exception:
                    with lock:
                        stats["errors"] += 1
                i += 1

        def sampler() -> None:
            while time.time() < end:
                samples.append((time.time() - start, rss_mb(process.pid)))
                time.sleep(2)

        threads_ = [threading.Thread(target=client, args=(k,)) for k in range(clients)] + [threading.Thread(
            target=sampler)]  # fmt: skip
        for t in threads_:
            t.start()
        for t in threads_:
            t.join()
        deadline = time.time() + 30
        while time.time() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
                batch = json.loads(r.read())["batches"][name]
            if not batch["rows"]:
                break
            time.sleep(0.2)
        settled = rss_mb(process.pid)
    finally:
        process.terminate()
        process.wait(60)

    def at(fraction: float) -> float:
        return next(m for t, m in samples if t >= fraction * seconds)

    return {**stats, "seconds": seconds, "clients": clients, "rows_left": batch["rows"], "ended": batch["ended"],
            "widest_batch": batch["widest"], "rss_quarter_mb": at(0.25), "rss_half_mb": at(0.5),
            "rss_end_mb": samples[-1][1], "rss_max_mb": max(m for _, m in samples), "rss_settled_mb": settled,
            "growth_second_half_mb": samples[-1][1] - at(0.5),
            "rss_series_mb": [(round(t), round(m, 1)) for t, m in samples[:: max(1, len(samples) // 60)]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--gguf", type=Path, default=Path.home() / ".cache" / "edgeattn-real" / "gguf" / "q4_0.gguf")
    parser.add_argument("--servers", default="edgeattn,llama-server",
                        help="of edgeattn, llama-server, llama-cpp-python, ray1, ray2 (Ray Serve, 1 or 2 replicas)")
    parser.add_argument("--llama-server", type=Path,
                        default=Path(os.environ.get("EDGEATTN_LLAMA_SERVER",
                                                    PEERS / "llama.cpp" / "build" / "bin" / "llama-server")))
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--requests", type=int, default=2, help="streamed chats each client sends in turn")
    parser.add_argument("--rounds", type=int, default=1,
                        help="times every server is started and loaded in turn (figures: each one's median)")
    parser.add_argument("--new-tokens", type=token_range, default=(128, 128),
                        help="each answer's token limit: N, or A-B drawn per request (rows ending at different times)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--soak", type=float, default=0, help="seconds of the soak instead of the load run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from edgeattn.benchmark.machine import machine_info

    report: dict[str, Any] = {"benchmark": "openai_load", "date": time.strftime("%Y-%m-%d"), "machine": machine_info(),
                              "export": args.export.name,
                              "new_tokens": list(args.new_tokens), "threads": args.threads}  # fmt: skip
    if args.soak:
        report["soak"] = soak(args.export, args.soak, 32, args.new_tokens[1], args.threads)
        print(json.dumps(report["soak"], indent=2))
        out = args.json or ROOT / "benchmarks" / "results" / "openai-soak.json"
    else:
        counts = [int(c) for c in args.clients.split(",")]
        starters = {"edgeattn": ("edgeattn int4", lambda p: start_edgeattn(args.export, p, args.threads, max(counts))),
                    "llama-server": ("llama-server Q4_0",
                                     lambda p: start_llama_server(args.llama_server, args.gguf, p, args.threads,
                                                                  max(counts))),
                    "llama-cpp-python": ("llama-cpp-python server Q4_0",
                                         lambda p: start_llama(args.gguf, p, args.threads)),
                    "ray1": ("edgeattn int4, Ray Serve 1 replica",
                             lambda p: start_ray(args.export, p, args.threads, max(counts), 1)),
                    "ray2": ("edgeattn int4, Ray Serve 2 replicas",
                             lambda p: start_ray(args.export, p, args.threads, max(counts), 2))}  # fmt: skip
        chosen = args.servers.split(",")
        if "llama-server" in chosen and args.llama_server.is_file():  # the build beside its figures
            version = subprocess.run([str(args.llama_server), "--version"], capture_output=True, text=True)
            report["llama_server"] = " ".join((version.stdout + version.stderr).split())
        if unknown := [s for s in chosen if s not in starters]:
            raise SystemExit(f"unknown servers {unknown}; choose from {', '.join(starters)}")
        rows = []
        measured = []
        for server, start in (starters[s] for _ in range(args.rounds) for s in chosen):
            port = free_port()
            process = start(port)
            url = f"http://127.0.0.1:{port}/v1"
            try:
                wait_ready(url, process)
                model = args.export.resolve().name if server.startswith("edgeattn") else "q4_0"
                one_chat(url, model, PROMPTS[0], 16)  # warm-up
                for clients in counts:
                    row = {"server": server, **load_round(url, model, clients, args.requests, args.new_tokens)}
                    print(f"{server:36s} {clients:3d} clients: {row['tokens_per_s']:7.1f} tok/s, TTFT p50 "
                          f"{row['ttft_p50_ms']:.0f} ms p99 {row['ttft_p99_ms']:.0f}, ITL p50 {row['itl_p50_ms']:.1f} "
                          f"ms p99 {row['itl_p99_ms']:.1f}, errors {row['errors']}", flush=True)  # fmt: skip
                    measured.append(row)
            finally:
                process.send_signal(signal.SIGINT)  # Ray's servers stop their cluster on Ctrl-C
                try:
                    process.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    process.kill()
        for server, _ in (starters[s] for s in chosen):  # each figure the median of the rounds
            for clients in counts:
                runs = [r for r in measured if r["server"] == server and r["clients"] == clients]
                row = {key: float(np.median([r[key] for r in runs])) if isinstance(value, float) else value
                       for key, value in runs[0].items()}  # fmt: skip
                rows.append(row | {"rounds": len(runs), "tokens_per_s_each": [r["tokens_per_s"] for r in runs],
                                   "errors": sum(r["errors"] for r in runs)})  # fmt: skip
        report["rows"] = rows
        base = starters["edgeattn"][0]
        for clients in counts:
            ours = next((r for r in rows if r["server"] == base and r["clients"] == clients), None)
            theirs = next((r for r in rows if r["server"].startswith("llama") and r["clients"] == clients), None)
            for row in rows:
                if theirs and row["server"].startswith("edgeattn") and row["clients"] == clients:
                    row["vs_llama_cpp"] = row["tokens_per_s"] / theirs["tokens_per_s"]
            if ours and theirs:
                print(f"{clients:3d} clients: edgeattn {ours['vs_llama_cpp']:.2f}x {theirs['server']}'s throughput, "
                      f"TTFT p50 {ours['ttft_p50_ms']:.0f} vs {theirs['ttft_p50_ms']:.0f} ms")  # fmt: skip
            for row in rows:
                if ours and "Ray" in row["server"] and row["clients"] == clients:
                    row["vs_in_process"] = row["tokens_per_s"] / ours["tokens_per_s"]
                    print(f"{clients:3d} clients: {row['server']} {row['vs_in_process']:.2f}x one process's "
                          f"throughput, TTFT p50 {row['ttft_p50_ms']:.0f} vs {ours['ttft_p50_ms']:.0f} ms")  # fmt: skip
        default = "openai-load-ray.json" if any(s.startswith("ray") for s in chosen) else "openai-load.json"
        out = args.json or ROOT / "benchmarks" / "results" / default
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
