"""Mixture-of-experts decoding on the CPU provider: ONNX Runtime's MoE operator (fp32-opt) and its
QMoE (int4) against every expert's product over every token in standard operators (fp32), on one
random Qwen3-MoE-shaped model.

    python benchmarks/moe_layer.py [--d-model 1024 --experts 32 --top 4 --expert-width 512]
                                   [--prompt 128] [--steps 32] [--threads 2] [--json FILE]

Random weights, exported without verification (parity is the tests' job); the int4 file is written
as the gated export writes it, kept whatever its gate on drawn tokens says (random weights' figures
say nothing of quality). Prefill: the prompt in
one call; decode: a token a step over the prompt's cache. Medians of ``--repeats`` rounds.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from edgeattn.benchmark.machine import machine_info

log = logging.getLogger(__name__)


def build(args: argparse.Namespace):
    import torch

    from edgeattn.families.causal.model import CausalLM, CausalLMConfig

    config = CausalLMConfig(
        vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.d_model // 64, n_kv_heads=4,
        d_ff=4 * args.d_model, max_len=2048, qk_norm=True, n_experts=args.experts, experts_per_token=args.top,
        expert_d_ff=args.expert_width, norm_topk=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = CausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model


def timed(model, prompt: np.ndarray, steps: int, repeats: int) -> dict[str, float]:
    prefill, decode = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        state = model.state(prompt, np.ones_like(prompt), capacity=prompt.shape[1] + steps + 1)
        prefill.append(time.perf_counter() - start)
        token = np.array([[5]])
        start = time.perf_counter()
        for _ in range(steps):
            state.step(token)
        decode.append((time.perf_counter() - start) / steps)
    return {"prefill_tokens_per_s": prompt.shape[1] / statistics.median(prefill),
            "decode_tokens_per_s": 1.0 / statistics.median(decode)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top", type=int, default=4)
    parser.add_argument("--expert-width", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path("bench-results/moe-layer.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from edgeattn.exporters.export import export_model
    from edgeattn.exporters.precision_builds import PrecisionOptions
    from edgeattn.runtime import load

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "moe"
        log.info("exporting fp32 (expert products), fp32-opt (MoE) and int4 (QMoE)")
        options = PrecisionOptions(allow_degraded=True, sensitive_search=False)  # random weights: speed only
        export_model(build(args), out, precisions=["fp32-opt", "int4"], verify=False, precision_options=options)
        prompt = np.random.default_rng(0).integers(3, args.vocab, size=(1, args.prompt))
        forms = {"fp32": "every expert's product (standard operators)", "fp32-opt": "MoE operator",
                 "int4": "QMoE operator, 4-bit experts"}  # fmt: skip
        for precision, form in forms.items():
            model = load(out, precision=precision, threads=args.threads)
            timed(model, prompt[:, :8], 2, 1)  # warm-up
            rows[precision] = {"form": form, **timed(model, prompt, args.steps, args.repeats)}
    base = rows["fp32"]
    print(f"{'precision':<10} {'form':<45} {'prefill tok/s':>14} {'decode tok/s':>13} {'decode ×fp32':>13}")
    for precision, row in rows.items():
        row["decode_vs_expert_products"] = row["decode_tokens_per_s"] / base["decode_tokens_per_s"]
        row["prefill_vs_expert_products"] = row["prefill_tokens_per_s"] / base["prefill_tokens_per_s"]
        print(f"{precision:<10} {row['form']:<45} {row['prefill_tokens_per_s']:>14.1f} "
              f"{row['decode_tokens_per_s']:>13.1f} {row['decode_vs_expert_products']:>12.2f}x")  # fmt: skip
    result = {"benchmark": "moe-layer", "machine": machine_info(), "threads": args.threads,
              "shape": {k: getattr(args, k) for k in ("d_model", "layers", "experts", "top", "expert_width", "vocab")},
              "prompt": args.prompt, "steps": args.steps,
              "rows": [{"precision": p, **row} for p, row in rows.items()]}  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    log.info("wrote %s", args.json)


if __name__ == "__main__":
    main()
