"""Seq2seq generation beside its peers on one Hugging Face checkpoint: ``transformers`` eager with its
cache, Hugging Face Optimum's ``ORTModelForSeq2SeqLM`` (fp32 and dynamic int8 from its own
quantiser, ONNX Runtime's threads told not to spin since torch shares the cores; and fp32 with ONNX
Runtime's default, spinning threads, as Optimum runs it unless told otherwise) and edgeattn's runtime
(fp32, its fused float32 fp32-opt, and int8), each variant in its own process, interleaved pass by
pass, greedy, every row made to run all ``new_tokens`` steps.
Reports tokens per second, resident memory after loading and at peak, and each variant's files
on disk. Needs the ``peers`` extra (transformers, optimum-onnx).

    python -m edgeattn.families.seq2seq.peers [--folder DIR] [--batch 1,8] [--passes 3] [--runs 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.benchmark.machine import machine_info
from edgeattn.benchmark.memory import peak_mb, resident_mb
from edgeattn.benchmark.report import publish
from edgeattn.runtime.precisions import FP32

log = logging.getLogger(__name__)

#: Every variant, in the order they run within a pass.
VARIANTS = ("transformers", "optimum-fp32", "optimum-fp32-spinning", "optimum-int8", "edgeattn-fp32",
            "edgeattn-fp32-opt", "edgeattn-int8")  # fmt: skip
#: The variant the others are measured against.
BASELINE = "transformers"


def _source(batch: int, src_len: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, min(vocab, 32000), size=(batch, src_len), dtype=np.int64)
    ids[:, -1] = 1  # T5 sources end with EOS
    return ids, np.ones_like(ids)


def _generator(variant: str, path: Path, threads: int) -> Any:
    """A function (ids, mask, new_tokens) -> generated tokens for ``variant`` loaded from ``path``."""
    if variant.startswith("edgeattn"):
        from edgeattn.runtime import load
        from edgeattn.runtime.session import CPU

        rt = load(path, providers=[CPU], threads=threads, precision=variant.split("-", 1)[1], spinning="run")
        return lambda ids, mask, n: rt.generate(ids, mask, n, eos_id=-1).tokens
    import torch

    torch.set_num_threads(threads)
    if variant == "transformers":
        from transformers import AutoModelForSeq2SeqLM

        model = AutoModelForSeq2SeqLM.from_pretrained(path).eval()
    else:
        import onnxruntime as ort
        from optimum.onnxruntime import ORTModelForSeq2SeqLM

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        if not variant.endswith("-spinning"):  # ONNX Runtime's default is to spin; torch shares the cores
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        model = ORTModelForSeq2SeqLM.from_pretrained(path, provider="CPUExecutionProvider", session_options=options)

    def generate(ids: np.ndarray, mask: np.ndarray, n: int) -> np.ndarray:
        with torch.inference_mode():
            out = model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=n,
                                 min_new_tokens=n, do_sample=False, num_beams=1)  # fmt: skip
        return out[:, 1:].numpy()

    return generate


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Load one variant, generate once untimed, then ``runs`` timed times: tokens/s of each run,
    resident memory after loading and the peak, and the first run's tokens."""
    start = time.perf_counter()
    generate = _generator(spec["variant"], Path(spec["path"]), spec["threads"])
    loaded_s = time.perf_counter() - start
    resident = resident_mb()
    ids, mask = _source(spec["batch"], spec["src_len"], spec["vocab"])
    tokens = generate(ids, mask, spec["new_tokens"])
    rates = []
    for _ in range(spec["runs"]):
        start = time.perf_counter()
        generate(ids, mask, spec["new_tokens"])
        rates.append(spec["batch"] * spec["new_tokens"] / (time.perf_counter() - start))
    return {"tokens_per_s": rates, "resident_mb": resident, "peak_mb": peak_mb(), "load_s": loaded_s,
            "tokens": np.asarray(tokens).tolist()}  # fmt: skip


@dataclass
class Seq2SeqRow:
    """One variant at one batch size, pooled over the passes."""

    variant: str
    batch: int
    tokens_per_s: float
    ratio: float
    resident_mb: float
    peak_mb: float
    agreement: float  # fraction of generated tokens equal to transformers' (greedy)
    #: each pass's median tokens/s, in pass order: two variants' ratio pass by pass cancels the
    #: machine's drift between passes, which the pooled medians above carry
    pass_rates: list[float] = field(default_factory=list)


@dataclass
class Seq2SeqBench:
    folder: str
    src_len: int
    new_tokens: int
    threads: int
    passes: int
    rows: list[Seq2SeqRow] = field(default_factory=list)
    disk_mb: dict[str, float] = field(default_factory=dict)
    checkpoint_mb: float = 0.0
    skipped: dict[str, str] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        w = max([len("variant")] + [len(r.variant) for r in self.rows])
        lines = [
            f"seq2seq generation, greedy, source {self.src_len}, {self.new_tokens} new tokens, {self.threads} threads, "
            f"each variant in its own process, {self.passes} interleaved passes",
            f"{'variant':<{w}} {'batch':>5} {'tok/s':>8} {'vs transformers':>15} {'resident MB':>11} {'peak MB':>8} "
            f"{'same tokens':>11}",
        ]
        for r in self.rows:
            lines.append(f"{r.variant:<{w}} {r.batch:>5} {r.tokens_per_s:>8.1f} {r.ratio:>14.2f}x "
                         f"{r.resident_mb:>11.0f} {r.peak_mb:>8.0f} {r.agreement:>11.3f}")  # fmt: skip
        lines.append(f"checkpoint {self.checkpoint_mb:.0f} MB; on disk: "
                     + ", ".join(f"{k} {v:.0f} MB" for k, v in self.disk_mb.items()))  # fmt: skip
        for name, why in self.skipped.items():
            lines.append(f"skipped {name}: {why}")
        return "\n".join(lines)


def _mb(path: Path, pattern: str = "*") -> float:
    return sum(f.stat().st_size for f in path.glob(pattern) if f.is_file()) / 1e6


def prepare(folder: Path, work: Path, variants: tuple[str, ...]) -> tuple[dict[str, Path], dict[str, str]]:
    """Each variant's files: the folder itself, Optimum's exports (fp32, and int8 by its quantiser
    with this CPU's configuration) and edgeattn's export (fp32 and int8 through the gate)."""
    paths: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    if "transformers" in variants:
        paths["transformers"] = folder
    if {"optimum-fp32", "optimum-fp32-spinning", "optimum-int8"} & set(variants):
        try:
            paths.update(_optimum(folder, work, "optimum-int8" in variants))
        except Exception as exc:  # a peer that cannot be built is reported, not fatal
            skipped["optimum"] = f"{type(exc).__name__}: {exc}"
    ours = [v for v in variants if v.startswith("edgeattn")]
    if ours:
        from edgeattn.exporters.export import export_model
        from edgeattn.exporters.precision_builds import PrecisionOptions
        from edgeattn.runtime.manifest import read_manifest
        from edgeattn.sources import resolve_model

        out = work / "edgeattn"
        reduced = [v.split("-", 1)[1] for v in ours if v != "edgeattn-fp32"]
        made = out / "manifest.json"
        if made.is_file() and not set(reduced) <= set(_precisions_of(read_manifest(out))):
            shutil.rmtree(out)  # an earlier run's export without a precision asked for now
        if not (out / "manifest.json").is_file():
            source = resolve_model(from_hf=folder)
            export_model(source.model, out, precisions=reduced or None,
                         precision_options=PrecisionOptions(allow_degraded=True, sensitive_search=False),
                         **source.export_fields())  # fmt: skip
        paths.update({v: out for v in variants if v.startswith("edgeattn")})
    return {v: p for v, p in paths.items() if v in variants}, skipped


def _optimum(folder: Path, work: Path, int8: bool) -> dict[str, Path]:
    from optimum.exporters.onnx import main_export

    from edgeattn.host import has_vnni, quiet_quantization

    fp32 = work / "optimum-fp32"
    if not (fp32 / "encoder_model.onnx").is_file():
        main_export(str(folder), output=str(fp32), task="text2text-generation-with-past", device="cpu")
    paths = {"optimum-fp32": fp32, "optimum-fp32-spinning": fp32}
    if int8:
        from optimum.onnxruntime import ORTQuantizer
        from optimum.onnxruntime.configuration import AutoQuantizationConfig

        q8 = work / "optimum-int8"
        if not (q8 / "encoder_model.onnx").is_file():
            q8.mkdir(parents=True, exist_ok=True)
            config = (AutoQuantizationConfig.avx512_vnni if has_vnni() else AutoQuantizationConfig.avx2)(
                is_static=False, per_channel=True
            )
            for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
                with quiet_quantization():
                    ORTQuantizer.from_pretrained(fp32, file_name=name).quantize(config, save_dir=work / "q8-tmp")
                shutil.move(work / "q8-tmp" / name.replace(".onnx", "_quantized.onnx"), q8 / name)
            for f in fp32.iterdir():
                if f.suffix != ".onnx" and f.is_file() and not (q8 / f.name).exists():
                    shutil.copy(f, q8 / f.name)
            shutil.rmtree(work / "q8-tmp", ignore_errors=True)
        paths["optimum-int8"] = q8
    return paths


def _disk(variant: str, path: Path) -> float:
    """What a variant's files weigh: edgeattn fp32 is its graphs and the checkpoint they keep their
    weights in; int8 its own graphs and what they read from shared files (each region once: the
    int8 weights they hold alike, the few float32 tensors in the checkpoint)."""
    if variant.startswith("edgeattn"):
        from edgeattn.runtime.families import get_family
        from edgeattn.runtime.manifest import read_manifest
        from edgeattn.runtime.safety import graph_bytes

        manifest = read_manifest(path)
        precision = variant.split("-", 1)[1]
        runs = get_family(manifest.family_name).generation_path(manifest.graphs)  # what generation reads
        graphs = [path / manifest.entry(g, precision).file for g in runs]
        if precision == FP32:
            return (sum(g.stat().st_size for g in graphs) + (path / "weights.safetensors").stat().st_size) / 1e6
        return graph_bytes(*graphs) / 1e6
    if variant == "transformers":
        return _mb(path, "*.safetensors")
    return _mb(path, "*.onnx*")


def bench_seq2seq(
    folder: str | Path, work: str | Path, batches: tuple[int, ...] = (1, 8), src_len: int = 128,
    new_tokens: int = 64, threads: int = 2, passes: int = 3, runs: int = 1, variants: tuple[str, ...] = VARIANTS,
    timeout: float = 1200,
) -> Seq2SeqBench:  # fmt: skip
    """Run the benchmark; see the module docstring."""
    folder, work = Path(folder), Path(work)
    work.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    paths, skipped = prepare(folder, work, variants)
    result = Seq2SeqBench(str(folder), src_len, new_tokens, threads, passes, skipped=skipped, machine=machine_info())
    result.checkpoint_mb = _mb(folder, "*.safetensors")
    result.disk_mb = {v: _disk(v, p) for v, p in paths.items()}
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for _ in range(passes):
        for batch in batches:
            for variant, path in paths.items():
                spec = {"variant": variant, "path": str(path), "batch": batch, "src_len": src_len,
                        "new_tokens": new_tokens, "threads": threads, "runs": runs, "vocab": vocab}  # fmt: skip
                done = subprocess.run([sys.executable, "-m", "edgeattn.families.seq2seq.peer_worker", json.dumps(spec)],
                                      capture_output=True, text=True, timeout=timeout)  # fmt: skip
                if done.returncode != 0:
                    result.skipped[variant] = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
                    continue
                samples.setdefault((variant, batch), []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    for batch in batches:
        base = samples.get((BASELINE, batch))
        base_rate = float(np.median([r for s in base for r in s["tokens_per_s"]])) if base else float("nan")
        reference = np.asarray(base[0]["tokens"]) if base else None
        for variant in paths:
            got = samples.get((variant, batch))
            if not got:
                continue
            rate = float(np.median([r for s in got for r in s["tokens_per_s"]]))
            tokens = np.asarray(got[0]["tokens"])
            agree = float((tokens == reference).mean()) if reference is not None and tokens.shape == reference.shape \
                else float("nan")  # fmt: skip
            result.rows.append(Seq2SeqRow(variant, batch, rate, rate / base_rate,
                                          float(np.median([s["resident_mb"] for s in got])),
                                          float(np.median([s["peak_mb"] for s in got])), agree,
                                          [float(np.median(s["tokens_per_s"])) for s in got]))  # fmt: skip
    return result


def _precisions_of(manifest: Any) -> list[str]:
    """The precisions every graph of an export holds besides fp32."""
    held = [set(entry.precisions) for entry in manifest.graphs.values()]
    return sorted(set.intersection(*held)) if held else []


#: t5-small's sizes (60M parameters, 242 MB of float32 weights)
T5_SMALL = {"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_heads": 8,
            "feed_forward_proj": "relu", "tie_word_embeddings": True}  # fmt: skip


def t5_small_folder(path: Path, seed: int = 0) -> Path:
    """A random t5-small-shaped T5 saved as ``save_pretrained`` writes it."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(**T5_SMALL, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, dropout_rate=0.0)
    T5ForConditionalGeneration(config).eval().save_pretrained(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description="Seq2seq generation beside its peers on a T5 folder (default: a "
                                     "random t5-small-shaped one), each variant in its own process.")
    parser.add_argument("--folder", type=Path, help="a local T5 folder (default: a random t5-small-shaped one)")
    parser.add_argument("--work", type=Path, help="where the exports go (default: a temporary directory)")
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--src-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3, help="timed generations per process (after one untimed)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/t5-small-generation.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        folder = args.folder or t5_small_folder(work / "t5-small-random")
        result = bench_seq2seq(folder, work, tuple(int(b) for b in args.batch.split(",")), args.src_len,
                               args.new_tokens, args.threads, args.passes, args.runs,
                               variants=tuple(args.variants.split(",")))  # fmt: skip
    publish(result, args.out)


if __name__ == "__main__":
    main()
