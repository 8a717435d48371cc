"""ONNX Runtime sessions with deliberate options (torch-free)."""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path
from typing import Any, Literal

import onnxruntime as ort

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.mapped_weights import release_mapped_weights, row_tables
from edgeattn.runtime.onnx_bytes import Malformed, file_external_tensors
from edgeattn.runtime.providers import (
    Provider,
    built_in_provider,
    built_in_providers,
    is_plugin,
    plugin_session_options,
    provider_name,
    provider_options,
    why_unavailable,
)

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
#: ONNX Runtime graph rewrites turned off on CPU-only sessions: SkipLayerNormFusion merges a
#: residual Add into the following LayerNormalization, whose CPU kernel is the slower (docs/runtime.md).
CPU_DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]


def pick_providers(requested: list[Provider] | tuple[Provider, ...] | None) -> list[Provider]:
    """Providers to use: CUDA then CPU when ``requested`` is None, else those requested that can run
    here (built into this onnxruntime, or an installed plugin with a device; see
    :mod:`edgeattn.runtime.providers`), always ending with CPU. Entries are names or (name, options)
    as ONNX Runtime takes them. Missing ones give a warning, not a crash."""
    available = built_in_providers()
    wanted: list[Provider] = (
        [CUDA, CPU]
        if requested is None
        else [
            p if isinstance(p, str) else (provider_name(p), provider_options(p))
            for p in requested  # JSON gives lists
        ]
    )
    chosen: list[Provider] = []
    for p in wanted:
        reason = why_unavailable(p) if requested is not None else None
        if requested is None and p not in available:
            log.info("no CUDA provider in this onnxruntime; running on the CPU")
        elif reason is not None:
            log.warning("%s; using the CPU", reason)
        else:
            chosen.append(p)
    if CPU not in [provider_name(p) for p in chosen]:
        chosen.append(CPU)
    return chosen


@functools.cache
def preload_cuda_libraries() -> bool:
    """Load CUDA and cuDNN from the ``nvidia-*`` Python packages (``onnxruntime.preload_dlls``,
    onnxruntime-gpu 1.21+) so a process without torch finds them; True when it ran. Skipped when
    torch is already imported (torch loads its own copies, and mixing the two can conflict)."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None or "torch" in sys.modules:
        return False
    try:
        preload()
    except Exception as exc:  # noqa: BLE001 - the session creation below reports what is missing
        log.debug("onnxruntime.preload_dlls failed: %s", exc)
        return False
    return True


#: How intra-op threads wait for work: "on" (ONNX Runtime's default: they spin, between runs too),
#: "run" (they spin while a run lasts and stop when it ends, so sessions that share cores do not
#: fight between their runs), "off" (they never spin). True and False mean "on" and "off".
#: edgeattn's default is "run": a model of several sessions, each with its pool of threads, does not
#: have the idle pools spin on the cores the running one needs (docs/runtime.md).
Spinning = Literal["on", "run", "off"]


def spin_policy(spinning: bool | str) -> str:
    """``spinning`` as one of "on", "run", "off"."""
    policy = ("on" if spinning else "off") if isinstance(spinning, bool) else spinning
    if policy not in ("on", "run", "off"):
        raise EdgeattnError(f"spinning must be 'on', 'run', 'off' or a bool, got {spinning!r}")
    return policy


#: The environment variable that sets the intra-op threads of sessions created without ``threads``
#: (a process that shares the machine with others, such as a test worker, asks for fewer).
THREADS_ENV = "EDGEATTN_THREADS"


def default_threads() -> int | None:
    """Intra-op threads for a session created without ``threads``: ``$EDGEATTN_THREADS`` when set,
    else None (ONNX Runtime decides: one per physical core)."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise EdgeattnError(f"{THREADS_ENV} must be a positive integer, got {value!r}")
    return int(value)


@functools.cache
def _vnni() -> bool:
    """Whether this CPU's int8 dot products accumulate without saturating (VNNI or AMX)."""
    from edgeattn.host import has_vnni

    return has_vnni()


def session_options(threads: int | None = None, spinning: bool | Spinning = "run") -> ort.SessionOptions:
    """Session options: all graph optimisations, ``threads`` intra-op threads (None:
    :func:`default_threads`), intra-op spinning as :data:`Spinning` says."""
    threads = default_threads() if threads is None else threads
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads is not None:
        if threads < 1:
            raise EdgeattnError(f"threads must be a positive integer, got {threads}")
        opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    policy = spin_policy(spinning)
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0" if policy == "off" else "1")
    if policy == "run":
        opts.add_session_config_entry("session.force_spinning_stop", "1")
    # int8 products with signed weights beyond 7 bits saturate in the u8 x s8 kernels of a CPU
    # without VNNI/AMX (AVX2, AVX-512 without VNNI): ONNX Runtime then makes those weights unsigned
    # (the same products, no saturation). With VNNI or AMX nothing saturates and the outputs are
    # the same without it, and it would only slow dynamic int8 (docs/precisions.md)
    if not _vnni():
        opts.add_session_config_entry("session.x64quantprecision", "1")
    opts.log_severity_level = 3
    return opts


def create_session(
    path: str | Path | bytes,
    providers: list[Provider] | tuple[Provider, ...] | None = (CPU,),
    threads: int | None = None,
    spinning: bool | Spinning = "run",
    optimized_cache: str | Path | None = None,
    tf32: bool = False,
    cuda_graph: bool = False,
    require: bool = False,
    fixed_dims: dict[str, int] | None = None,
    initializers: dict[str, ort.OrtValue] | None = None,
    memory_arena: bool = True,
    prepacking: bool = True,
) -> ort.InferenceSession:
    """An inference session for one ONNX file, or for a serialised graph held in memory (``bytes``).

    With ``optimized_cache`` (a file path; the CPU and CUDA providers only), the optimised graph is
    saved there on first load and loaded from there afterwards, skipping the optimisation passes. The CUDA provider runs
    float32 matrix products in full float32 unless ``tf32`` (faster, about 1e-3 relative error).
    ``cuda_graph`` turns on the CUDA provider's graph capture: the session must then always be
    run through IO binding with the same device buffers (one input shape per session). With
    ``require``, a session that ONNX Runtime built without a requested provider (its CPU fallback
    when CUDA libraries are missing) is an error instead of a warning. ``fixed_dims`` pins named
    dynamic axes (``{"batch": 8, "src_len": 128}``), so that ONNX Runtime folds the shape
    arithmetic away: a graph capture needs every node on the CUDA provider, and the provider
    leaves shape computations on the CPU. ``initializers`` replace the graph's weights of those
    names (each one the graph has) with values the caller keeps alive (weights shared between
    sessions). Without ``memory_arena`` the CPU provider allocates each
    intermediate tensor on its own instead of growing an arena (a lower peak, a little slower).
    Without ``prepacking`` the CPU provider multiplies by float32 weights as the file holds them
    (mapped: the system's pages, shared and droppable) instead of repacking each into memory of
    its own at load, and constants are not folded (a weight the graph transposes is multiplied
    transposed where it lies, not copied): a float32 graph then costs about its weights' size less
    memory, and its products run slower. ``threads`` None is :func:`default_threads`.
    """
    threads = default_threads() if threads is None else threads
    if require:
        for p in providers or []:
            reason = why_unavailable(p)
            if reason is not None:
                raise EdgeattnError(reason)
    picked = pick_providers(providers)
    names = [provider_name(p) for p in picked]
    compiling = [n for n in names if n not in (CPU, CUDA)]
    if optimized_cache is not None and compiling:
        raise EdgeattnError(f"optimized_cache saves ONNX Runtime's optimised graph, which {compiling[0]} compiles "
                            f"into its own: leave optimized_cache out with {compiling[0]}")  # fmt: skip
    cuda_options = {"use_tf32": "1" if tf32 else "0", **({"enable_cuda_graph": "1"} if cuda_graph else {})}
    plugins = [p for p in picked if is_plugin(provider_name(p))]
    chosen: list[str | tuple[str, dict[str, Any]]] = [
        (provider_name(p), {**cuda_options, **provider_options(p)}) if provider_name(p) == CUDA
        else built_in_provider(p, threads)
        for p in picked
        if p not in plugins
    ]  # fmt: skip
    if plugins and [c for c in chosen if provider_name(c) != CPU]:
        raise EdgeattnError(f"a plugin provider ({provider_name(plugins[0])}) runs with the CPU provider "
                            f"behind it, not beside {provider_name(chosen[0])}")  # fmt: skip
    if CUDA in names:
        preload_cuda_libraries()
    source: str | bytes = path if isinstance(path, bytes) else str(path)
    name = "a graph in memory" if isinstance(path, bytes) else str(path)
    opts = session_options(threads, spinning)
    opts.enable_cpu_mem_arena = memory_arena
    if not prepacking:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    for axis, size in (fixed_dims or {}).items():
        opts.add_free_dimension_override_by_name(axis, size)
    for weight, value in (initializers or {}).items():
        opts.add_initializer(weight, value)
    if optimized_cache is not None:
        cache = Path(optimized_cache)
        if cache.is_file():
            source = str(cache)
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        else:
            opts.optimized_model_filepath = str(cache)
            # weights a graph keeps in the export's checkpoint go beside the cached graph, so the cache
            # stands alone (its external-data paths are relative to its own folder)
            opts.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                          cache.name + ".data")  # fmt: skip
            opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    for plugin in plugins:
        plugin_session_options(opts, plugin, threads)
    disabled = [] if CUDA in names else CPU_DISABLED_OPTIMIZERS
    if not prepacking:  # folding a Transpose of a mapped weight would copy it into memory of the process's own
        disabled = [*disabled, "ConstantFolding"]
    try:
        session = ort.InferenceSession(source, sess_options=opts, providers=None if plugins else chosen,
                                       disabled_optimizers=disabled)  # fmt: skip
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise EdgeattnError(f"onnxruntime cannot load {name}: {exc}") from exc
    asked = [provider_name(p) for p in providers or []]
    missing = [p for p in asked if p not in session.get_providers()] if require else []
    if missing:
        raise EdgeattnError(f"onnxruntime did not register {', '.join(missing)} for {Path(name).name}")
    release_free_memory()
    if not isinstance(source, bytes):
        release_mapped_weights(external_data_files(source), row_tables(source))
    return session


def external_data_files(graph: str | Path) -> list[Path]:
    """The data files an ONNX graph's external tensors are in (none for a file that is not an ONNX
    protobuf, such as ONNX Runtime's own format)."""
    folder = Path(graph).parent
    try:
        tensors = file_external_tensors(graph)
    except (Malformed, OSError):
        return []
    return sorted({folder / t.pairs["location"] for t in tensors if t.pairs.get("location")})


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None where the C library is not glibc."""
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc; nothing elsewhere).

    Building a session reads each weight, folds its transposes and packs it: tens of MB of
    short-lived buffers whose freed pages glibc keeps in its heap, still resident, after the
    session holds only the packed weights (measured here on a t5-small-shaped export: 13 MB
    after the encoder's session, 20 MB after the decoder's)."""
    if sys.platform.startswith("linux") and (trim := _malloc_trim()) is not None:
        trim(0)
