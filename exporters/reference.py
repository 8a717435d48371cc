"""Eager PyTorch decoding through the runtime's search code, as the reference the exported graphs
must match token for token (greedy, beam search, sampling)."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.model import TransformerModel
from edgeattn.runtime.families import family_of, resolve
from edgeattn.runtime.generate import GenerationConfig, GenerationOutput, generate


def eager_generate(
    model: TransformerModel,
    ids: np.ndarray,
    mask: np.ndarray,
    max_new_tokens: int = 32,
    strategy: str = "greedy",
    eos_id: int | None = None,
    **options: Any,
) -> GenerationOutput:
    """What the family runtime's ``generate`` does, with the family's eager stepper (eager PyTorch)
    in place of the graphs."""
    c = model.config
    family = family_of(c)
    if family.stepper is None:
        raise EdgeattnError(f"a {family.name} model does not generate")
    stepper = resolve(family.stepper)
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, strategy=strategy, **options)  # type: ignore[arg-type]
    eos = c.eos_id if eos_id is None else eos_id
    return generate(lambda n: stepper(model, ids, mask, n, capacity=cfg.max_new_tokens), ids.shape[0], c.bos_id, eos,
                    c.pad_id, cfg)
