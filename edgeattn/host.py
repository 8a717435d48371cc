"""What the exporters and the benchmark both ask of this machine and its libraries: the CPU and its
instruction sets, the int8 weight forms its kernels take without saturating, and ONNX Runtime's
quantisation tools kept quiet. Torch-free; imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import logging
import platform
from collections.abc import Iterator

#: Instruction-set extensions that matter for transformer kernels.
INSTRUCTION_SETS = (
    "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "fma",
)  # fmt: skip
#: Any of these gives int8 dot products that accumulate without saturating.
VNNI_SETS = ("avx512_vnni", "avx_vnni", "amx_int8")


def cpu_model() -> str:
    """The CPU's model name."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The :data:`INSTRUCTION_SETS` this CPU has."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [w for w in INSTRUCTION_SETS if w in have]
    except OSError:
        pass
    return []


def has_vnni(flags: list[str] | None = None) -> bool:
    """Whether the CPU (or ``flags``) has VNNI or AMX int8 instructions."""
    return any(f in (cpu_flags() if flags is None else flags) for f in VNNI_SETS)


#: Instruction sets that multiply bfloat16 natively (elsewhere bf16 is emulated in float32, slower).
BF16_SETS = ("amx_bf16", "avx512_bf16")


def has_bf16(flags: list[str] | None = None) -> bool:
    """Whether the CPU (or ``flags``) multiplies bfloat16 natively (AMX or AVX-512 BF16)."""
    return any(f in (cpu_flags() if flags is None else flags) for f in BF16_SETS)


def dynamic_int8_weights(flags: list[str] | None = None) -> str:
    """The weight type of dynamic int8 on this CPU: ``int8`` (full range) where it has VNNI/AMX;
    else ``uint8`` (full range), whose u8 x u8 kernels widen before they add and so never saturate.
    Signed 7-bit weights would avoid the saturation too, about 20% faster on an AVX2 CPU, but with
    twice the error against float32 (BERT-base: 1 - cosine of the hidden states 7.2e-4 against
    3.2e-4; Hugging Face Optimum's AVX2 configuration, also u8 x u8, 3.5e-4)."""
    return "int8" if has_vnni(flags) else "uint8"


@contextlib.contextmanager
def quiet_quantization() -> Iterator[None]:
    """onnxruntime.quantization logs advice on the root logger (and some of its modules call
    ``logging.basicConfig`` on import); hold it back while it runs."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)
        for handler in root.handlers[:]:
            if handler not in handlers:  # handlers a module's logging.basicConfig() added meanwhile
                root.removeHandler(handler)


@contextlib.contextmanager
def loggers_at(names: tuple[str, ...], level: int) -> Iterator[None]:
    """The loggers ``names`` held at ``level`` at least while the block runs (a tool's chatter kept
    back), then as they were."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), level))
    try:
        yield
    finally:
        for lg, before in zip(loggers, levels, strict=True):
            lg.setLevel(before)


def release_freed_memory() -> None:
    """Hand the memory Python and the libraries have freed back to the system: a collection of
    cycles, then glibc's ``malloc_trim`` (a no-op elsewhere). Freed blocks below glibc's mapping
    threshold stay in the process's heap otherwise, and the threshold rises with every large block
    freed: an export's phases (a float64 copy of the model, serialised graphs) would each leave
    their peak resident for the rest of the process."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    if platform.system() != "Linux" or not name:
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        pass
