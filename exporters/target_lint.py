"""Whether a target's ONNX Runtime can run a graph, read node by node before anything is written:
each node's operator must have a schema in the target's release at the graph's opset, no more
inputs than that schema takes, and a CPU kernel for its opset and the element types its inputs
carry (the kernel table of :mod:`edgeattn.exporters.kernel_table`). Element types come from the
graph's inputs and initializers, ONNX's shape inference, and the target's own schemas for
operators ONNX does not know (ONNX Runtime's contrib operators). Torch-free (onnx).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import TensorProto

from edgeattn.exporters.kernel_table import read_table


@dataclass(frozen=True)
class Finding:
    """A node the target cannot run, and why."""

    node: str
    op: str
    reason: str

    def __str__(self) -> str:
        return f"{self.node} ({self.op}): {self.reason}"


def _tensor_type(elem_type: int) -> str:
    return f"tensor({onnx.helper.tensor_dtype_to_string(elem_type).removeprefix('TensorProto.').lower()})"


def _known_types(model: onnx.ModelProto) -> dict[str, str]:
    """Element types of every tensor ONNX's shape inference can name (``tensor(float)``, ...)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - the lint still has inputs, initializers and the schemas
        inferred = model
    graph = inferred.graph
    types = {t.name: _tensor_type(t.data_type) for t in graph.initializer}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type != TensorProto.UNDEFINED:
            types[value.name] = _tensor_type(value.type.tensor_type.elem_type)
    return types


def _schema(table: dict[str, Any], key: str, opset: int) -> dict[str, Any] | None:
    """The schema in force at ``opset``: the latest one since that version or before."""
    found = [s for s in table["schemas"].get(key, []) if s["since"] <= opset]
    return found[-1] if found else None


def _bind(schema: dict[str, Any], node: onnx.NodeProto, types: dict[str, str]) -> dict[str, str]:
    """{type parameter: element type} as the node's inputs fix them."""
    bound: dict[str, str] = {}
    formal = schema["inputs"]
    for i, name in enumerate(node.input):
        if not name or name not in types or not formal:
            continue
        type_str, option = formal[min(i, len(formal) - 1)]
        if i >= len(formal) and option != "Variadic":
            continue
        if type_str in schema["constraints"]:
            bound.setdefault(type_str, types[name])
    return bound


def _resolved_at_load(node: onnx.NodeProto, domain: str, opset: int) -> bool:
    """Whether ONNX Runtime runs ``node`` without a kernel of its own: a Constant (made an
    initializer when the graph loads), or an ONNX operator defined as a function of others (its
    body inlined)."""
    if domain != "ai.onnx":
        return False
    if node.op_type == "Constant":
        return True
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def lint(model: onnx.ModelProto, table: dict[str, Any] | None = None) -> list[Finding]:
    """The nodes of ``model`` the table's ONNX Runtime cannot run (none: it can)."""
    table = table or read_table()
    release = f"ONNX Runtime {table['onnxruntime']}"
    opsets = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    types = _known_types(model)
    findings = []
    for node in model.graph.node:
        domain = node.domain or "ai.onnx"
        key, name = f"{domain}::{node.op_type}", node.name or node.output[0]
        opset = opsets.get(domain)
        if opset is None:
            findings.append(Finding(name, key, f"the graph imports no opset of the domain {domain}"))
            continue
        schema = _schema(table, key, opset)
        if schema is None:
            if not _resolved_at_load(node, domain, opset):
                findings.append(Finding(name, key, f"{release} has no CPU kernel for this operator at opset {opset}"))
            continue
        count = len(node.input)
        if count > schema["max_inputs"] or count < schema["min_inputs"]:
            findings.append(Finding(name, key, f"{count} inputs; {release}'s schema (since opset {schema['since']}) "
                                    f"takes {schema['min_inputs']} to {schema['max_inputs']}"))  # fmt: skip
            continue
        bound = _bind(schema, node, types)
        kernels = [k for k in table["kernels"][key] if k[0] <= schema["since"] <= k[1]]
        if not kernels:
            findings.append(Finding(name, key, f"{release} has no CPU kernel of its opset {schema['since']} version"))
            continue
        if not any(all(bound.get(p, allowed[0]) in allowed for p, allowed in k[2].items()) for k in kernels):
            have = ", ".join(f"{p}={t}" for p, t in sorted(bound.items()))
            findings.append(Finding(name, key, f"{release}'s CPU kernels do not take its types ({have})"))
            continue
        for i, output in enumerate(node.output):  # what ONNX's inference could not name
            if output and output not in types and i < len(schema["outputs"]):
                type_str = schema["outputs"][i]
                resolved = bound.get(type_str, type_str if type_str.startswith("tensor(") else None)
                if resolved:
                    types[output] = resolved
    return findings


#: what onnxruntime-web 1.30's WebGPU build cannot run that its CPU kernels can, found by running
#: bundles on it (Chromium's software adapter): operators its wasm part lacks, and inputs its
#: WebGPU kernels refuse
WEBGPU_MISSING = {"com.microsoft::GatherBlockQuantized": "onnxruntime-web 1.30's WebGPU build has no kernel for it "
                  "(its plain wasm build has one)"}  # fmt: skip
WEBGPU_REFUSED_INPUTS = {("com.microsoft::MultiHeadAttention", 4): "its WebGPU kernel does not take key_padding_mask"}


def webgpu_gaps(model: onnx.ModelProto) -> list[Finding]:
    """The nodes of ``model`` onnxruntime-web 1.30's WebGPU build refuses (see :data:`WEBGPU_MISSING`)."""
    found = []
    for node in model.graph.node:
        key, name = f"{node.domain or 'ai.onnx'}::{node.op_type}", node.name or node.output[0]
        if key in WEBGPU_MISSING:
            found.append(Finding(name, key, WEBGPU_MISSING[key]))
        for (op, index), why in WEBGPU_REFUSED_INPUTS.items():
            if key == op and len(node.input) > index and node.input[index]:
                found.append(Finding(name, key, why))
    return found


def summary(findings: list[Finding], limit: int = 5) -> str:
    """The findings in a few lines: the first few, and how many of each operator in all."""
    counts = Counter(f.op for f in findings)
    lines = [str(f) for f in findings[:limit]]
    if len(findings) > limit:
        lines.append("... " + ", ".join(f"{n} x {op}" for op, n in counts.most_common()) + " in all")
    return "\n".join(lines)
