"""The pages of a graph's memory-mapped weights handed back once its session is built (Linux; torch-free).

ONNX Runtime maps a graph's aligned external weights (see the exporter's ``external_data``); a
kernel that packs its weight at load (MatMulNBits, MatMul) unmaps it afterwards, but two kinds of
mapping stay, and both count in the process's resident memory:

- *read while the session was built and kept*: MatMulNBits' scales, which ONNX Runtime keeps
  beside the packed weights it made of them (every page resident; 29 MiB on a Qwen2.5-0.5B-shaped
  int4 graph). Their pages are dropped from this process (``MADV_DONTNEED``); they stay in the
  page cache, and a kernel that reads one again maps it back.
- *not read yet, and read a row at a time* as tokens arrive (the tied embedding's
  GatherBlockQuantized: a tensor the graph reads only as a gather's table, :func:`row_tables`).
  Its file's pages are in the page cache as large folios from the session's sequential read, and
  a fault maps a whole folio: 128 random token ids brought 62 of the 66 MB int4 table of that
  shape in. Its range of the page cache is dropped (``POSIX_FADV_DONTNEED``) and its pages marked
  random (``MADV_RANDOM``: no read-ahead), so a token maps the pages of its row; the first read of
  a row is then a read from the disk. Only such tables: a weight read whole at each call (a
  convolution's, position embeddings) keeps its cached pages and its read-ahead (treated as a
  table, the real Whisper tiny.en's audio encoder read 4.5 MB of them back from the disk a page
  at a time on its first call: 1,147 major faults).

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

from edgeattn.runtime.onnx_bytes import Malformed, external_tensors, row_read_only

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


@dataclass(frozen=True)
class Table:
    """Where a table read by row lies: its data file (resolved) and its bytes there."""

    path: str
    offset: int
    length: int


def row_tables(graph: str | Path) -> list[Table]:
    """The external tensors of the ONNX file ``graph`` that it reads only a row at a time
    (:func:`edgeattn.runtime.onnx_bytes.row_read_only`); none for a file that is not an ONNX protobuf."""
    try:
        with open(graph, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            try:
                names = row_read_only(mapped)
                tensors = external_tensors(mapped) if names else []
            except Malformed:  # not an ONNX protobuf (ONNX Runtime's own format): handled before the map
                return []  # closes, as its traceback holds views of it
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        return []
    folder = Path(graph).parent
    return [Table(os.path.realpath(folder / t.pairs["location"]), int(t.pairs.get("offset", 0)),
                  int(t.pairs["length"]))
            for t in tensors if t.name in names and t.pairs.get("location") and "length" in t.pairs]  # fmt: skip


def release_mapped_weights(data_files: Iterable[str | Path], tables: Iterable[Table] = ()) -> Released:
    """Hand back the resident pages of this process's mappings of ``data_files`` that a built
    session no longer reads in full, and have the untouched ``tables`` read by row (see the
    module's description); a no-op elsewhere than Linux."""
    madvise = _madvise() if sys.platform.startswith("linux") else None
    if madvise is None:
        return Released()
    dropped = advised = 0
    tables = list(tables)
    for m in file_mappings(data_files):
        if m.anonymous:  # a kernel wrote into it: dropping the pages would lose what it wrote
            continue
        length = m.end - m.start
        if m.rss:
            if madvise(m.start, length, mmap.MADV_DONTNEED) == 0:
                dropped += m.rss
            continue
        for table in tables:  # the parts of this mapping that hold a table read by row
            begin, end = max(m.offset, table.offset), min(m.offset + length, table.offset + table.length)
            if table.path != m.path or begin >= end:
                continue
            begin -= begin % mmap.PAGESIZE
            try:
                fd = os.open(m.path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, begin, end - begin, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            except OSError as exc:
                log.debug("cannot drop the cached pages of %s: %s", m.path, exc)
            if madvise(m.start + begin - m.offset, end - begin, mmap.MADV_RANDOM) == 0:
                advised += end - begin
    if dropped or advised:
        log.debug("mapped weights: %d MiB dropped, %d MiB to be read by row", dropped >> 20, advised >> 20)
    return Released(dropped, advised)
