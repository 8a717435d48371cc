"""Which execution provider runs each graph of an export when the caller names none.

The rule, each step measured on this project's machines (docs/runtime.md, "Engines the runtime chooses"):

0. A precision its engine brings (bf16: the fp32 graphs, which OpenVINO runs in bfloat16) runs on
   that engine, every graph; where the engine cannot run, loading it is an error that says why.
1. CUDA wherever this onnxruntime has it, with the CPU provider behind it.
2. Else OpenVINO, where it runs here (:func:`edgeattn.runtime.providers.openvino_usable`), for the
   graphs whose family role allows it (``GraphRole.openvino``: encoder and attention graphs) in an
   export that does not generate, when their operators are all
   standard ONNX, at float32 inference precision. On the reference encoder (AVX-512 EPYC, 2
   threads, 1x16 to 8x512) it ran the fp32 graph 0.96-1.45x as fast as ONNX Runtime's CPU
   provider (level up to 1x128, faster beyond), within 3e-6, and the plain int8-static graph
   0.97-1.58x as fast as the CPU provider ran the fused one, at the same worst-token cosine to
   float32 (0.99987-0.99989).
   Not chosen for a graph with ONNX Runtime's own operators (fp32-opt, int8, int4, int8-static made
   from the fused form): OpenVINO would run it in pieces, with those operators on the CPU provider
   between them. Not chosen for an export with decoders: generation's time goes to the decoder
   steps, where OpenVINO measured no faster (a T5-small-shaped model generated at the same speed
   with its encoder graphs on OpenVINO), and each graph OpenVINO compiles adds 0.5-1 s to loading.
3. Else ONNX Runtime's CPU provider.

Each choice carries its reason, which the runtime logs and keeps (``ExportedModel.engines``).
Torch-free.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from edgeattn.errors import EdgeattnError
from edgeattn.host import has_bf16
from edgeattn.runtime.families import GraphRole
from edgeattn.runtime.onnx_bytes import STANDARD_DOMAIN, Malformed, operator_domains
from edgeattn.runtime.precisions import FP32, PRECISIONS, Precision
from edgeattn.runtime.providers import (
    OPENVINO,
    Provider,
    openvino_usable,
    provider_name,
    provider_options,
    why_unavailable,
)
from edgeattn.runtime.session import CPU, CUDA

#: OpenVINO's options when the runtime chooses it: float32 arithmetic, as the graph asks (OpenVINO
#: would otherwise run bfloat16 on CPUs with AMX).
OPENVINO_AUTO: Provider = (OPENVINO, {"precision_hint": "f32"})


@dataclass(frozen=True)
class EngineChoice:
    """The providers one graph runs on, and why."""

    providers: tuple[Provider, ...]
    reason: str
    #: True when the caller named the providers, False when :func:`choose_engine` chose them
    requested: bool = False

    @property
    def name(self) -> str:
        """The first provider's name, with its options (``OpenVINOExecutionProvider (precision_hint=f32)``)."""
        first = self.providers[0]
        options = ", ".join(f"{k}={v}" for k, v in provider_options(first).items())
        return provider_name(first) + (f" ({options})" if options else "")

    def describe(self) -> str:
        return f"{self.name}: {self.reason}"


def standard_only(path: Path) -> bool:
    """Whether every node of the ONNX graph at ``path`` is a standard ONNX operator."""
    error = None
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                domains = operator_domains(data)
            except Malformed as exc:  # its traceback holds views of the map: leave the block first
                error = str(exc)
    except (OSError, ValueError) as exc:
        error = str(exc)
    if error is not None:
        raise EdgeattnError(f"{path} is not a readable ONNX graph: {error}")
    return domains <= {STANDARD_DOMAIN}


def engine_unavailable(precision: Precision) -> str | None:
    """Why the engine of an "engine" precision (bf16: OpenVINO) cannot run here; None when it can."""
    return None if precision.engine is None else why_unavailable(precision.engine)


def engine_emulated(precision: Precision) -> str | None:
    """Why the engine would run ``precision`` at float32 here instead (bf16 on a CPU without
    bfloat16 instructions); None when it runs it as asked."""
    hint = dict(precision.engine_options).get("precision_hint")
    if hint == "bf16" and not has_bf16():
        return "this CPU has no bfloat16 instructions (AVX-512 BF16 or AMX): OpenVINO runs the graphs in float32"
    return None


def choose_engine(
    role: GraphRole | None, path: Path, generates: bool = False, ort_cache: bool = False, precision: str = FP32
) -> EngineChoice:
    """The providers a graph of an export (its family ``role``, None for a graph this version has no
    role for; its ONNX file at ``path``), at ``precision``, runs on when the caller names none (see
    the module's rule): OpenVINO only for roles that allow it, in an export that does not generate
    (``generates``: it holds every graph its family generates through). ``ort_cache``: the caller
    keeps ONNX Runtime's optimised graphs, which a graph OpenVINO compiled cannot be saved as. A
    precision made for an engine of its own (bf16) runs there, and
    where that engine cannot run, EdgeattnError says why."""
    record = PRECISIONS.get(precision)  # None: a precision a newer edgeattn wrote
    if record is not None and record.engine_provider is not None:
        problem = engine_unavailable(record)
        if problem is not None:
            raise EdgeattnError(f"the {precision} graphs are {record.summary}, and cannot run here: {problem}")
        return EngineChoice((record.engine_provider, CPU), f"{precision} is {record.summary}")
    if CUDA in ort.get_available_providers():
        return EngineChoice((CUDA, CPU), "this onnxruntime has the CUDA provider")
    cpu = (CPU,)
    # the reasons that need no OpenVINO first: asking whether it runs loads its plugin (7 MB resident)
    if role is None:
        return EngineChoice(cpu, "a graph this edgeattn has no role for: it runs where every graph can")
    if generates:
        return EngineChoice(cpu, "generation spends its time in decoder steps, which OpenVINO runs no faster, "
                                 "and each graph OpenVINO compiles adds 0.5-1 s to loading")  # fmt: skip
    if not role.openvino:
        return EngineChoice(cpu, f"OpenVINO is not measured on the {role.name} graph: the CPU provider runs it")
    if ort_cache:
        return EngineChoice(cpu, "optimized_cache keeps ONNX Runtime's optimised graphs; OpenVINO compiles its own")
    if not openvino_usable():
        return EngineChoice(cpu, "OpenVINO does not run here (onnxruntime-openvino runs it on any x86-64 CPU)")
    if not standard_only(path):
        return EngineChoice(
            cpu,
            "holds ONNX Runtime's own operators, which OpenVINO would hand back to the "
            "CPU provider (for OpenVINO: fp32, or int8-static exported with --static-form plain)",
        )
    return EngineChoice((OPENVINO_AUTO, CPU), "OpenVINO runs all of its operators (float32 precision)")
