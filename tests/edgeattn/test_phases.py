"""Long work announces its phases (once they have run a while) and their times; quick ones stay quiet."""

from __future__ import annotations

import logging
import time

import pytest

from edgeattn.phases import ANNOUNCE_ENV, STARTED, phase

pytestmark = pytest.mark.quick


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "edgeattn.phases"]


def test_a_phase_that_runs_a_while_is_announced_and_timed(caplog, monkeypatch):
    monkeypatch.setenv(ANNOUNCE_ENV, "0.05")
    with caplog.at_level(logging.INFO, logger="edgeattn.phases"):
        with phase("fitting"):
            time.sleep(0.3)
        with phase("a quick one"):
            pass
    lines = _lines(caplog)
    assert lines[0] == f"{STARTED}fitting" and lines[1].startswith("fitting: done in 0.")
    assert len(lines) == 2


def test_every_phase_is_announced_as_it_starts_where_the_delay_is_0(caplog, monkeypatch):
    monkeypatch.setenv(ANNOUNCE_ENV, "0")
    with caplog.at_level(logging.INFO, logger="edgeattn.phases"):
        with phase("writing"):
            pass
        with pytest.raises(ValueError), phase("failing"):
            raise ValueError("no")
    assert _lines(caplog)[:3] == [f"{STARTED}writing", "writing: done in 0.0 s", f"{STARTED}failing"]
    assert len(_lines(caplog)) == 3  # a failure's own message says what happened
