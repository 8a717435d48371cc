"""Real English text without shipping any: paragraphs of the Python standard library's own
documentation (its docstrings, PSF-licensed, on every Python), for the held-out and evaluation
sets of the real-checkpoint tests and benchmarks.

The paragraphs are prose (no code, no doctest prompts, no tables), each joined into one line, in a
fixed order, so that a run here and a run elsewhere on the same Python measure the same text.
``python tests/real/texts.py OUT KIND BYTES`` writes ``KIND`` (heldout / evaluation) to a file,
a paragraph a line.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import warnings
from pathlib import Path

#: standard-library modules left out: tests, demos, and those that act on import
SKIP = ("antigravity", "this", "idlelib", "test", "turtledemo", "lib2to3", "pydoc_data", "tkinter", "turtle",
        "ensurepip", "venv", "msilib", "winreg", "winsound", "msvcrt", "nturl2path", "_")  # fmt: skip


def modules() -> list[str]:
    """The standard library's public top-level modules and their public submodules, sorted."""
    import pkgutil

    names = sorted(n for n in sys.stdlib_module_names if not n.startswith(SKIP))
    out = []
    for name in names:
        out.append(name)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except Exception:
            continue
        for info in pkgutil.iter_modules(getattr(module, "__path__", None) or []):
            if not info.name.startswith("_") and "test" not in info.name:
                out.append(f"{name}.{info.name}")
    return out


MIN_CHARS = 150
MAX_CHARS = 2400


def _docs(module_name: str) -> list[str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = importlib.import_module(module_name)
    except Exception:  # a module this Python lacks (tkinter without Tk): left out
        return []
    docs = [inspect.getdoc(module) or ""]
    for name, member in sorted(vars(module).items()):
        if name.startswith("_") or not (inspect.isclass(member) or inspect.isroutine(member)):
            continue
        if getattr(member, "__module__", module_name) != module_name:
            continue
        docs.append(inspect.getdoc(member) or "")
        if inspect.isclass(member):
            docs += [inspect.getdoc(m) or "" for n, m in sorted(vars(member).items())
                     if inspect.isroutine(m) and not n.startswith("_")]  # fmt: skip
    return docs


def _prose(paragraph: str) -> str | None:
    lines = [line.strip() for line in paragraph.splitlines()]
    if any(line.startswith((">>>", "...", "$", "|", "+-", "-", "*", ":")) or line.endswith("::") for line in lines):
        return None
    text = " ".join(lines)
    if not MIN_CHARS <= len(text) <= MAX_CHARS or not text[:1].isupper() or not text.endswith("."):
        return None
    letters = sum(c.isalpha() or c.isspace() for c in text)
    if letters < 0.88 * len(text) or re.search(r"[{}\[\]=<>]|\w\(\S|\w_\w", text):
        return None
    return text


def paragraphs() -> list[str]:
    """Every prose paragraph of the standard library's documentation, once each, in a fixed order."""
    seen: set[str] = set()
    out = []
    for name in modules():
        for doc in _docs(name):
            for paragraph in re.split(r"\n\s*\n", doc):
                text = _prose(paragraph)
                if text is not None and text not in seen:
                    seen.add(text)
                    out.append(text)
    return out


def split(kind: str, size: int) -> list[str]:
    """``size`` bytes of paragraphs: ``evaluation`` takes every sixth paragraph, ``heldout`` the
    others (the two never share a paragraph)."""
    if kind not in ("heldout", "evaluation"):
        raise ValueError(f"kind {kind!r} is not heldout or evaluation")
    every = paragraphs()
    pool = [t for i, t in enumerate(every) if (i % 6 == 5) == (kind == "evaluation")]
    chosen, total = [], 0
    for text in pool:
        if total >= size:
            break
        chosen.append(text)
        total += len(text.encode()) + 1
    return chosen


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: texts.py OUT heldout|evaluation BYTES")
    lines = split(sys.argv[2], int(sys.argv[3]))
    Path(sys.argv[1]).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(lines)} paragraphs, {sum(len(t) for t in lines)} characters")
