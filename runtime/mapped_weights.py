"""The pages of a graph's memory-mapped weights handed back once its session is built (Linux; torch-free).

ONNX Runtime maps a graph's aligned external weights (see the exporter's ``external_data``); a
kernel that packs its weight at load (MatMulNBits, MatMul) unmaps it afterwards, but two kinds of
mapping stay, and both count in the process's resident memory:

- *read while the session was built and kept*: MatMulNBits' scales, which ONNX Runtime keeps
  beside the packed weights it made of them (every page resident; 29 MiB on a Qwen2.5-0.5B-shaped
  int4 graph). Their pages are dropped from this process (``MADV_DONTNEED``); they stay in the
  page cache, and a kernel that reads one again maps it back.
- *not read yet*: a table read a row at a time as tokens arrive (the tied embedding's
  GatherBlockQuantized). Its file's pages are in the page cache as large folios from the session's
  sequential read, and a fault maps a whole folio: 128 random token ids brought 62 of the 66 MB
  int4 table of that shape in. Its range of the page cache is dropped (``POSIX_FADV_DONTNEED``)
  and the mapping marked random (``MADV_RANDOM``: no read-ahead), so a token maps the pages of its
  row; the first read of a row is then a read from the disk.

Measured on this project's 2-core machine (int4, 128 new tokens): SmolLM2-360M shape, prompt
128 / 512, process peak 367 / 404 MiB before, 338 / 368 after; Qwen2.5-0.5B shape, generation
486 / 490 MiB before, 395 / 418 after. A mapping with private copies in it (pages a kernel wrote)
is never touched; elsewhere than Linux nothing is done.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) ([0-9a-f]+) \S+ \d+\s*(.*)$")


@dataclass(frozen=True)
class Mapping:
    """One mapping of a file in this process, as ``/proc/self/smaps`` reports it (sizes in bytes)."""

    start: int
    end: int
    offset: int
    path: str
    rss: int
    anonymous: int
    flags: frozenset[str]


@dataclass(frozen=True)
class Released:
    """What :func:`release_mapped_weights` did: bytes dropped from this process's resident memory
    (weights read at load and kept) and bytes of untouched tables advised to be read by row."""

    dropped: int = 0
    advised: int = 0


def file_mappings(paths: Iterable[str | Path]) -> list[Mapping]:
    """This process's mappings of the given files (empty where ``/proc/self/smaps`` is not there)."""
    wanted = {os.path.realpath(p) for p in paths}
    found: list[Mapping] = []
    current: dict[str, Any] | None = None
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in [*lines, "0-0 ---p 0 0:0 0 "]:
        header = _HEADER.match(line)
        if header:
            if current is not None and current["path"] in wanted:
                found.append(Mapping(**current))
            start, end, _perms, offset, path = header.groups()
            current = {"start": int(start, 16), "end": int(end, 16), "offset": int(offset, 16), "path": path,
                       "rss": 0, "anonymous": 0, "flags": frozenset()}  # fmt: skip
        elif current is not None:
            key, _, value = line.partition(":")
            if key in ("Rss", "Anonymous"):
                current[key.lower()] = int(value.split()[0]) * 1024
            elif key == "VmFlags":
                current["flags"] = frozenset(value.split())
    return found


@functools.cache
def _madvise() -> Any:
    """libc's ``madvise``, or None where it cannot be had."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def release_mapped_weights(data_files: Iterable[str | Path]) -> Released:
    """Hand back the resident pages of this process's mappings of ``data_files`` that a built
    session no longer reads in full (see the module's description); a no-op elsewhere than Linux."""
    madvise = _madvise() if sys.platform.startswith("linux") else None
    if madvise is None:
        return Released()
    dropped = advised = 0
    for m in file_mappings(data_files):
        if m.anonymous:  # a kernel wrote into it: dropping the pages would lose what it wrote
            continue
        length = m.end - m.start
        if m.rss:
            if madvise(m.start, length, mmap.MADV_DONTNEED) == 0:
                dropped += m.rss
            continue
        try:
            fd = os.open(m.path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, m.offset, length, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except OSError as exc:
            log.debug("cannot drop the cached pages of %s: %s", m.path, exc)
        if madvise(m.start, length, mmap.MADV_RANDOM) == 0:
            advised += length
    if dropped or advised:
        log.debug("mapped weights: %d MiB dropped, %d MiB to be read by row", dropped >> 20, advised >> 20)
    return Released(dropped, advised)
