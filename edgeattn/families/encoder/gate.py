"""The encoder family's calibration and gate hooks: what its graphs are calibrated on, and how the gate
measures them against eager float32."""

from __future__ import annotations

import numpy as np

from edgeattn.exporters.gate import Reference, cosine_metrics
from edgeattn.exporters.sampling import sample_inputs
from edgeattn.model import TransformerModel
from edgeattn.runtime.exported_model import ExportedModel
from edgeattn.runtime.specs import GraphSpec, encoder_feeds


def encoder_calibration(model: TransformerModel, spec: GraphSpec, ids: np.ndarray, mask: np.ndarray,
                        rng: np.random.Generator, new_tokens: int) -> dict[str, np.ndarray]:  # fmt: skip
    """The source itself."""
    return encoder_feeds(spec.input_names, ids, mask)

def attention_calibration(model: TransformerModel, spec: GraphSpec, ids: np.ndarray, mask: np.ndarray,
                          rng: np.random.Generator, new_tokens: int) -> dict[str, np.ndarray]:  # fmt: skip
    """Random hidden states as long as the source."""
    width = ids.shape[1]
    return sample_inputs(spec, model.config, {"batch": ids.shape[0], "tgt_len": width, "src_len": width}, rng)


def encoder_metrics(ref: Reference, runtime: ExportedModel, graph: str) -> dict[str, float]:
    """Hidden states' cosine to eager (real tokens), and the head's top-1 agreement."""
    out = runtime.run(graph, encoder_feeds(runtime.specs[graph].input_names, ref.ids, ref.mask))
    metrics = cosine_metrics(out["last_hidden_state"], ref.hidden.numpy(), ref.valid)
    if "logits" in out:
        agree = out["logits"].argmax(-1) == ref.logits.argmax(-1)
        metrics["top1"] = float(agree[ref.valid].mean() if agree.ndim == 2 else agree.mean())
    return metrics

def attention_metrics(ref: Reference, runtime: ExportedModel, graph: str) -> dict[str, float]:
    """The block's output cosine to eager on random hidden states."""
    feeds, want = ref.block(graph)
    return cosine_metrics(runtime.run(graph, feeds)["attention_output"], want)
