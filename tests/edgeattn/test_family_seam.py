"""Every family is found the same way, and the code every family shares names none of them: a
family's modules live in its two folders, its record names them, and generic modules ask the
records instead of spelling a family's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from edgeattn.runtime.families import FAMILIES, NAMES, record_module, resolve

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[2]
#: the folders of the shared code (edgeattn's packages as they are laid out here)
SHARED = ("edgeattn", "exporters", "runtime", "serving")
#: the places a family's name may still be spelled in shared code, and why
ALLOWED = {
    ("edgeattn/config.py", "encoder-decoder"): "ModelConfig's default architecture",
    ("edgeattn/config.py", "encoder"): "the bert-base preset's architecture",
    ("exporters/web.py", "encoder"): "the family of a bundle.json written before bundles named theirs",
    ("edgeattn/model.py", "encoder"): "the encoder stack's state-dict prefix, not the family",
    ("runtime/cross_decoding.py", "encoder"): "the decoding contract's key for the encoder graph, not the family",
}


def _shared_files() -> list[Path]:
    return [p for folder in SHARED for p in (ROOT / folder).rglob("*.py")
            if "families" not in p.relative_to(ROOT).parts and "__pycache__" not in p.parts]  # fmt: skip


def test_each_family_is_two_folders_and_a_record_that_names_its_own_modules():
    assert tuple(FAMILIES) == NAMES
    for name, family in FAMILIES.items():
        assert family.name == name and record_module(name) == f"edgeattn.runtime.families.{name}.record"
        assert (ROOT / "edgeattn" / "families" / name / "__init__.py").is_file()
        assert (ROOT / "runtime" / "families" / name / "record.py").is_file()
        own = (f"edgeattn.families.{name}.", f"edgeattn.runtime.families.{name}.")
        hooks = [family.model, family.runtime, family.importers, family.run_hook, family.config_section,
                 family.bundle_describer, family.stepper, family.served, family.bencher]  # fmt: skip
        for hook in filter(None, hooks):
            assert hook.startswith(own), f"{name}'s record names {hook}, outside its folders"
            resolve(hook)


def test_shared_code_spells_no_family_name_but_where_it_says_why():
    spelled = {f.name for f in FAMILIES.values()} | {f.architecture for f in FAMILIES.values()}
    found = set()
    for path in _shared_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                      and n.body and isinstance(n.body[0], ast.Expr)}  # fmt: skip
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in spelled and id(node) not in docstrings:
                found.add((path.relative_to(ROOT).as_posix(), node.value))
    assert found <= set(ALLOWED), sorted(found - set(ALLOWED))
    assert len(found) <= 5


def test_no_shared_module_is_named_after_a_family_or_an_architecture():
    words = {*NAMES, "whisper", "t5", "llama", "bert", "gpt2", "qwen", "phi3", "gemma"}
    named = [p.relative_to(ROOT).as_posix() for p in _shared_files() if set(p.stem.split("_")) & words]
    assert not named, named
