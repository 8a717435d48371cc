"""A speech export's greedy decode against eager PyTorch (the verifier's last check)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from edgeattn.families.speech.model import WhisperModel


def greedy_check(model: WhisperModel, runtime: Any, rng: np.random.Generator, tokens: int) -> Any:
    """Greedy decoding of ``tokens`` steps (no end token, no rules) after the start token over three
    windows of random features, eager and exported: a mismatch names its rows."""
    from edgeattn.exporters.verify import GreedyResult

    c = model.config
    assert c.section is not None
    tokens = min(tokens, c.max_len - 1)
    features = rng.standard_normal((3, c.section.n_mels, c.section.frames)).astype(np.float32)
    prompts = [[c.bos_id]] * 3
    eager = model.greedy(torch.from_numpy(features), prompts, tokens)
    exported = runtime.decode(features, prompts, tokens, eos=-1)
    bad = [i for i in range(3) if eager[i] != exported[i]]
    return GreedyResult(rows=3, tokens=tokens, mismatched_rows=bad)
