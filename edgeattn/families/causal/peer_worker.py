"""One variant of edgeattn.families.causal.peers in its own process (standalone: it runs in the
project's environment or in the peers' one, which has no edgeattn).

    python edgeattn/families/causal/peer_worker.py '{"variant": ..., "path": ..., "batch": 1, "prompt": 128, ...}'

Loads the variant, runs one untimed generation, then ``runs`` timed ones: each the prompt (its
time to the first token's logits: prefill) and ``new_tokens - 1`` greedy steps (decode tokens/s,
every row made to run all steps). Prints one JSON object: the timings, the first run's tokens,
the peak resident memory of the process, the load time. ``bandwidth`` measures this machine's
memory instead (reading a large array; copying one).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def _prompt(spec: dict[str, Any]) -> np.ndarray:
    rng = np.random.default_rng(spec.get("seed", 0))
    return rng.integers(3, spec["vocab"], size=(spec["batch"], spec["prompt"]), dtype=np.int64)


def _peak_mb() -> float:
    """This process's peak resident memory (VmHWM: getrusage's ru_maxrss carries the parent's peak
    across fork and exec, so a child of a large process reports its parent's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Stepwise:
    """What every variant provides: ``start(ids) -> logits (B, V)`` of the prompt's next token, and
    ``step(tokens) -> logits (B, V)``."""

    def start(self, ids: np.ndarray) -> np.ndarray: ...

    def step(self, tokens: np.ndarray) -> np.ndarray: ...


class Edgeattn(Stepwise):
    def __init__(self, path: str, precision: str, threads: int, capacity: int) -> None:
        from edgeattn.runtime import load

        self.model = load(path, threads=threads, precision=precision, providers=["CPUExecutionProvider"])
        self.capacity = capacity

    def start(self, ids: np.ndarray) -> np.ndarray:
        self.state = None  # the last generation's cache goes before this one's is made, as in generate()
        self.state = self.model.state(ids, np.ones_like(ids), capacity=self.capacity)
        return self.state.step(ids[:, -1])

    def step(self, tokens: np.ndarray) -> np.ndarray:
        return self.state.step(tokens)


class Transformers(Stepwise):
    def __init__(self, path: str, threads: int, optimum: bool = False) -> None:
        import torch

        torch.set_num_threads(threads)
        self.torch = torch
        if optimum:
            import onnxruntime as ort
            from optimum.onnxruntime import ORTModelForCausalLM

            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            self.model = ORTModelForCausalLM.from_pretrained(path, provider="CPUExecutionProvider",
                                                             session_options=options, use_cache=True)  # fmt: skip
        else:
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()

    def _run(self, ids: Any) -> np.ndarray:
        with self.torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=self.mask, past_key_values=self.past, use_cache=True)
        self.past = out.past_key_values
        return out.logits[:, -1].float().numpy()

    def start(self, ids: np.ndarray) -> np.ndarray:
        self.past = None
        self.mask = self.torch.ones(ids.shape, dtype=self.torch.int64)
        return self._run(self.torch.from_numpy(ids))

    def step(self, tokens: np.ndarray) -> np.ndarray:
        self.mask = self.torch.cat([self.mask, self.torch.ones(len(tokens), 1, dtype=self.torch.int64)], dim=1)
        return self._run(self.torch.from_numpy(tokens[:, None]))


class Genai(Stepwise):
    def __init__(self, path: str, threads: int, capacity: int) -> None:
        import onnxruntime_genai as og

        config = og.Config(path)
        config.clear_providers()
        self.og, self.model, self.capacity = og, og.Model(config), capacity

    def start(self, ids: np.ndarray) -> np.ndarray:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=self.capacity, batch_size=ids.shape[0], do_sample=False)
        self.generator = None  # the last generation's buffers go first
        self.generator = self.og.Generator(self.model, params)
        self.generator.append_tokens(ids.astype(np.int32))
        return self._logits()

    def _logits(self) -> np.ndarray:
        logits = np.asarray(self.generator.get_logits())
        return logits[:, -1] if logits.ndim == 3 else logits

    def step(self, tokens: np.ndarray) -> np.ndarray:
        if len(tokens) == 1:
            self.generator.append_tokens(tokens.astype(np.int32)[:, None])
        else:  # its batches take their prompt alone; then it picks each greedy token itself (the same argmax)
            self.generator.generate_next_token()
        return self._logits()


class LlamaCpp(Stepwise):
    def __init__(self, path: str, threads: int, capacity: int) -> None:
        from llama_cpp import Llama

        # n_batch as large as the context: a prompt in one batch, and a row of logits for every position
        self.model = Llama(model_path=path, n_ctx=capacity + 8, n_threads=threads, n_threads_batch=threads,
                           n_batch=capacity + 8, logits_all=False, verbose=False)  # fmt: skip

    def start(self, ids: np.ndarray) -> np.ndarray:
        if ids.shape[0] != 1:
            raise SystemExit("llama-cpp-python's Llama runs one sequence")
        self.model.reset()
        self.model.eval(ids[0].tolist())
        return self._logits()

    def step(self, tokens: np.ndarray) -> np.ndarray:
        self.model.eval([int(tokens[0])])
        return self._logits()

    def _logits(self) -> np.ndarray:
        """The last position's logits from the context (Llama.scores is written only with logits_all)."""
        pointer = self.model._ctx.get_logits_ith(-1)
        return np.ctypeslib.as_array(pointer, shape=(self.model.n_vocab(),)).copy()[None]


def make(spec: dict[str, Any]) -> Stepwise:
    variant, path, threads = spec["variant"], spec["path"], spec["threads"]
    capacity = spec["prompt"] + spec["new_tokens"]
    if variant.startswith("edgeattn-"):
        return Edgeattn(path, variant.split("-", 1)[1], threads, capacity)
    if variant == "transformers":
        return Transformers(path, threads)
    if variant.startswith("optimum-"):
        return Transformers(path, threads, optimum=True)
    if variant.startswith("genai-"):
        return Genai(path, threads, capacity)
    if variant.startswith("llamacpp-"):
        return LlamaCpp(path, threads, capacity)
    raise SystemExit(f"unknown variant {variant}")


def generate(model: Stepwise, ids: np.ndarray, new_tokens: int) -> tuple[float, float, np.ndarray]:
    """(prefill s, decode tokens/s per row, tokens (B, new_tokens))."""
    start = time.perf_counter()
    tokens = [model.start(ids).argmax(-1)]
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(new_tokens - 1):
        tokens.append(model.step(tokens[-1]).argmax(-1))
    decode = (new_tokens - 1) / (time.perf_counter() - start)
    return prefill, decode, np.stack(tokens, axis=1)


def bandwidth() -> dict[str, Any]:
    """GB/s reading 1 GiB (a sum, one thread) and copying it (read + write counted), best of 5."""
    data = np.ones(1 << 28, dtype=np.float32)
    out = np.empty_like(data)
    read, copy = [], []
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        read.append(data.nbytes / (time.perf_counter() - start) / 1e9)
        start = time.perf_counter()
        np.copyto(out, data)
        copy.append(2 * data.nbytes / (time.perf_counter() - start) / 1e9)
    return {"read_gb_s": max(read), "copy_gb_s": max(copy)}


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec["variant"] == "bandwidth":
        print(json.dumps(bandwidth()))  # noqa: T201 - the worker's answer
        return
    start = time.perf_counter()
    model = make(spec)
    load_s = time.perf_counter() - start
    ids = _prompt(spec)
    generate(model, ids, min(8, spec["new_tokens"]))  # warm-up
    prefill, decode, tokens = [], [], None
    for _ in range(spec["runs"]):
        p, d, t = generate(model, ids, spec["new_tokens"])
        prefill.append(p)
        decode.append(d)
        tokens = t if tokens is None else tokens
    assert tokens is not None
    print(json.dumps({"prefill_s": prefill, "decode_tok_s": decode, "tokens": tokens.tolist(),  # noqa: T201
                      "peak_mb": _peak_mb(), "load_s": load_s, "path": str(Path(spec["path"]))}))  # fmt: skip


if __name__ == "__main__":
    main()
