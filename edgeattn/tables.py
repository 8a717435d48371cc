"""Plain-text tables for the terminal: columns padded to their widest cell, a rule under the header.
Torch-free."""

from __future__ import annotations

from collections.abc import Sequence


def table_lines(rows: Sequence[Sequence[str]]) -> list[str]:
    """``rows`` (the header first) as aligned lines, with a rule of dashes under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
