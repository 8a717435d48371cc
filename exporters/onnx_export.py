"""One graph from PyTorch to a checked ONNX file with dynamic batch and sequence axes.

Exporter choice: opsets up to 20 use torch.onnx's TorchScript exporter (``dynamo=False`` with
``dynamic_axes``): on this project's encoders it gives graphs that ONNX Runtime's transformer
optimizer fuses (the dynamo exporter's default onnxscript rewrites defeat the attention fusion),
it exports in a fraction of the time, and it writes opset 17 directly. Opsets above 20, which
the TorchScript exporter cannot write, use the dynamo exporter (``dynamo=True``). Both outputs
go through the same checks: ``onnx.checker`` (full), strict shape inference, and a comparison
of every input and output axis against the graph's spec, so a sequence length baked in at
trace time is an export error, not a silent surprise.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch

from edgeattn import __version__
from edgeattn.config import ModelConfig
from edgeattn.errors import ExportError
from edgeattn.exporters.cache_writes import check_cache_writes
from edgeattn.exporters.compact import CheckpointIndex, CheckpointParts, copy_regions, share_weights
from edgeattn.exporters.external_data import DataSink, point_at, write_external_data
from edgeattn.exporters.graphs import graph_module
from edgeattn.exporters.sampling import sample_inputs
from edgeattn.host import loggers_at
from edgeattn.model import TransformerModel
from edgeattn.runtime.families import family_of, resolve
from edgeattn.runtime.layout import external_data_file
from edgeattn.runtime.manifest import (
    FORMAT_VERSION,
    META_CONFIG,
    META_FORMAT,
    META_GRAPH,
    META_PRECISION,
    META_SPEC,
    META_VERSION,
)
from edgeattn.runtime.precisions import FP32, FUSED_SOURCE
from edgeattn.runtime.specs import EXPORT_SIZES, GraphSpec, TensorSpec

log = logging.getLogger(__name__)

DEFAULT_OPSET = 17
MIN_OPSET = 14
TORCHSCRIPT_MAX_OPSET = 20
#: Graphs with more weight bytes than this keep them in external data (protobuf stops at 2 GiB).
PROTOBUF_LIMIT = 1_900_000_000

#: ONNX element types of graph inputs and outputs, by the names specs use
ELEMENT_TYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.INT8: "int8",
}


def max_opset() -> int:
    """The highest ai.onnx opset this installation can write."""
    return min(onnx.defs.onnx_opset_version(), max(TORCHSCRIPT_MAX_OPSET, _dynamo_max_opset()))


def _dynamo_max_opset() -> int:
    try:
        from torch.onnx._constants import ONNX_MAX_OPSET

        return int(ONNX_MAX_OPSET)
    except (ImportError, AttributeError):  # pragma: no cover - older torch
        return TORCHSCRIPT_MAX_OPSET


def check_opset(opset: int) -> None:
    """Refuse an opset the installed torch and onnx cannot produce."""
    top = max_opset()
    if not MIN_OPSET <= opset <= top:
        raise ExportError(
            f"opset {opset} cannot be produced here: this torch {torch.__version__} / onnx {onnx.__version__} "
            f"write opsets {MIN_OPSET} to {top}"
        )


def _torch_export(
    module: torch.nn.Module, args: tuple[torch.Tensor, ...], spec: GraphSpec, path: Path, opset: int, fused: bool
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if opset <= TORCHSCRIPT_MAX_OPSET or fused:
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=False,
                opset_version=min(opset, TORCHSCRIPT_MAX_OPSET),
                input_names=spec.input_names,
                output_names=spec.output_names,
                dynamic_axes=spec.dynamic_axes(),
                do_constant_folding=True,
                custom_opsets={"com.microsoft": 1} if fused else None,
            )
        else:
            program = torch.onnx.export(
                module,
                args,
                dynamo=True,
                opset_version=opset,
                input_names=spec.input_names,
                output_names=spec.output_names,
                dynamic_shapes=_dynamic_shapes(module, spec),
                optimize=False,
                verbose=False,
            )
            program.save(str(path), external_data=False)


def _dynamic_shapes(module: torch.nn.Module, spec: GraphSpec) -> dict[str, object]:
    """torch.export dynamic shapes keyed by forward()'s parameters, one shared Dim per axis name
    (trailing ``*caches`` take a tuple)."""
    import inspect

    dims: dict[str, object] = {}

    def dim(axis: str) -> object:
        if axis not in dims:
            dims[axis] = torch.export.Dim.DYNAMIC
        return dims[axis]

    shapes = [{i: dim(a) for i, a in t.dynamic.items()} for t in spec.inputs]
    params = list(inspect.signature(module.forward).parameters.values())
    out: dict[str, object] = {}
    for i, p in enumerate(params):
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            out[p.name] = tuple(shapes[i:])
            break
        if i == len(shapes):  # optional parameters the spec does not feed (token types of a model without them)
            break
        out[p.name] = shapes[i]
    return out


def _axes(value_info: onnx.ValueInfoProto) -> tuple[str | int, ...]:
    dims = value_info.type.tensor_type.shape.dim
    return tuple(
        d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else "?") for d in dims
    )


def check_against_spec(model: onnx.ModelProto, spec: GraphSpec) -> None:
    """Every input and output has the spec's name, dtype and rank; named axes stay symbolic."""
    for kind, actual, expected in (
        ("input", list(model.graph.input), spec.inputs),
        ("output", list(model.graph.output), spec.outputs),
    ):
        names = [v.name for v in actual]
        if names != [t.name for t in expected]:
            raise ExportError(f"graph {spec.name!r}: {kind}s are {names}, the spec says {[t.name for t in expected]}")
        for v, t in zip(actual, expected, strict=True):
            _check_value(spec.name, kind, v, t)


def _check_value(graph: str, kind: str, v: onnx.ValueInfoProto, t: TensorSpec) -> None:
    dtype = ELEMENT_TYPES.get(v.type.tensor_type.elem_type, str(v.type.tensor_type.elem_type))
    if dtype != t.dtype:
        raise ExportError(f"graph {graph!r}: {kind} {t.name!r} has dtype {dtype}, the spec says {t.dtype}")
    axes = _axes(v)
    if len(axes) != len(t.axes):
        raise ExportError(f"graph {graph!r}: {kind} {t.name!r} has rank {len(axes)}, the spec says {len(t.axes)}")
    for i, (got, want) in enumerate(zip(axes, t.axes, strict=True)):
        if isinstance(want, str) and not isinstance(got, str):
            raise ExportError(
                f"graph {graph!r}: {kind} {t.name!r} axis {i} ({want}) was fixed to {got} at export; "
                "it must stay dynamic"
            )
        if isinstance(want, int) and got != want:
            raise ExportError(f"graph {graph!r}: {kind} {t.name!r} axis {i} is {got}, the spec says {want}")


def _rename_dims(model: onnx.ModelProto, spec: GraphSpec) -> None:
    """Give every symbolic input/output axis the spec's name or size (exporters invent names such as
    ``LayerNormalization_dim_2`` where they could not infer an output size)."""
    for values, tensors in ((model.graph.input, spec.inputs), (model.graph.output, spec.outputs)):
        for v, t in zip(values, tensors, strict=False):
            for d, want in zip(v.type.tensor_type.shape.dim, t.axes, strict=False):
                if d.HasField("dim_value"):
                    continue
                if isinstance(want, str):
                    d.dim_param = want
                else:
                    d.dim_value = want


def export_graph(
    model: TransformerModel,
    name: str,
    path: str | Path,
    opset: int = DEFAULT_OPSET,
    external_threshold: int = PROTOBUF_LIMIT,
    seed: int = 0,
    fused: bool = False,
    checkpoint: CheckpointIndex | None = None,
) -> GraphSpec:
    """Export graph ``name`` of ``model`` to ``path`` and check it; returns the graph's spec.

    The file carries the config, graph role, precision and edgeattn version in its
    ``metadata_props``. Graphs whose weights exceed ``external_threshold`` bytes keep them in
    ``<file>.data`` beside the graph. ``fused`` marks a model whose attention kernels export as
    ONNX Runtime contrib operators (TorchScript exporter, opset at most 20). ``checkpoint``: the
    model's saved weights beside ``path``, which the graph points at rather than holding its
    weights again where they are the checkpoint's tensors (as stored, or transposed); a traced
    graph's weights are never loaded whole.
    """
    check_opset(opset)
    path = Path(path)
    role = family_of(model.config).role(name)
    if role.builder is not None:  # written from the weights, not traced
        # weights outside the graph where the role keeps them so: written as they are made, and
        # checked without a copy in memory
        data = path.with_name(external_data_file(path.name)) if role.external_weights else None
        proto, spec = written_graph(model, name, fused, data, checkpoint)
        save_checked(proto, path, 0 if role.external_weights else external_threshold)
        return spec
    module, spec = graph_module(name, model)
    feeds = sample_inputs(spec, model.config, {**EXPORT_SIZES, "total_len": 0}, np.random.default_rng(seed))
    args = tuple(torch.from_numpy(feeds[n]) for n in spec.input_names)
    with tempfile.TemporaryDirectory(prefix="edgeattn-trace-") as scratch:
        raw = Path(scratch) / path.name
        try:
            with torch.no_grad(), _quiet_torch_onnx():
                _torch_export(module, args, spec, raw, opset, fused)
        except Exception as exc:
            raise ExportError(f"torch.onnx could not export graph {name!r} at opset {opset}: {exc}") from exc
        # torch's own data files (a graph over 2 GB) stay where it wrote them: each weight the
        # checkpoint beside ``path`` holds is pointed at there, the rest copied a region at a time
        proto = onnx.load(str(raw), load_external_data=False)
        _with_lengths(proto, Path(scratch))
        finalize(proto, model.config, spec, FUSED_SOURCE if fused else FP32)
        if checkpoint is not None and checkpoint.path.parent.resolve() == path.parent.resolve():
            share_weights(proto, checkpoint, Path(scratch))
        written = [f for f in Path(scratch).iterdir() if f != raw]
        data_name = external_data_file(path.name)
        copy_regions(proto, written, path.with_name(data_name), data_name)
    save_checked(proto, path, external_threshold)
    return spec


def _with_lengths(proto: onnx.ModelProto, folder: Path) -> None:
    """Give each external initializer that points at a whole file (torch writes a file a weight,
    without offset or length) its offset and length."""
    for tensor in proto.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        if "length" in info:
            continue
        offset = int(info.get("offset", 0))
        point_at(tensor, info["location"], offset, (folder / info["location"]).stat().st_size - offset)


def written_graph(model: TransformerModel, name: str, fused: bool = False, data: Path | None = None,
                  checkpoint: CheckpointIndex | None = None) -> tuple[onnx.ModelProto, GraphSpec]:  # fmt: skip
    """Graph ``name`` as its role's ``builder`` writes it from the weights (``fused``: with ONNX
    Runtime's fused operators), stamped, and its spec; ``data``: the external data file its weights
    are written to as they are made (the graph then only points at them); ``checkpoint``: the
    model's saved weights in the same folder, pointed at for the weights that are its tensors."""
    role = family_of(model.config).role(name)
    assert role.builder is not None, f"{name} is traced, not written"
    spec = role.spec(model.config)
    if data is None:
        proto = resolve(role.builder)(model, spec, fused=fused)
    else:
        beside = checkpoint is not None and checkpoint.path.parent.resolve() == data.parent.resolve()
        sink = DataSink(data, CheckpointParts(checkpoint, model) if beside else None)
        try:
            proto = resolve(role.builder)(model, spec, fused=fused, data=sink)
        finally:
            sink.close()
    finalize(proto, model.config, spec, FUSED_SOURCE if fused else FP32)
    return proto, spec


def finalize(proto: onnx.ModelProto, config: ModelConfig, spec: GraphSpec, precision: str) -> None:
    """Name the axes as the spec does, check the inputs and outputs against it, and stamp the
    edgeattn metadata (config, graph role, precision, versions) into ``metadata_props``."""
    _rename_dims(proto, spec)
    check_against_spec(proto, spec)
    role = family_of(config).graphs.get(spec.name)
    if role is not None and role.in_place:
        check_cache_writes(proto, spec)
    proto.producer_name = "edgeattn"
    proto.producer_version = __version__
    proto.doc_string = spec.description
    meta = {
        META_CONFIG: config.to_json(),
        META_GRAPH: spec.name,
        META_PRECISION: precision,
        META_VERSION: __version__,
        META_FORMAT: str(FORMAT_VERSION),
        META_SPEC: json.dumps(spec.to_dict(), sort_keys=True),
    }
    del proto.metadata_props[:]
    for key, value in meta.items():
        proto.metadata_props.add(key=key, value=value)


def _quiet_torch_onnx() -> contextlib.AbstractContextManager[None]:
    """Silence torch.onnx's own warnings (deprecation notices, missing torchvision)."""
    return loggers_at(("torch.onnx", "torch.export", "torch._export", "torch.fx"), logging.ERROR)


def save_checked(proto: onnx.ModelProto, path: Path, external_threshold: int = PROTOBUF_LIMIT) -> list[Path]:
    """Save a graph (weights external above the threshold, laid out for mapping:
    :func:`~edgeattn.exporters.external_data.write_external_data`), then run the full checker and
    strict shape inference on the saved file. Returns the files written."""
    weight_bytes = sum(len(t.raw_data) for t in proto.graph.initializer)
    external = weight_bytes > external_threshold
    data_name = external_data_file(path.name)
    if external:  # (added to the data file where the graph was written into it as it was made)
        write_external_data(proto, path, data_name)
    else:
        onnx.save_model(proto, str(path))
    try:
        onnx.checker.check_model(str(path), full_check=True)
        onnx.shape_inference.infer_shapes_path(str(path), str(path) + ".inferred", strict_mode=True)
    except Exception as exc:
        raise ExportError(f"{path.name} failed onnx.checker / shape inference: {exc}") from exc
    finally:
        Path(str(path) + ".inferred").unlink(missing_ok=True)
        for leftover in path.parent.glob(path.name + ".inferred*"):
            leftover.unlink()
    files = [path]
    if external or path.with_name(data_name).is_file():
        files.append(path.with_name(data_name))
    log.info("wrote %s (%s)", path.name, "external data" if external else "single file")
    return files
