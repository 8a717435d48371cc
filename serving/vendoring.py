"""The torch-free part of edgeattn a served model needs, found by following its imports, so that a
Triton Python-backend model runs where only numpy, onnxruntime and tokenizers are installed."""

from __future__ import annotations

import ast
import importlib.util
import logging
import shutil
from functools import cache
from pathlib import Path

from edgeattn.errors import EdgeattnError

log = logging.getLogger(__name__)

#: what a vendored module may not import at its top level (the server has none of them)
HEAVY = ("torch", "transformers")
#: the modules a served model starts from: the Python backend and the whole runtime package; what the
#: registries name instead of importing (the families' records, and the runtime classes, served tasks
#: and config sections those name) is added by :func:`served_roots`
ROOTS = ("edgeattn.serving.triton_backend", "edgeattn.runtime")


def served_roots() -> tuple[str, ...]:
    """:data:`ROOTS`, the families' records (the registry imports them by name) and the modules of the
    runtime classes and served tasks those records name."""
    from edgeattn.runtime.families import FAMILIES, record_module

    records = [record_module(name) for name in FAMILIES]
    named = [n.partition(":")[0] for f in FAMILIES.values() for n in (f.runtime, f.served, f.config_section)
             if n is not None]  # fmt: skip
    return (*ROOTS, *dict.fromkeys([*records, *named]))


def _origin(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise EdgeattnError(f"module {module} is not installed where edgeattn is")
    return Path(spec.origin)


def _is_package(module: str) -> bool:
    return _origin(module).name == "__init__.py"


def _submodule(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@cache
def _imports(module: str) -> tuple[frozenset[str], frozenset[str]]:
    """The modules ``module`` imports at its top level (inside top-level ``if`` / ``try`` too), and
    those it imports inside functions; edgeattn's submodules named by ``from ... import`` included."""
    tree = ast.parse(_origin(module).read_text(encoding="utf-8"))
    top_nodes = {id(n) for statement in tree.body for n in ast.walk(statement)
                 if not isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}  # fmt: skip
    top: set[str] = set()
    lazy: set[str] = set()
    package = module if _is_package(module) else module.rpartition(".")[0]
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names = [base]
            if base.startswith("edgeattn"):
                names += [f"{base}.{a.name}" for a in node.names if _submodule(f"{base}.{a.name}")]
        # ``if TYPE_CHECKING:`` blocks are top-level statements too, and never run
        if isinstance(node, ast.ImportFrom | ast.Import):
            (top if id(node) in top_nodes and not _type_checking(tree, node) else lazy).update(names)
    return frozenset(top), frozenset(lazy)


def _type_checking(tree: ast.Module, node: ast.AST) -> bool:
    """Whether ``node`` sits in a top-level ``if TYPE_CHECKING:`` block."""
    for statement in tree.body:
        if isinstance(statement, ast.If) and "TYPE_CHECKING" in ast.unparse(statement.test):
            if any(n is node for n in ast.walk(statement)):
                return True
    return False


@cache
def heavy_import(module: str) -> str | None:
    """The chain of top-level imports by which ``module`` needs torch or transformers, or None
    (followed breadth-first, so that modules importing each other are each looked at once)."""
    parents: dict[str, str | None] = {module: None}
    queue = [module]
    while queue:
        current = queue.pop(0)
        top, _ = _imports(current)
        for name in sorted(top):
            if name.split(".")[0] in HEAVY:
                chain = [name, current]
                while parents[chain[-1]] is not None:
                    chain.append(parents[chain[-1]])  # type: ignore[arg-type]
                return " -> ".join(reversed(chain))
            if name.startswith("edgeattn.") and name not in parents:
                parents[name] = current
                queue.append(name)
    return None


def vendored_modules(roots: tuple[str, ...] | None = None) -> dict[str, Path]:
    """Every edgeattn module the ``roots`` (default :func:`served_roots`) reach (a package root: all
    its modules) by imports that need no torch, with its file; EdgeattnError naming the chain where
    a root's own imports do."""
    todo = []
    for root in served_roots() if roots is None else roots:
        todo.append(root)
        if _is_package(root):
            todo += [f"{root}.{p.stem}" for p in sorted(_origin(root).parent.glob("*.py")) if p.stem != "__init__"]
    found: dict[str, Path] = {}
    while todo:
        module = todo.pop()
        if module in found:
            continue
        chain = heavy_import(module)
        if chain is not None:
            raise EdgeattnError(f"the served model's code imports torch or transformers: {chain}")
        found[module] = _origin(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages above it
        top, lazy = _imports(module)
        todo += [n for n in top if n.startswith("edgeattn")]
        for name in lazy:  # imported inside a function: carried where it needs no torch
            if name.startswith("edgeattn") and _submodule(name):
                if heavy_import(name) is None:
                    todo.append(name)
                else:
                    log.debug("not vendored (needs torch): %s, imported inside %s", name, module)
    return found


def vendor(dst: Path) -> list[str]:
    """Copy :func:`vendored_modules` under ``dst`` as the package tree ``edgeattn/...``; returns the
    module names."""
    modules = vendored_modules()
    for module, origin in modules.items():
        relative = Path(*module.split("."))
        target = dst / relative / "__init__.py" if origin.name == "__init__.py" else dst / relative.with_suffix(".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(origin, target)
    return sorted(modules)
