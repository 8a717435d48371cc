"""An imported Hugging Face folder run through ``transformers`` itself and through edgeattn's eager
model on the same real-token inputs: a misread config stops the export instead of shipping a
different model.

Each importer names how its family is compared (:attr:`edgeattn.hf.Importer.reference`: the
outputs both sides give for the same token ids); this module loads the folder with the installed
``transformers`` (when there is one), tokenizes :data:`SAMPLE_TEXT` with the folder's own
tokenizer, and judges the largest difference against the reference's scale. A folder written by a
newer ``transformers`` generation than the one installed is not checked (4.x reads 5.x's
``rope_parameters`` as an unknown key and would itself build another model): the log says so.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from edgeattn.errors import ExportError


class Imported(Protocol):
    """What the check reads of an import (an :class:`~edgeattn.hf.Imported` or a model source)."""

    model: Any
    architecture: str | None
    folder: Path | None
    tokenizer: Any

log = logging.getLogger(__name__)

#: real text the check tokenizes (a folder without a tokenizer gets seeded ids from its vocabulary)
SAMPLE_TEXT = (
    "The river rose through the night, and by morning the old stone bridge stood alone in the water. "
    "Farmers came down from the hills to watch, counting the fields they would plant again in spring. "
    "An old teacher said a flood like it had last come forty years before."
)
TOKENS = 48
#: a difference over ``ATOL + RTOL · max |reference|`` is a different model
ATOL = 1e-4
RTOL = 1e-3

#: ``(edgeattn model, transformers model, ids (B, T), mask (B, T)) -> {output name: (ours, theirs)}``
ReferenceOutputs = Callable[[Any, Any, torch.Tensor, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]


@dataclass
class ReferenceCheck:
    """edgeattn's eager model against transformers on one folder."""

    transformers_version: str
    #: the output with the largest difference, that difference, where, and the reference's scale
    output: str
    max_abs: float
    where: tuple[int, ...]
    scale: float
    tokens: int

    @property
    def tolerance(self) -> float:
        return ATOL + RTOL * self.scale

    @property
    def passed(self) -> bool:
        return self.max_abs <= self.tolerance

    def line(self) -> str:
        verdict = "ok" if self.passed else "FAIL"
        return (f"against transformers {self.transformers_version} ({self.tokens} real tokens): {self.output} max abs "
                f"diff {self.max_abs:.2e} at {list(self.where)} (tolerance {self.tolerance:.2e} = {ATOL:g} + "
                f"{RTOL:g}·{self.scale:.3g}) {verdict}")  # fmt: skip


def _major(version: str) -> int:
    return _release(version)[0]


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string; (0, 0) where it does not start with a number."""
    parts = re.match(r"(\d+)(?:\.(\d+))?", version)
    return (int(parts[1]), int(parts[2] or 0)) if parts else (0, 0)


def sample_ids(hf: Imported, rows: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of shape (rows, T): the sample text's tokens, each row starting further into it."""
    config = hf.model.config
    length = min(TOKENS, config.max_len)
    if hf.tokenizer is not None:
        ids = hf.tokenizer.encode(SAMPLE_TEXT)
        stream = [i for i in ids if 0 <= i < config.vocab_size]
    else:
        stream = np.random.default_rng(0).integers(3, config.vocab_size, 2 * length).tolist()
    while len(stream) < length + rows:
        stream = stream + stream
    batch = torch.tensor([stream[r : r + length] for r in range(rows)], dtype=torch.int64)
    return batch, torch.ones_like(batch)


def check_against_transformers(hf: Imported) -> ReferenceCheck | None:
    """The imported model against ``transformers``' own reading of the same folder, or None when
    ``transformers`` is absent or older than the folder's generation (logged)."""
    from edgeattn.hf import IMPORTERS

    try:
        import transformers
    except ImportError:
        log.info("transformers is not installed: %s is not checked against it", hf.folder)
        return None
    written = str(json.loads((Path(hf.folder) / "config.json").read_text(encoding="utf-8")).get(
        "transformers_version", "0"))  # fmt: skip
    if _major(written) > _major(transformers.__version__):
        log.warning("%s was written by transformers %s, which transformers %s cannot read as it was meant "
                    "(install transformers %d to check the import against it)", hf.folder, written,
                    transformers.__version__, _major(written))  # fmt: skip
        return None
    importer = IMPORTERS[hf.architecture]
    # transformers 4.56 renamed torch_dtype dtype (the old name warns that it is deprecated)
    dtype_key = "dtype" if _release(transformers.__version__) >= (4, 56) else "torch_dtype"
    # eager attention, transformers' own reference (its sdpa path leaves Gemma 2's soft-capping out)
    reference = getattr(transformers, hf.architecture).from_pretrained(
        str(hf.folder), attn_implementation="eager", **{dtype_key: torch.float32})
    reference.eval()
    ids, mask = sample_ids(hf)
    with torch.no_grad():
        outputs = importer.reference(hf.model.eval(), reference, ids, mask)
    worst: ReferenceCheck | None = None
    for name, (ours, theirs) in outputs.items():
        if ours.shape != theirs.shape:
            raise ExportError(f"{hf.folder}: edgeattn's {name} is {tuple(ours.shape)}, transformers' "
                              f"{tuple(theirs.shape)}: the config was read into another model")  # fmt: skip
        diff = (ours.double() - theirs.double()).abs()
        at = tuple(int(i) for i in np.unravel_index(int(diff.argmax()), diff.shape))
        check = ReferenceCheck(transformers.__version__, name, float(diff.max()), at,
                               float(theirs.abs().max()), int(mask.sum()))  # fmt: skip
        if worst is None or check.max_abs / check.tolerance > worst.max_abs / worst.tolerance:
            worst = check
    del reference
    return worst


def require_transformers_agreement(hf: Imported) -> ReferenceCheck | None:
    """:func:`check_against_transformers`, raising an ExportError that names the largest
    difference when the two models disagree."""
    check = check_against_transformers(hf)
    if check is not None:
        log.info("%s", check.line())
        if not check.passed:
            raise ExportError(f"{hf.folder}: edgeattn's model disagrees with transformers' reading of the folder, "
                              f"so its config.json was misread; {check.line()}")  # fmt: skip
    return check
