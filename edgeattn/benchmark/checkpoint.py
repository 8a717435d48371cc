"""Peers on the very checkpoint an export was imported from (``--from-hf``): ``transformers``
eager float32, which is also every variant's accuracy reference, and Hugging Face Optimum's own
pipeline on the same folder (``main_export``, ``ORTOptimizer`` at O2, ``ORTQuantizer`` dynamic int8
with the configuration for this CPU). Needs the ``peers`` extra (transformers, optimum-onnx).

Optimum's quantiser runs on its unoptimised export: on its O2 graph it stops with "Unable to find
data type for weight_name" (ONNX Runtime 1.32), and quantising the raw export is what its own
documentation does.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeattn.benchmark.latency import EAGER_SETTLE_S, Answer, Variant, onnx_answer
from edgeattn.benchmark.memory import onnx_probe, transformers_probe
from edgeattn.benchmark.transformers_eager import load_transformers, transformers_answer
from edgeattn.host import has_vnni, quiet_quantization
from edgeattn.runtime.session import CPU, create_session

log = logging.getLogger(__name__)

#: edgeattn task -> Optimum's export task
OPTIMUM_TASKS = {"classify": "text-classification", "tag": "token-classification", "encode": "feature-extraction",
                 "embed": "feature-extraction"}  # fmt: skip


@dataclass
class CheckpointPeers:
    """The peers' variants, those that could not be built (with why), and the accuracy reference."""

    variants: list[Variant] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    #: transformers eager's task output, the reference every variant's accuracy is measured against
    reference: Answer | None = None


def checkpoint_peers(folder: str | Path, task: str | None, threads: int, scratch: Path,
                     optimum: bool = True) -> CheckpointPeers:  # fmt: skip
    """transformers eager float32 on ``folder`` and, with ``optimum``, Optimum's fp32, O2 and int8
    exports of it, each an ONNX Runtime CPU session spinning only while a run lasts."""
    peers = CheckpointPeers()
    folder = Path(folder)
    try:
        import torch

        torch.set_num_threads(threads)
        model = load_transformers(folder, task)
    except ImportError:
        peers.skipped["peer transformers"] = "transformers is not installed (pip install 'edgeattn[peers]')"
        return peers
    answer = transformers_answer(model, task)
    peers.reference = answer
    peers.variants.append(
        Variant("peer transformers eager fp32", answer, note="the accuracy reference",
                probe=transformers_probe(str(folder), task, threads), answer=answer, settle_s=EAGER_SETTLE_S)
    )  # fmt: skip
    if not optimum:
        return peers
    try:
        files, failed = optimum_files(folder, task, scratch / "optimum")
    except ImportError:
        peers.skipped["peer Optimum"] = "optimum-onnx is not installed (pip install 'edgeattn[peers]')"
        return peers
    peers.skipped.update(failed)
    for name, (path, note) in files.items():
        start = time.perf_counter()
        session = create_session(path, providers=[CPU], threads=threads, spinning="run")
        run = onnx_answer(session)
        run(np.ones((1, 8), np.int64), np.ones((1, 8), np.int64))
        cold = (time.perf_counter() - start) * 1e3
        peers.variants.append(Variant(name, run, cold, path.stat().st_size, note,
                                      probe=onnx_probe(str(path), CPU, threads), answer=run))  # fmt: skip
    return peers


def optimum_files(folder: Path, task: str | None, out: Path) -> tuple[dict[str, tuple[Path, str]], dict[str, str]]:
    """Optimum's files for ``folder``: variant name -> (ONNX file, note), and the variants it could
    not make -> why."""
    from optimum.exporters.onnx import main_export
    from optimum.onnxruntime import ORTOptimizer, ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig, OptimizationConfig

    raw, o2, int8 = out / "exported", out / "o2", out / "dynamic-int8"
    files: dict[str, tuple[Path, str]] = {}
    failed: dict[str, str] = {}
    start = time.perf_counter()
    with warnings.catch_warnings(), quiet_quantization():
        warnings.simplefilter("ignore")
        main_export(str(folder), output=str(raw), task=OPTIMUM_TASKS.get(task or "", "feature-extraction"),
                    library_name="transformers", do_validation=False)  # fmt: skip
        log.info("Optimum exported %s in %.1f s", folder, time.perf_counter() - start)
        files["peer Optimum fp32"] = (raw / "model.onnx", "optimum main_export")
        try:
            ORTOptimizer.from_pretrained(str(raw), file_names=["model.onnx"]).optimize(
                OptimizationConfig(optimization_level=2), save_dir=str(o2)
            )
            files["peer Optimum fp32 O2"] = (o2 / "model_optimized.onnx", "ORTOptimizer optimization_level=2")
        except Exception as exc:  # noqa: BLE001 - reported beside the table
            failed["peer Optimum fp32 O2"] = f"ORTOptimizer failed: {exc}"
        vnni = has_vnni()
        config = (AutoQuantizationConfig.avx512_vnni if vnni else AutoQuantizationConfig.avx2)(is_static=False)
        try:
            ORTQuantizer.from_pretrained(str(raw), file_name="model.onnx").quantize(config, save_dir=str(int8))
            note = f"ORTQuantizer dynamic, AutoQuantizationConfig.{'avx512_vnni' if vnni else 'avx2'}"
            files["peer Optimum int8"] = (int8 / "model_quantized.onnx", note)
        except Exception as exc:  # noqa: BLE001 - reported beside the table
            failed["peer Optimum int8"] = f"ORTQuantizer failed: {exc}"
    return files, failed


@dataclass
class Agreement:
    """One variant's task output against the reference's on the same padded batch."""

    max_abs: float
    cosine_min: float
    top1: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return {"max_abs": self.max_abs, "cosine_min": self.cosine_min, "top1": self.top1}


def agreement(got: np.ndarray, want: np.ndarray, mask: np.ndarray, classes: bool) -> Agreement:
    """``got`` against ``want`` over real tokens (token-level outputs) or rows (sequence-level):
    largest absolute difference, worst cosine of a row's vector, and the share of equal argmaxes
    when the output is classification logits."""
    if got.ndim == 3:  # (B, S, N): real tokens only
        valid = mask.astype(bool)
        got, want = got[valid], want[valid]
    got, want = got.astype(np.float64), want.astype(np.float64)
    denom = np.maximum(np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1), 1e-30)
    cosine = (got * want).sum(-1) / denom
    top1 = float((got.argmax(-1) == want.argmax(-1)).mean()) if classes else None
    return Agreement(float(np.abs(got - want).max()), float(np.nan_to_num(cosine, nan=-1.0).min()), top1)


def accuracy_inputs(vocab_size: int, pad_id: int, batch: int = 8, seq: int = 128, seed: int = 3) -> tuple:
    """A padded batch of random ids of lengths spread over 1..``seq`` (the first row full), the
    padding filled with ``pad_id`` as a tokenizer pads."""
    rng = np.random.default_rng(seed)
    lengths = np.linspace(seq, max(1, seq // 8), batch).astype(int)
    ids = rng.integers(3, vocab_size, size=(batch, seq), dtype=np.int64)
    ids[ids == pad_id] = pad_id + 1 if pad_id + 1 < vocab_size else pad_id - 1
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    ids[mask == 0] = pad_id
    return ids, mask


def measure_accuracy(variants: list[Variant], reference: Answer, output: str, ids: np.ndarray,
                     mask: np.ndarray) -> tuple[dict[str, dict[str, float | None]], dict[str, str]]:  # fmt: skip
    """Every variant that can answer, against ``reference`` on ``output``: figures per variant,
    and the variants that could not (with why)."""
    want = reference(ids, mask)[output]
    figures: dict[str, dict[str, float | None]] = {}
    errors: dict[str, str] = {}
    for v in variants:
        if v.answer is None:
            continue
        try:
            got = v.answer(ids, mask)
        except Exception as exc:  # noqa: BLE001 - reported beside the table
            errors[v.name] = f"cannot answer: {exc}"
            continue
        if output not in got:
            errors[v.name] = f"has no {output} output"
            continue
        figures[v.name] = agreement(got[output], want, mask, classes=output == "logits").to_dict()
    return figures, errors
