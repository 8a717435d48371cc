"""Run a written Triton model's own code as Triton's container would: a Python where edgeattn is not
installed, only numpy, onnxruntime and tokenizers, and torch and transformers cannot be imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy
import onnxruntime
import tokenizers

#: run first: torch, transformers and edgeattn's installed copy made unimportable
PRELUDE = """\
import sys
sys.modules.update(torch=None, transformers=None)
vendor = sys.argv[1]
sys.path.insert(0, vendor)
import edgeattn
assert edgeattn.__file__.startswith(vendor), f"edgeattn came from {edgeattn.__file__}, not {vendor}"
"""


def run_vendored(version_dir: Path, code: str, timeout: float = 120) -> str:
    """Run ``code`` with ``version_dir/vendor`` as the only edgeattn (``version_dir`` in variable
    ``version``); returns its stdout, AssertionError with its stderr when it fails."""
    packages = {str(Path(m.__file__).resolve().parent.parent) for m in (numpy, onnxruntime, tokenizers)}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join(sorted(packages))
    vendor = str((version_dir / "vendor").resolve())
    script = PRELUDE + f"from pathlib import Path\nversion = Path({str(version_dir)!r})\n" + code
    # -S: no site-packages and none of their .pth files (the editable install's finder among them)
    done = subprocess.run([sys.executable, "-S", "-c", script, vendor], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=version_dir)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def vendored_answers(version_dir: Path, texts: list[str], output: str, options: dict | None = None) -> list:
    """The written ``model.py`` imported, then the served model's ``output`` for ``texts`` (one
    call of ``answer_texts`` with ``options``), all where edgeattn is not installed."""
    code = (
        "import runpy\n"
        "assert 'TritonPythonModel' in runpy.run_path(str(version / 'model.py'))\n"
        "from edgeattn.serving.tasks import answer_texts\n"
        "from edgeattn.serving.triton_backend import served_model\n"
        "model, settings = served_model(version, 'in-process', 8)\n"
        f"found = answer_texts(model, settings['task'], {texts!r}, {options or {}!r})\n"
        f"print(repr(found[{output!r}][:, 0].tolist()))\n"
        "assert not [m for m in sys.modules if m.startswith(('torch', 'transformers')) and sys.modules[m]]\n"
    )
    import ast

    return ast.literal_eval(run_vendored(version_dir, code).strip())
