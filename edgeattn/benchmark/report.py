"""How a benchmark's result leaves the process: its table printed, its JSON written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol


class Result(Protocol):
    def table(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


def write_json(result: Result, path: str | Path) -> None:
    """``result.to_dict()`` as indented JSON at ``path`` (its folder made)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")


def publish(result: Result, path: str | Path) -> None:
    """Print the result's table, write its JSON, and say where (a benchmark script's last step)."""
    print(result.table())  # noqa: T201 - the scripts' output
    write_json(result, path)
    print(f"wrote {path}")  # noqa: T201
