"""The causal family's web and Node.js bundle: what bundle.json says of it for the ES module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeattn.exporters.web import CHAT_TEMPLATE
from edgeattn.runtime.manifest import Manifest


def describe_causal(manifest: Manifest, folder: Path) -> dict[str, Any]:
    """A language model's bundle: its sizes and special ids, stop ids, cache feed names, prefill
    chunk and chat template."""
    from edgeattn.runtime.families.causal.runtime import CausalRuntime, causal_contract

    config = manifest.config
    c = config.section
    assert c is not None
    return {"task": "complete",
            "model": {"max_len": config.max_len, "pad_id": config.pad_id, "bos_id": config.bos_id,
                      "eos_id": config.eos_id, "vocab_size": config.vocab_size, "n_layers": c.n_layers,
                      "n_kv_heads": c.n_kv_heads, "dim": c.dim},
            "stop_ids": list(manifest.stop_ids or [config.eos_id]),
            "contract": causal_contract(c.n_layers),
            "prefill_chunk": CausalRuntime.prefill_chunk,
            "chat_template": CHAT_TEMPLATE if manifest.chat_template is not None else None}  # fmt: skip
