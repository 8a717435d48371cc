"""The accuracy gate: every reduced-precision graph against eager PyTorch float32 on held-out data.

Task-level metrics, per graph:
- attention, encoder, cross_kv: cosine similarity of the output vectors (mean and worst row;
  a row is one token's vector), and top-1 agreement of classification logits;
- decoder: next-token top-1 agreement under teacher forcing (the eager model's own greedy
  continuation as targets, the eager cross-attention keys/values as the source);
- generation: exact-match rate of greedy sequences through the reduced-precision encoder,
  cross_kv and decoder against the eager float32 model.
The thresholds per precision live in :data:`THRESHOLDS`, the one table the gate reads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from edgeattn.config import ModelConfig
from edgeattn.exporters.graphs import graph_module
from edgeattn.exporters.sampling import sample_inputs
from edgeattn.model import EncoderModel, Seq2SeqTransformer
from edgeattn.runtime.model import ExportedModel

log = logging.getLogger(__name__)

#: Minimum metric values per precision. A graph below any of them fails the gate.
THRESHOLDS: dict[str, dict[str, float]] = {
    "fp32-opt": {"cosine_mean": 0.99999, "cosine_min": 0.9999, "top1": 1.0, "teacher_top1": 0.999, "exact_match": 0.99},
    "int8": {"cosine_mean": 0.999, "cosine_min": 0.98, "top1": 0.95, "teacher_top1": 0.95, "exact_match": 0.90},
    "int8-static": {"cosine_mean": 0.995, "cosine_min": 0.95, "top1": 0.93, "teacher_top1": 0.93, "exact_match": 0.85},
    "fp16": {"cosine_mean": 0.9999, "cosine_min": 0.999, "top1": 0.99, "teacher_top1": 0.99, "exact_match": 0.95},
    "int4": {"cosine_mean": 0.99, "cosine_min": 0.90, "top1": 0.90, "teacher_top1": 0.85, "exact_match": 0.70},
}


@dataclass
class GateResult:
    """Metrics of one precision, per graph, and whether each met its threshold."""

    precision: str
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def check(self) -> None:
        """Compare every metric with the threshold table."""
        limits = THRESHOLDS[self.precision]
        self.failures = [
            f"{graph} {name} {value:.5f} < {limits[name]}"
            for graph, values in self.metrics.items()
            for name, value in values.items()
            if name in limits and value < limits[name]
        ]

    def to_dict(self) -> dict[str, Any]:
        return {"metrics": self.metrics, "thresholds": THRESHOLDS[self.precision], "passed": self.passed,
                "failures": self.failures}  # fmt: skip

    def table(self) -> str:
        limits = THRESHOLDS[self.precision]
        lines = [f"precision {self.precision}: " + ("ok" if self.passed else "FAILED")]
        for graph, values in self.metrics.items():
            cells = []
            for name, value in values.items():
                mark = "" if name not in limits or value >= limits[name] else " FAIL"
                limit = f" (>= {limits[name]})" if name in limits else ""
                cells.append(f"{name} {value:.5f}{limit}{mark}")
            lines.append(f"  {graph:<10} " + ", ".join(cells))
        return "\n".join(lines)


@dataclass
class HeldOut:
    """Held-out sources (B, S) with their mask, for the gate and for calibration."""

    ids: np.ndarray
    mask: np.ndarray


def heldout_sources(config: ModelConfig, n: int = 48, seed: int = 99, texts: list[list[int]] | None = None) -> HeldOut:
    """``texts`` (token id lists) padded into a batch, or ``n`` random sequences drawn from the
    model's vocabulary (specials excluded) with lengths spread over 1..min(max_len, 48)."""
    rng = np.random.default_rng(seed)
    if texts is None:
        low = min(3, config.vocab_size - 1)
        lengths = rng.integers(1, min(config.max_len, 48) + 1, size=n)
        texts = [rng.integers(low, config.vocab_size, size=int(k)).tolist() for k in lengths]
    width = max(len(t) for t in texts)
    ids = np.full((len(texts), width), config.pad_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, t in enumerate(texts):
        ids[i, : len(t)] = t
        mask[i, : len(t)] = 1
    return HeldOut(ids, mask)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.reshape(-1, a.shape[-1]).astype(np.float64)
    b = b.reshape(-1, b.shape[-1]).astype(np.float64)
    denom = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(denom, 1e-30)


def _cosine_metrics(got: np.ndarray, want: np.ndarray, rows: np.ndarray | None = None) -> dict[str, float]:
    cos = _cosines(got, want)
    if rows is not None:
        cos = cos[rows.reshape(-1)]
    cos = np.nan_to_num(cos, nan=-1.0)
    return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min())}


def evaluate(
    model: Seq2SeqTransformer | EncoderModel,
    runtime: ExportedModel,
    precision: str,
    heldout: HeldOut,
    new_tokens: int = 16,
    graphs: list[str] | None = None,
) -> GateResult:
    """Measure ``runtime`` (loaded at ``precision``) against eager float32 ``model``."""
    model = model.eval()
    result = GateResult(precision)
    graphs = graphs or runtime.graphs
    ids, mask = heldout.ids, heldout.mask
    t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)
    with torch.no_grad():
        hidden = model.encode(t_ids, t_mask)
    valid = mask.astype(bool)
    if "encoder" in graphs:
        out = runtime.run("encoder", {"input_ids": ids, "attention_mask": mask})
        metrics = _cosine_metrics(out["last_hidden_state"], hidden.numpy(), valid)
        if "logits" in out:
            with torch.no_grad():
                ref = model(t_ids, t_mask)[1].numpy()
            agree = out["logits"].argmax(-1) == ref.argmax(-1)
            metrics["top1"] = float(agree[valid].mean() if agree.ndim == 2 else agree.mean())
        result.metrics["encoder"] = metrics
    if "attention" in graphs:
        module, spec = graph_module("attention", model)
        rng = np.random.default_rng(5)
        feeds = sample_inputs(spec, model.config, {"batch": 4, "tgt_len": 24, "src_len": 31}, rng)
        with torch.no_grad():
            ref = module(*(torch.from_numpy(feeds[n]) for n in spec.input_names)).numpy()
        result.metrics["attention"] = _cosine_metrics(runtime.run("attention", feeds)["attention_output"], ref)
    if isinstance(model, Seq2SeqTransformer) and ({"decoder", "cross_kv"} & set(graphs)):
        _decoder_metrics(model, runtime, heldout, hidden, new_tokens, result, graphs)
    result.check()
    return result


@dataclass
class TeacherForced:
    """Decoder inputs under teacher forcing and eager PyTorch's answers to them."""

    feeds: dict[str, np.ndarray]  # the decoder graph's inputs: targets shifted right, empty cache, cross K/V
    cross: dict[str, np.ndarray]  # eager cross-attention keys/values by input name
    logits: np.ndarray  # eager float32 logits for ``feeds``


def teacher_forced(
    model: Seq2SeqTransformer, ids: np.ndarray, mask: np.ndarray, new_tokens: int, hidden: torch.Tensor | None = None
) -> TeacherForced:
    """The eager model's own greedy continuation of each source, fed back as decoder input."""
    from edgeattn.runtime.specs import cache_names

    c = model.config
    t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)
    with torch.no_grad():
        hidden = model.encode(t_ids, t_mask) if hidden is None else hidden
        cross = model.cross_kv(hidden)
        targets = model.greedy(t_ids, t_mask, new_tokens, stop_at_eos=False)
        dec_in = torch.cat([torch.full_like(targets[:, :1], c.bos_id), targets[:, :-1]], dim=1)
        logits, _ = model.decode(dec_in, cross_kv=cross, memory_mask=t_mask)
    names = cache_names("cross", c.n_decoder_layers)
    cross_np = {n: t.numpy() for n, t in zip(names, (t for kv in cross for t in kv), strict=True)}
    past = {n: np.zeros((ids.shape[0], c.n_heads, 0, c.head_dim), np.float32)
            for n in cache_names("past", c.n_decoder_layers)}  # fmt: skip
    feeds = {"input_ids": dec_in.numpy(), "encoder_attention_mask": mask, **past, **cross_np}
    return TeacherForced(feeds, cross_np, logits.numpy())


def _decoder_metrics(
    model: Seq2SeqTransformer, runtime: ExportedModel, heldout: HeldOut, hidden: torch.Tensor, new_tokens: int,
    result: GateResult, graphs: list[str],
) -> None:  # fmt: skip
    c = model.config
    ids, mask = heldout.ids, heldout.mask
    forced = teacher_forced(model, ids, mask, new_tokens, hidden)
    if "cross_kv" in graphs:
        got = runtime.run("cross_kv", {"encoder_hidden_states": hidden.numpy()})
        rows = np.repeat(mask.astype(bool)[:, None, :], c.n_heads, axis=1)
        worst = {"cosine_mean": 1.0, "cosine_min": 1.0}
        for name, ref in forced.cross.items():
            m = _cosine_metrics(got[name], ref, rows)
            worst = {k: min(worst[k], m[k]) for k in worst}
        result.metrics["cross_kv"] = worst
    if "decoder" not in graphs:
        return
    logits = runtime.run("decoder", forced.feeds)["logits"]
    ref = forced.logits
    agree = logits.argmax(-1) == ref.argmax(-1)
    metrics = {
        "teacher_top1": float(agree.mean()),
        **{f"logits_{k}": v for k, v in _cosine_metrics(logits, ref).items()},
    }
    result.metrics["decoder"] = metrics
    if {"encoder", "cross_kv"} <= set(graphs):
        eager = model.greedy(torch.from_numpy(ids), torch.from_numpy(mask), new_tokens).numpy()
        got_tokens = runtime.generate(ids, mask, new_tokens).tokens
        width = max(eager.shape[1], got_tokens.shape[1])
        eager = np.pad(eager, ((0, 0), (0, width - eager.shape[1])), constant_values=c.pad_id)
        got_tokens = np.pad(got_tokens, ((0, 0), (0, width - got_tokens.shape[1])), constant_values=c.pad_id)
        result.metrics["generation"] = {"exact_match": float((eager == got_tokens).all(axis=1).mean())}
