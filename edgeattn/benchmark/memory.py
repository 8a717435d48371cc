"""Peak resident memory of one variant, measured alone in a fresh process.

Memory cannot be told apart between variants that share a process (freed memory is reused, not
returned), so each variant is rebuilt from a small JSON probe in a child process: the child
imports what the variant needs, notes its peak resident set, builds the variant (loads the
weights or creates the session), runs it once at the benchmark's largest shape, and reports the
peak again. ``peak_mb`` is the whole process (interpreter and libraries included: what a
deployment pays); ``added_mb`` is what the variant itself needed beyond its imports.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from collections.abc import Callable
from typing import Any

Probe = dict[str, Any]


def onnx_probe(path: str, provider: Any, threads: int) -> Probe:
    """How to rebuild an ONNX Runtime variant: the file, the provider (a name or [name, options])
    and the threads."""
    return {"kind": "onnx", "path": str(path), "provider": provider, "threads": threads}


def eager_probe(
    weights: str, config: dict[str, Any], threads: int, sdpa: bool = False, autocast: bool = False
) -> Probe:
    """How to rebuild an eager PyTorch variant: the weights file and config, the attention kernel."""
    return {"kind": "eager", "weights": str(weights), "config": config, "threads": threads, "sdpa": sdpa,
            "autocast": autocast}  # fmt: skip


def transformers_probe(folder: str, task: str | None, threads: int) -> Probe:
    """How to rebuild a ``transformers`` eager variant: the Hugging Face folder and the task."""
    return {"kind": "transformers", "folder": str(folder), "task": task, "threads": threads}


def status_mb(field: str, pid: int | str = "self") -> float | None:
    """A memory line of /proc/``pid``/status (``VmHWM``, ``VmRSS``) in MB, or None without /proc or
    once the process has gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return None


def peak_mb() -> float:
    """This process's peak resident set. VmHWM belongs to the process's own address space;
    ru_maxrss would also carry the high-water mark of the parent that spawned it (Linux keeps it
    across fork and exec), so it is only the fallback where /proc is missing."""
    peak = status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def resident_mb() -> float:
    """This process's resident set now (0 where /proc is missing)."""
    return status_mb("VmRSS") or 0.0


def measure_peak(probe: Probe, batch: int, seq: int, vocab_size: int, timeout: float = 600) -> dict[str, float]:
    """Peak resident memory (MB) of ``probe``'s variant running once at (batch, seq), alone."""
    spec = {**probe, "batch": batch, "seq": seq, "vocab_size": vocab_size}
    result = subprocess.run(
        [sys.executable, "-m", "edgeattn.benchmark.memory", json.dumps(spec)],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        raise RuntimeError(f"memory probe failed: {lines[-1] if lines else result.returncode}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def bench_inputs(vocab_size: int, batch: int, seq: int, seed: int = 0) -> tuple[Any, Any]:
    """The benchmark's inputs for one shape: random ids, and padding over the last quarter of
    every row after the first. The same for every variant and every process."""
    import numpy as np

    rng = np.random.default_rng([seed, batch, seq])
    ids = rng.integers(3, vocab_size, size=(batch, seq), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1:, seq - seq // 4 :] = 0
    return ids, mask


def use_sdpa(model: Any) -> Any:
    """``model`` with every attention module on PyTorch's scaled_dot_product_attention (in place)."""
    from edgeattn.attention import MultiHeadAttention, torch_sdpa_kernel

    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.kernel = torch_sdpa_kernel
    return model


def eager_runner(model: Any, autocast: bool = False) -> Callable[[Any, Any], object]:
    """``run(ids, mask)`` encoding on the CPU with eager PyTorch, in bf16 autocast if asked."""
    import torch

    def run(ids: Any, mask: Any) -> object:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return model.encode(torch.from_numpy(ids), torch.from_numpy(mask))

    return run


def build_variant(spec: dict[str, Any]) -> tuple[Callable[[Any, Any], object], float]:
    """The variant a probe describes, as ``run(ids, mask)``, and this process's peak memory (MB)
    after the imports it needed and before it was built."""
    if spec["kind"] == "onnx":
        from edgeattn.runtime.session import create_session
        from edgeattn.runtime.specs import encoder_feeds

        baseline = peak_mb()
        session = create_session(spec["path"], providers=[spec["provider"]], threads=spec["threads"], spinning="run")

        names = [i.name for i in session.get_inputs()]

        def run(ids: Any, mask: Any) -> object:
            return session.run(None, encoder_feeds(names, ids, mask))

        return run, baseline
    if spec["kind"] == "eager":
        import torch

        from edgeattn.config import ModelConfig
        from edgeattn.weights import load_model

        torch.set_num_threads(spec["threads"])
        baseline = peak_mb()
        model = load_model(spec["weights"], ModelConfig.from_dict(spec["config"])).eval()
        return eager_runner(use_sdpa(model) if spec["sdpa"] else model, spec["autocast"]), baseline
    if spec["kind"] == "transformers":
        import torch

        from edgeattn.benchmark.transformers_eager import load_transformers, transformers_answer

        torch.set_num_threads(spec["threads"])
        baseline = peak_mb()
        answer = transformers_answer(load_transformers(spec["folder"], spec["task"]), spec["task"])
        return answer, baseline
    raise ValueError(f"unknown probe kind {spec['kind']!r}")


def _run_probe(spec: dict[str, Any]) -> dict[str, float]:
    run, baseline = build_variant(spec)
    run(*bench_inputs(spec["vocab_size"], spec["batch"], spec["seq"]))
    peak = peak_mb()
    return {"baseline_mb": baseline, "peak_mb": peak, "added_mb": peak - baseline}


if __name__ == "__main__":
    print(json.dumps(_run_probe(json.loads(sys.argv[1]))))
