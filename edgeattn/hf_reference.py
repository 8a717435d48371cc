"""An imported Hugging Face folder run through ``transformers`` itself and through edgeattn's eager
model on the same real-token inputs: a misread config stops the export instead of shipping a
different model.

Each importer names how its family is compared (:attr:`edgeattn.hf.Importer.reference`: the
outputs both sides give for the same token ids); this module loads the folder with the installed
``transformers`` (when there is one), tokenizes :data:`SAMPLE_TEXT` with the folder's own
tokenizer, and judges the largest difference against the reference's scale. A folder written by a
newer ``transformers`` generation than the one installed (4.x reads 5.x's ``rope_parameters`` as
an unknown key and would itself build another model) is checked by another Python that has it
(:class:`RemoteReference`), or the export stops and says what to install; only ``--no-check``
leaves the check out, and the manifest records that.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
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
        low = min(3, config.vocab_size - 1)  # past the special ids, where the vocabulary has room
        stream = np.random.default_rng(0).integers(low, config.vocab_size, 2 * length).tolist()
    while len(stream) < length + rows:
        stream = stream + stream
    batch = torch.tensor([stream[r : r + length] for r in range(rows)], dtype=torch.int64)
    return batch, torch.ones_like(batch)


#: a model whose float32 weights are larger than this is checked against transformers' model
#: offloaded to disk a layer at a time (:func:`edgeattn.hf_reference_worker.load_reference`)
OFFLOAD_ABOVE = 2 << 30
#: what such a model keeps in memory
OFFLOAD_MEMORY = 1 << 30

#: the environment variable naming a Python whose transformers reads the folders the installed one cannot
PYTHON_ENV = "EDGEATTN_TRANSFORMERS_PYTHON"
WORKER = Path(__file__).with_name("hf_reference_worker.py")


class RemoteReference:
    """transformers' model of a folder, run by another Python (:mod:`edgeattn.hf_reference_worker`)
    and called like the model itself: keyword tensors in, an object of its output tensors back."""

    def __init__(self, python: str, folder: Path, architecture: str, memory: int | None = None) -> None:
        self._log = tempfile.TemporaryFile()
        command = [python, str(WORKER), str(folder), architecture, *([str(memory)] if memory is not None else [])]
        try:
            self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        except OSError as exc:
            raise ExportError(f"the import check could not start {python}: {exc}") from exc
        hello = self._answer(f"{python} could not load {folder} with transformers")
        if "error" in hello:
            self.close()
            raise ExportError(f"{python} could not load {folder} with transformers: {hello['error']}")
        self.version = str(hello["transformers"])
        self.offloaded = int(hello.get("offloaded", 0))

    def _answer(self, failing: str) -> dict[str, Any]:
        assert self._process.stdout is not None
        try:
            return pickle.load(self._process.stdout)
        except (EOFError, pickle.UnpicklingError) as exc:
            self._process.wait(timeout=60)
            self._log.seek(0)
            tail = self._log.read().decode("utf-8", "replace").strip().splitlines()[-5:]
            raise ExportError(f"{failing}: it ended (exit {self._process.returncode}): " + " / ".join(tail)) from exc

    def __call__(self, **kwargs: Any) -> SimpleNamespace:
        assert self._process.stdin is not None
        feeds = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        pickle.dump(feeds, self._process.stdin)
        self._process.stdin.flush()
        out = self._answer("transformers' model failed in the import check")
        return SimpleNamespace(**{k: tuple(map(torch.from_numpy, v)) if isinstance(v, tuple) else torch.from_numpy(v)
                                  for k, v in out.items()})  # fmt: skip

    def close(self) -> None:
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
        self._log.close()


def _installed_transformers() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    return str(transformers.__version__)


def check_against_transformers(hf: Imported, python: str | None = None) -> ReferenceCheck:
    """The imported model against ``transformers``' own reading of the same folder: by ``python``
    where one is named, else by the installed transformers where it is of the folder's generation
    or newer, else by :data:`PYTHON_ENV`'s Python; an ExportError says what to install or name when
    none can."""
    from edgeattn.hf import IMPORTERS

    written = str(json.loads((Path(hf.folder) / "config.json").read_text(encoding="utf-8")).get(
        "transformers_version", "0"))  # fmt: skip
    installed = _installed_transformers()
    if python is None and (installed is None or _major(written) > _major(installed)):
        python = os.environ.get(PYTHON_ENV) or None
    if python is None and (installed is None or _major(written) > _major(installed)):
        have = "no transformers is installed" if installed is None else f"transformers {installed} is installed"
        raise ExportError(f"{hf.folder} was written by transformers {written} and {have}, which cannot read it as it "
                          f"was meant, so the import cannot be checked: install transformers {_major(written)}, or "
                          f"name a Python that has it with --check-python (or {PYTHON_ENV}), or leave the check "
                          f"out with --no-check (the manifest records that)")  # fmt: skip
    importer = IMPORTERS[hf.architecture]
    memory = OFFLOAD_MEMORY if sum(p.numel() for p in hf.model.parameters()) * 4 > OFFLOAD_ABOVE else None
    scratch = None
    if python is not None:
        reference: Any = RemoteReference(python, Path(hf.folder), str(hf.architecture), memory)
        version, offloaded = reference.version, reference.offloaded
    else:
        import transformers

        from edgeattn.hf_reference_worker import load_reference
        from edgeattn.hf_reference_worker import offloaded as count_offloaded

        scratch = tempfile.mkdtemp(prefix="edgeattn-check-")
        reference = load_reference(str(hf.folder), str(hf.architecture), memory, scratch)
        version, offloaded = transformers.__version__, count_offloaded(reference)
    if offloaded:
        log.info("transformers' model of %s: %d tensors offloaded to disk, read a layer at a time", hf.folder,
                 offloaded)  # fmt: skip
    ids, mask = sample_ids(hf)
    try:
        with torch.no_grad():
            outputs = importer.reference(hf.model.eval(), reference, ids, mask)
    finally:
        if isinstance(reference, RemoteReference):
            reference.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    worst: ReferenceCheck | None = None
    for name, (ours, theirs) in outputs.items():
        if ours.shape != theirs.shape:
            raise ExportError(f"{hf.folder}: edgeattn's {name} is {tuple(ours.shape)}, transformers' "
                              f"{tuple(theirs.shape)}: the config was read into another model")  # fmt: skip
        diff = (ours.double() - theirs.double()).abs()
        at = tuple(int(i) for i in np.unravel_index(int(diff.argmax()), diff.shape))
        check = ReferenceCheck(version, name, float(diff.max()), at, float(theirs.abs().max()), int(mask.sum()))
        if worst is None or check.max_abs / check.tolerance > worst.max_abs / worst.tolerance:
            worst = check
    del reference
    assert worst is not None, f"{hf.architecture}'s importer compares no outputs"
    return worst


def require_transformers_agreement(hf: Imported, python: str | None = None) -> ReferenceCheck:
    """:func:`check_against_transformers`, raising an ExportError that names the largest
    difference when the two models disagree."""
    check = check_against_transformers(hf, python)
    log.info("%s", check.line())
    if not check.passed:
        raise ExportError(f"{hf.folder}: edgeattn's model disagrees with transformers' reading of the folder, "
                          f"so its config.json was misread; {check.line()}")  # fmt: skip
    return check
