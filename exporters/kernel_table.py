"""What an ONNX Runtime build can run: every CPU kernel (operator, domain, opset range, types) and
the operator schemas those kernels implement (inputs, their types, how many), as a JSON table.

The web and node targets run ONNX Runtime for JavaScript 1.30.0, whose wasm and native backends
compile the CPU execution provider's kernels; the table of that release
(``js/onnxruntime-1.30.0-cpu-kernels.json.gz``) was dumped from the onnxruntime 1.30.0 wheel with
``python -m edgeattn.exporters.kernel_table OUT.json.gz`` run in an environment that has that wheel
(the installed onnxruntime is the one read). :mod:`edgeattn.exporters.target_lint` checks a graph
against such a table before a bundle is written. Torch-free.
"""

from __future__ import annotations

import gzip
import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

#: the table of the ONNX Runtime the web and node targets run
TARGET_TABLE = Path(__file__).resolve().parent / "js" / "onnxruntime-1.30.0-cpu-kernels.json.gz"


def dump() -> dict[str, Any]:
    """The installed onnxruntime's CPU kernels and the schemas of their operators."""
    import onnxruntime
    from onnxruntime.capi import _pybind_state as C

    kernels: dict[str, list[Any]] = {}
    for k in C.get_all_opkernel_def():
        if k.provider != "CPUExecutionProvider":
            continue
        start, end = k.version_range
        kernels.setdefault(f"{k.domain or 'ai.onnx'}::{k.op_name}", []).append(
            [start, end, {name: sorted(types) for name, types in sorted(k.type_constraints.items())}])
    schemas: dict[str, list[Any]] = {}
    for s in C.get_all_operator_schema():
        key = f"{s.domain or 'ai.onnx'}::{s.name}"
        if key not in kernels:
            continue
        schemas.setdefault(key, []).append({
            "since": s.since_version, "min_inputs": s.min_input, "max_inputs": s.max_input,
            "inputs": [[p.typeStr, str(p.option).rsplit(".", 1)[-1]] for p in s.inputs],
            "outputs": [p.typeStr for p in s.outputs],
            "constraints": {t.type_param_str: list(t.allowed_type_strs) for t in s.type_constraints},
        })  # fmt: skip
    for versions in schemas.values():
        versions.sort(key=lambda v: v["since"])
    return {"onnxruntime": onnxruntime.__version__, "provider": "CPUExecutionProvider",
            "kernels": dict(sorted(kernels.items())), "schemas": dict(sorted(schemas.items()))}  # fmt: skip


@cache
def read_table(path: Path = TARGET_TABLE) -> dict[str, Any]:
    """A table :func:`dump` wrote."""
    return json.loads(gzip.decompress(Path(path).read_bytes()))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m edgeattn.exporters.kernel_table OUT.json.gz (run with the onnxruntime to describe)")
    Path(sys.argv[1]).write_bytes(gzip.compress(json.dumps(dump(), separators=(",", ":")).encode(), mtime=0))
