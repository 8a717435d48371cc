"""The phases of long work (an export's load, check, write, verification, each precision's making
and gate), announced on the ``edgeattn.phases`` logger, which the command line shows: a run that
takes many minutes says what it is doing, in a terminal or a log file (progress bars draw only on
a terminal), and a memory benchmark can attribute its samples to phases
(:mod:`edgeattn.benchmark.export_memory`). A phase is announced once it has run
:data:`ANNOUNCE_AFTER` seconds (so quick commands and their one-line errors stay quiet), and its
time is logged when it ends."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator

log = logging.getLogger("edgeattn.phases")

#: how a phase's first line starts; its last adds ": done in S s"
STARTED = "start: "
#: the environment variable that sets :data:`ANNOUNCE_AFTER` (0: every phase, as it starts)
ANNOUNCE_ENV = "EDGEATTN_PHASES_AFTER"
#: seconds a phase runs before it is announced
ANNOUNCE_AFTER = 2.0


def _delay() -> float:
    try:
        return max(0.0, float(os.environ.get(ANNOUNCE_ENV, ANNOUNCE_AFTER)))
    except ValueError:
        return ANNOUNCE_AFTER


@contextlib.contextmanager
def phase(what: str) -> Iterator[None]:
    """Announce ``what`` once it has run a while (at once where the delay is 0), and log its time
    when it ends if it was announced."""
    announced = threading.Event()

    def announce() -> None:
        announced.set()
        log.info("%s%s", STARTED, what)

    delay = _delay()
    timer = None
    if delay <= 0:
        announce()
    else:
        timer = threading.Timer(delay, announce)
        timer.daemon = True
        timer.start()
    start = time.perf_counter()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()
    if announced.is_set():
        log.info("%s: done in %.1f s", what, time.perf_counter() - start)
