"""The package as users install it: a wheel holds every module of the source tree."""

from __future__ import annotations

import runpy
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: setup.py's package folders and the packages it finds in them (read without building)
SETUP = runpy.run_path(str(ROOT / "setup.py"), run_name="edgeattn_setup")


def _source_modules() -> set[str]:
    """Installed paths (``edgeattn/...py``) of every module under the mapped package folders."""
    modules = set()
    for package, folder in SETUP["PACKAGE_DIR"].items():
        for path in (ROOT / folder).rglob("*.py"):
            relative = path.relative_to(ROOT / folder)
            if any(part.startswith((".", "__pycache__")) for part in relative.parts):
                continue
            inside = package.replace(".", "/")
            if package == "edgeattn" and relative.parts[0] in {"exporters", "runtime"}:
                continue  # other mapped packages
            modules.add(f"{inside}/{relative.as_posix()}")
    return modules


def test_every_package_folder_is_found():
    found = set(SETUP["packages"]())
    folders = {path.parent for module in _source_modules() for path in [Path(module)]}
    wanted = {folder.as_posix().replace("/", ".") for folder in folders}
    assert wanted <= found, f"folders setup.py does not find (no __init__.py?): {sorted(wanted - found)}"
    assert {"edgeattn.families.speech", "edgeattn.runtime.families.speech"} <= found


@pytest.mark.slow
def test_wheel_holds_every_module_and_the_demo_checkpoint(tmp_path):
    pytest.importorskip("setuptools", minversion="61")  # builds without isolation: no download
    source = tmp_path / "src"  # a clean copy: a stale build/ folder would hide missing packages
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__"))
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("edgeattn-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = _source_modules() - names
    assert not missing, f"modules missing from the wheel: {sorted(missing)}"
    assert "edgeattn/assets/demo-sort.safetensors" in names
