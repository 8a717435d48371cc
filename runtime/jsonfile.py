"""A JSON object read from a file a user handed over, with an error that says what is wrong. Torch-free."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgeattn.errors import EdgeattnError


def read_json_object(path: str | Path, error: type[EdgeattnError] = EdgeattnError) -> dict[str, Any]:
    """The JSON object in ``path``; ``error`` (naming the file) when it is unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise error(f"{path} must hold a JSON object")
    return data
