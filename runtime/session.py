"""ONNX Runtime sessions with deliberate options (torch-free)."""

from __future__ import annotations

import logging
from pathlib import Path

import onnxruntime as ort

from edgeattn.errors import EdgeattnError

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


def pick_providers(requested: list[str] | tuple[str, ...] | None) -> list[str]:
    """Providers to use: CUDA then CPU when ``requested`` is None, else those requested that this
    onnxruntime build has, always ending with CPU. Missing ones give a warning, not a crash."""
    available = ort.get_available_providers()
    wanted = [CUDA, CPU] if requested is None else list(requested)
    chosen = []
    for p in wanted:
        if p in available:
            chosen.append(p)
        elif requested is not None:
            log.warning("provider %s is not available in this onnxruntime (%s); falling back", p, ", ".join(available))
    if CPU not in chosen:
        chosen.append(CPU)
    return chosen


def session_options(
    threads: int | None = None, spinning: bool = True, optimized_path: str | None = None
) -> ort.SessionOptions:
    """Session options: all graph optimisations, ``threads`` intra-op threads (None: ORT decides),
    intra-op spinning on or off, and optionally where to save the optimised graph."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads is not None:
        if threads < 1:
            raise EdgeattnError(f"threads must be a positive integer, got {threads}")
        opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if optimized_path:
        opts.optimized_model_filepath = optimized_path
    opts.log_severity_level = 3
    return opts


def create_session(
    path: str | Path,
    providers: list[str] | tuple[str, ...] | None = (CPU,),
    threads: int | None = None,
    spinning: bool = True,
) -> ort.InferenceSession:
    """An inference session for one ONNX file."""
    try:
        return ort.InferenceSession(
            str(path), sess_options=session_options(threads, spinning), providers=pick_providers(providers)
        )
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise EdgeattnError(f"onnxruntime cannot load {path}: {exc}") from exc
