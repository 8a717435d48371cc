"""What an export directory may name, checked before anything opens it.

Someone who controls a whole export directory controls its hashes too, so matching sha256 sums
prove nothing about where a file leads. Every file the manifest names must be a plain name
inside the directory, a regular file that is neither a symbolic link nor hard-linked elsewhere;
and every external-data entry of an ONNX graph must name such a file beside the graph, its
``offset`` and ``length`` inside that file. The graph's entries are read from its protobuf
bytes (:mod:`edgeattn.runtime.onnx_bytes`), without the ``onnx`` package and before ONNX Runtime
sees the file.
"""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path

from edgeattn.runtime.manifest import ManifestError
from edgeattn.runtime.onnx_bytes import Malformed, external_data_entries, file_external_tensors


class UnsafeFileError(ManifestError):
    """A file an export names that leads outside it, is a link or a device, or an ONNX graph
    whose external data does."""


def member_path(export_dir: str | Path, name: str, what: str = "file") -> Path:
    """``export_dir / name`` after checking that ``name`` is a plain file name and the file is a
    regular file inside ``export_dir``, not a symbolic link, with no other hard link."""
    export_dir = Path(export_dir)
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or Path(name).is_absolute():
        raise UnsafeFileError(f"{export_dir}: the {what} {name!r} is not a plain file name inside the directory")
    path = export_dir / name
    try:
        info = path.lstat()
    except FileNotFoundError as exc:
        raise ManifestError(f"{path} is listed in the manifest but missing") from exc
    except OSError as exc:
        raise UnsafeFileError(f"{path}: cannot be examined: {exc}") from exc
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeFileError(f"{path} is a symbolic link (to {os.readlink(path)!r}); an export holds its files itself")
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFileError(f"{path} is not a regular file")
    if info.st_nlink > 1:
        raise UnsafeFileError(f"{path} has {info.st_nlink} hard links; an export holds its own copy of each file")
    return path


def check_external_data(path: str | Path) -> list[Path]:
    """The external-data files of the ONNX graph at ``path``, after checking every entry names a
    regular file beside it (see :func:`member_path`) and lies inside that file. UnsafeFileError
    names the graph, the tensor and the entry."""
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ManifestError(f"{path} is empty, not an ONNX graph")
        error = None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            try:
                entries = external_data_entries(mapped)
            except Malformed as exc:  # its traceback holds views of the map: leave the block first
                error = str(exc)
    if error is not None:
        raise ManifestError(f"{path} is not a readable ONNX graph: {error}")
    return check_entries(entries, path.parent, str(path))


def check_entries(entries: list[tuple[str, dict[str, str]]], directory: Path | None, where: str) -> list[Path]:
    """The files ``entries`` name inside ``directory`` (None: a graph held in memory, which may not
    have external data), each checked; UnsafeFileError names ``where``, the tensor and the entry."""
    files: dict[str, tuple[Path, int]] = {}  # location -> (checked path, size)
    for tensor, pairs in entries:
        location = pairs.get("location", "")
        said = f"{where}: tensor {tensor!r} keeps its data in {location!r}"
        if directory is None:
            raise UnsafeFileError(f"{said}, but a graph held in memory has no directory to keep it in")
        if location not in files:
            try:
                data = member_path(directory, location, "external-data file")
            except ManifestError as exc:
                raise UnsafeFileError(f"{said}: {exc}") from exc
            files[location] = (data, data.stat().st_size)
        size = files[location][1]
        try:
            offset, length = int(pairs.get("offset", "0")), int(pairs.get("length", "-1"))
        except ValueError as exc:
            raise UnsafeFileError(f"{said} at a non-integer offset or length") from exc
        end = size if length < 0 else offset + length
        if offset < 0 or end > size or (length < 0 and "length" in pairs):
            raise UnsafeFileError(f"{said} at bytes {offset}..{end}, past the end of the file ({size} bytes)")
    return [path for path, _ in files.values()]


def graph_bytes(*paths: str | Path) -> int:
    """What loading the ONNX graph(s) at ``paths`` reads: each file and every external-data region
    they name, once each (a shared file counts only for the tensors these graphs use, once)."""
    regions = set()
    total = 0
    for path in map(Path, paths):
        total += path.stat().st_size
        for t in file_external_tensors(path):
            location = t.pairs.get("location", "")
            length = t.pairs.get("length")
            if length is None:
                data = path.parent / location
                regions.add((location, 0, data.stat().st_size if data.is_file() else 0))
            else:
                regions.add((location, int(t.pairs.get("offset", "0")), int(length)))
    return total + sum(r[2] for r in regions)
