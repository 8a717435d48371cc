"""One writer at a time per export directory: ``edgeattn export`` and ``edgeattn quantize`` hold
an exclusive lock on a small file beside the directory (``.NAME.lock``) while they build and swap
it in, and remove it when done. A second writer is refused at once with the first one's process
id; the operating system drops the lock when its holder dies, however it dies (a SIGKILL leaves
the file behind, unlocked, and the next writer takes it)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from edgeattn.errors import ExportError
from edgeattn.runtime.layout import lock_name


@contextlib.contextmanager
def writer_lock(out_dir: str | Path) -> Iterator[Path]:
    """Hold the writer lock of ``out_dir`` (its parent must exist); yields the lock file's path,
    which is removed again on release."""
    out_dir = Path(out_dir)
    path = out_dir.resolve().parent / lock_name(out_dir.name)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock, as before
        yield path
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise ExportError(
                f"{out_dir} is being written by another edgeattn export or quantize (pid {holder}); "
                "run again when it has finished"
            ) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder we waited on removed that file: lock the one there now
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode("ascii"))
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # still locked: a writer that opened it sees another file there and retries
        os.close(fd)
