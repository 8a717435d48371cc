"""Whisper's log-mel features: edgeattn's numpy (``edgeattn.runtime.families.speech.log_mel``, no torch) against
transformers' ``WhisperFeatureExtractor`` (its torch path, and its numpy path), in one run, on a
30 s window and 10 minutes of long-form audio; each one's largest difference from transformers'.

Usage: ``python -m edgeattn.families.speech.log_mel_bench [--repeats 15] [--json benchmarks/results/log-mel.json]``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

#: the checkout this runs from (the tests' real texts and builders; benchmarks/results)
ROOT = Path(__file__).resolve().parents[3]


def timed(run: Any, repeats: int) -> dict[str, float]:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(1e3 * (time.perf_counter() - start))
    return {"median": float(np.median(times)), "p10": float(np.percentile(times, 10)), "min": float(min(times))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "log-mel.json")
    args = parser.parse_args()
    from transformers import WhisperFeatureExtractor

    from edgeattn.benchmark.machine import machine_info
    from edgeattn.runtime.families.speech.log_mel import LogMel

    rng = np.random.default_rng(0)
    t = np.arange(16_000 * 30) / 16_000
    window = (0.3 * np.sin(2 * np.pi * (150 + 200 * t) * t) + 0.02 * rng.standard_normal(t.size)).astype(np.float32)
    audio = {"30 s": window, "600 s": np.tile(window, 20)}
    ours, theirs = LogMel(), WhisperFeatureExtractor()
    rows = []
    for name, samples in audio.items():
        whole = name == "30 s"
        options: dict[str, Any] = {} if whole else {"truncation": False, "padding": "longest"}
        reference = theirs(samples, sampling_rate=16_000, return_tensors="np", **options).input_features[0]
        padded = np.pad(samples, (0, max(0, 480_000 - samples.size)))
        variants = {
            "transformers (torch STFT)": lambda s=samples, o=options: theirs(s, sampling_rate=16_000,
                                                                             return_tensors="np", **o),
            "transformers (numpy)": lambda p=padded: theirs._np_extract_fbank_features(p[None], "cpu"),
            "edgeattn (numpy, torch-free)": lambda s=samples, w=whole: ours(s, pad_to_window=w),
        }  # fmt: skip
        base = None
        for variant, run in variants.items():
            timing = timed(run, args.repeats if whole or "numpy)" not in variant else 3)
            base = base or timing["median"]
            out = run()
            out = np.asarray(out["input_features"] if "input_features" in getattr(out, "keys", dict)() else out)
            out = out[0] if out.ndim == 3 else out
            rows.append({"variant": variant, "batch": 1, "seq": name, "timing": timing,
                         "ratio": timing["median"] / base, "max_abs_vs_transformers": float(
                             np.abs(out[:, : reference.shape[1]] - reference).max())})  # fmt: skip
            print(f"{name:>6}  {variant:<30} {timing['median']:8.1f} ms  x{rows[-1]['ratio']:.2f}  "
                  f"max |diff| {rows[-1]['max_abs_vs_transformers']:.1e}")
    report = {"benchmark": "log-mel features", "date": time.strftime("%Y-%m-%d"), "machine": machine_info(),
              "rows": rows}  # fmt: skip
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
