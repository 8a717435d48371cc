"""Writing an output directory whole or not at all: refuse one that holds files unless asked to
replace it, build beside it, then swap it in with renames on the same filesystem. Torch-free."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from edgeattn.errors import ExportError
from edgeattn.runtime.layout import previous_name


def check_output_dir(out_dir: Path, force: bool) -> None:
    """Refuse an output directory that cannot be written, or that holds files, unless ``force``."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"output {out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ExportError(f"output directory {out_dir} is not empty; choose another or pass --force to replace it")
    parent = out_dir.resolve().parent
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ExportError(f"cannot write the output directory {out_dir}: {probe} is not writable")


def move_into_place(tmp: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` by the finished ``tmp`` with renames on the same filesystem."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    for folder, dirs, files in os.walk(tmp):
        for name in dirs:
            os.chmod(Path(folder) / name, 0o777 & ~umask)
        for name in files:
            os.chmod(Path(folder) / name, 0o666 & ~umask)
    if out_dir.exists():
        old = out_dir.with_name(previous_name(out_dir.name, os.getpid()))
        os.replace(out_dir, old)
        try:
            os.replace(tmp, out_dir)
        except OSError:
            os.replace(old, out_dir)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out_dir)
