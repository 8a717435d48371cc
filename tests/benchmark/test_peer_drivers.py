"""Each family's benchmark drivers and peer comparisons, run as their users run them
(``python -m edgeattn.families.<family>.<driver>``), start and parse their options: a driver whose
imports or arguments broke in a move fails here, not on the day someone measures with it."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import edgeattn.families


def _drivers() -> list[str]:
    """The modules of the family folders that run as a program with options (argparse)."""
    found = []
    for family in pkgutil.iter_modules(edgeattn.families.__path__):
        folder = Path(edgeattn.families.__path__[0]) / family.name
        for module in pkgutil.iter_modules([str(folder)]):
            source = (folder / f"{module.name}.py").read_text(encoding="utf-8")
            if "argparse" in source and 'if __name__ == "__main__"' in source:
                found.append(f"edgeattn.families.{family.name}.{module.name}")
    return sorted(found)


def test_every_family_with_peers_has_its_comparison_in_its_folder():
    drivers = _drivers()
    assert {"edgeattn.families.causal.peers", "edgeattn.families.seq2seq.peers",
            "edgeattn.families.speech.peers"} <= set(drivers)  # fmt: skip


@pytest.mark.parametrize("driver", _drivers())
def test_a_driver_starts_and_parses_its_options(driver):
    done = subprocess.run([sys.executable, "-m", driver, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:") and "--" in done.stdout
