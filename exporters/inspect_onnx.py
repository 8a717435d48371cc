"""What an ONNX file or an export directory holds, for ``edgeattn inspect`` (needs onnx, not torch)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import onnx

from edgeattn.errors import EdgeattnError
from edgeattn.exporters.operators import FUSED_OPS
from edgeattn.runtime.layout import MANIFEST
from edgeattn.runtime.manifest import read_manifest
from edgeattn.runtime.precisions import Verdict
from edgeattn.runtime.safety import graph_bytes

_DTYPES = {v: k.lower() for k, v in onnx.TensorProto.DataType.items()} | {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT16: "float16",
}


def _axes(value: onnx.ValueInfoProto) -> list[str | int]:
    dims = value.type.tensor_type.shape.dim
    return [d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else "?") for d in dims]


def _io(value: onnx.ValueInfoProto) -> dict[str, Any]:
    elem = value.type.tensor_type.elem_type
    return {"name": value.name, "dtype": _DTYPES.get(elem, str(elem)), "shape": _axes(value)}


def _external_files(model: onnx.ModelProto) -> set[str]:
    files = set()
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            files.update(e.value for e in t.external_data if e.key == "location")
    return files


def inspect_file(path: str | Path) -> dict[str, Any]:
    """Opset, IR version, inputs/outputs with symbolic axes, operator histogram (fused ones named),
    parameter count, bytes it reads (the external-data regions it names included) and metadata of
    one ONNX file."""
    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise EdgeattnError(f"{path} is not a readable ONNX file: {exc}") from exc
    ops = Counter(n.op_type for n in model.graph.node)
    params = 0
    for t in model.graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        params += n
    external = _external_files(model)
    size = graph_bytes(path)
    meta = {p.key: p.value for p in model.metadata_props}
    return {
        "file": str(path),
        "ir_version": model.ir_version,
        "opsets": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "inputs": [_io(v) for v in model.graph.input],
        "outputs": [_io(v) for v in model.graph.output],
        "nodes": sum(ops.values()),
        "operators": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        "fused_operators": {k: v for k, v in ops.items() if k in FUSED_OPS},
        "parameters": params,
        "bytes": size,
        "external_data": sorted(external),
        "metadata": meta,
    }


def inspect_path(path: str | Path) -> dict[str, Any]:
    """``inspect_file`` for a file; for an export directory, its manifest summary and every graph."""
    path = Path(path)
    if not path.exists():
        raise EdgeattnError(f"{path} does not exist")
    if path.is_file():
        return inspect_file(path)
    if not (path / MANIFEST).is_file():
        raise EdgeattnError(f"{path} is a directory without {MANIFEST}; pass an ONNX file or an edgeattn export")
    manifest = read_manifest(path)
    data = manifest.to_json()
    graphs = {}
    for name, entry in manifest.graphs.items():
        graphs[name] = {
            **inspect_file(path / entry.file),
            "parity": data["graphs"][name]["parity"],
            "precision": entry.precision,
        }
        for precision, variant in entry.precisions.items():
            graphs[f"{name}.{precision}"] = {
                **inspect_file(path / variant.file),
                "parity": data["graphs"][name]["precisions"][precision].get("parity"),
                "precision": precision + (" (degraded)" if variant.degraded else ""),
            }
    return {
        "export_dir": str(path),
        "format_version": manifest.format_version,
        "edgeattn_version": manifest.edgeattn_version,
        "created": manifest.created,
        "source": manifest.source,
        "config": data["config"],
        "greedy_parity": data["greedy_parity"],
        "gates": data["gates"],
        "graphs": graphs,
    }


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def format_file(info: dict[str, Any], indent: str = "") -> str:
    """Human-readable lines for one file's inspection."""
    lines = [
        f"{indent}file: {info['file']}",
        f"{indent}ir_version: {info['ir_version']}  opsets: "
        + ", ".join(f"{k} {v}" for k, v in info["opsets"].items()),
        f"{indent}parameters: {info['parameters']:,}  size: {_mb(info['bytes'])}  nodes: {info['nodes']}",
        f"{indent}inputs:",
    ]
    for kind in ("inputs", "outputs"):
        if kind == "outputs":
            lines.append(f"{indent}outputs:")
        for t in info[kind]:
            lines.append(f"{indent}  {t['name']}: {t['dtype']} [{', '.join(str(a) for a in t['shape'])}]")
    hist = ", ".join(f"{k}{'*' if k in FUSED_OPS else ''} {v}" for k, v in info["operators"].items())
    lines.append(f"{indent}operators: {hist}")
    fused = info["fused_operators"]
    lines.append(f"{indent}fused operators (*): " + (", ".join(f"{k} {v}" for k, v in fused.items()) or "none"))
    for key, value in info["metadata"].items():
        shown = value if len(value) <= 100 else value[:97] + "..."
        lines.append(f"{indent}metadata {key}: {shown}")
    if info.get("parity"):
        p = info["parity"]
        lines.append(
            f"{indent}parity at export: {p['cases']} cases, max abs {p['max_abs']:.2e}, max rel {p['max_rel']:.2e}, "
            + ("ok" if p["passed"] else "FAILED")
            + (f" ({p['float64_cases']} judged against float64 eager)" if p.get("float64_cases") else "")
        )
    return "\n".join(lines)


def format_report(info: dict[str, Any]) -> str:
    """Human-readable text for :func:`inspect_path`'s result."""
    if "export_dir" not in info:
        return format_file(info)
    c = info["config"]
    lines = [
        f"export: {info['export_dir']} (format {info['format_version']}, edgeattn {info['edgeattn_version']}, "
        f"created {info['created']})",
        f"source: {info['source']}",
        f"model: {c['architecture']}, d_model {c['d_model']}, {c['n_heads']} heads, d_ff {c['d_ff']}, "
        f"layers {c['n_encoder_layers']}+{c['n_decoder_layers']}, vocab {c['vocab_size']}, positions {c['position']}",
    ]
    g = info.get("greedy_parity")
    if g:
        lines.append(
            f"greedy decode parity: {g['rows']} rows x {g['tokens']} tokens, " + ("ok" if g["passed"] else "FAILED")
        )
    for precision, gate in info.get("gates", {}).items():
        state = "ok" if gate["passed"] else ("DEGRADED" if gate.get("degraded") else "FAILED")
        failures = "; ".join(str(Verdict(**v)) for v in gate["failures"])
        lines.append(f"accuracy gate {precision}: {state}" + (f" ({failures})" if failures else ""))
    for name, graph in info["graphs"].items():
        lines.append(f"\n[{name}] precision {graph['precision']}")
        lines.append(format_file(graph, indent="  "))
    return "\n".join(lines)


def to_json(info: dict[str, Any]) -> str:
    return json.dumps(info, indent=2)
