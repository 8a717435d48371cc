"""The seq2seq family's calibration and gate hooks for its cross keys and values and its decoder
steps (teacher-forced on the eager model's own continuation)."""

from __future__ import annotations

import numpy as np
import torch

from edgeattn.exporters.gate import Reference, _cosine_metrics, slot_feeds, teacher_forced
from edgeattn.model import TransformerModel
from edgeattn.runtime.exported_model import ExportedModel
from edgeattn.runtime.specs import POSITION, GraphSpec


def cross_kv_calibration(model: TransformerModel, spec: GraphSpec, ids: np.ndarray, mask: np.ndarray,
                         rng: np.random.Generator, new_tokens: int) -> dict[str, np.ndarray]:  # fmt: skip
    """The eager encoder's hidden states of the source."""
    with torch.no_grad():
        hidden = model.encode(torch.from_numpy(ids), torch.from_numpy(mask))
    return {"encoder_hidden_states": hidden.numpy()}

def decoder_calibration(model: TransformerModel, spec: GraphSpec, ids: np.ndarray, mask: np.ndarray,
                        rng: np.random.Generator, new_tokens: int) -> dict[str, np.ndarray]:  # fmt: skip
    """The eager model's own continuation under teacher forcing (in cache slots for a graph that
    takes them)."""
    forced = teacher_forced(model, ids, mask, new_tokens).feeds  # type: ignore[arg-type]
    return slot_feeds(forced, model.config) if POSITION in spec.input_names else forced


def cross_kv_metrics(ref: Reference, runtime: ExportedModel, graph: str) -> dict[str, float]:
    """The worst layer's cross keys' and values' cosine to eager (real source positions)."""
    c = ref.model.config
    got = runtime.run(graph, {"encoder_hidden_states": ref.hidden.numpy()})
    rows = np.repeat(ref.valid[:, None, :], c.n_heads, axis=1)
    worst = {"cosine_mean": 1.0, "cosine_min": 1.0}
    for name, want in ref.cross.items():
        m = _cosine_metrics(got[name], want, rows)
        worst = {k: min(worst[k], m[k]) for k in worst}
    return worst

def decoder_metrics(ref: Reference, runtime: ExportedModel, graph: str) -> dict[str, float]:
    """Next-token top-1 agreement under teacher forcing, and the logits' cosine to eager (in cache
    slots for a graph that takes them)."""
    want = ref.forced.logits
    feeds = ref.forced.feeds
    if POSITION in runtime.specs[graph].input_names:
        feeds = slot_feeds(feeds, ref.model.config)
    logits = runtime.run(graph, feeds)["logits"]
    agree = logits.argmax(-1) == want.argmax(-1)
    return {"teacher_top1": float(agree.mean()), **{f"logits_{k}": v for k, v in _cosine_metrics(logits, want).items()}}
