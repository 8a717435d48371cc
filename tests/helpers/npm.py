"""The npm packages the bundle tests run under Node.js (onnxruntime-node, onnxruntime-web,
transformers.js), installed once."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeattn.exporters.web import ORT_PACKAGES

pytest.importorskip("transformers")


#: transformers.js, which must load a bundle as its own layout
TRANSFORMERS_JS = ("@huggingface/transformers", "4.3.2")


#: where the tests keep the npm packages they install (reused between runs)
NPM_CACHE = Path(os.environ.get("EDGEATTN_NPM_DIR", Path.home() / ".cache" / "edgeattn-tests" / "npm"))


@pytest.fixture(scope="session")
def node_modules() -> Path:
    """onnxruntime-node and onnxruntime-web from npm (``--ignore-scripts``: onnxruntime-node's install
    script fetches CUDA parts from outside; its CPU binding is in the package)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip("Node.js and npm are not installed")
    packages = [*ORT_PACKAGES.values(), TRANSFORMERS_JS]
    wanted = [f"{name}@{version}" for name, version in packages]
    modules = NPM_CACHE / "node_modules"
    NPM_CACHE.mkdir(parents=True, exist_ok=True)
    with exclusive(NPM_CACHE / ".lock"):  # test workers in parallel install once
        have = all((modules / name / "package.json").is_file() and json.loads((modules / name / "package.json")
                   .read_text())["version"] == version for name, version in packages)  # fmt: skip
        if not have:
            done = subprocess.run([npm, "install", "--ignore-scripts", "--no-audit", "--no-fund", "--prefix",
                                   str(NPM_CACHE), *wanted], capture_output=True, text=True, timeout=600)  # fmt: skip
            if done.returncode != 0:
                pytest.skip(f"npm could not install {', '.join(wanted)}: {done.stderr.strip()[-300:]}")
    return modules


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (one process at a time, across test workers)."""
    import fcntl

    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
