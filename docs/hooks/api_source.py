"""MkDocs hook: lay out the package as it is installed for the API reference to read.

The source folders are mapped (``runtime/`` is ``edgeattn.runtime``, ``exporters/`` is
``edgeattn.exporters``), so mkdocstrings reads a copy of the modules in ``build/api-src`` laid out
as the import system finds them (links would not do: griffe follows them back to the source tree).
"""

from __future__ import annotations

import runpy
import shutil
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / "build" / "api-src"


def lay_out() -> None:
    """Copy every mapped package's modules to where its import name puts them, under TREE."""
    mapping = runpy.run_path(str(ROOT / "setup.py"), run_name="edgeattn_setup")["PACKAGE_DIR"]
    shutil.rmtree(TREE, ignore_errors=True)
    for package, folder in sorted(mapping.items()):
        target = TREE.joinpath(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for entry in (ROOT / folder).iterdir():
            if entry.suffix == ".py":
                shutil.copy2(entry, target / entry.name)
            elif (entry / "__init__.py").exists() and not (target / entry.name).exists():
                shutil.copytree(entry, target / entry.name, ignore=shutil.ignore_patterns("__pycache__"))


# mkdocstrings drops a search path that does not exist when it reads its options, before any hook
# event: lay the tree out as this file is loaded, and again first thing at each build
lay_out()


@event_priority(100)
def on_config(config: Any, **kwargs: Any) -> Any:
    lay_out()
    return config
