"""Which optional install (``pip install 'edgeattn[NAME]'``) brings the packages a command needs.

``pip install edgeattn`` is the embedded runtime alone (numpy, onnxruntime, click); the exporter's
packages come with the ``export`` extra. Torch-free: it only asks whether a package is installed.
"""

from __future__ import annotations

import importlib.util

from edgeattn.errors import EdgeattnError

#: extra -> the import names of the packages it installs that edgeattn's code needs
EXTRAS: dict[str, tuple[str, ...]] = {
    "export": ("torch", "onnx", "onnxscript", "safetensors", "tqdm"),
    "text": ("tokenizers",),
    "batch": ("pyarrow", "tqdm"),
    "ray": ("ray", "starlette", "aiohttp", "pyarrow", "tqdm"),
}


class MissingExtraError(EdgeattnError):
    """A command needs packages of an optional install that this environment lacks."""


def missing_modules(extra: str, modules: tuple[str, ...] = ()) -> list[str]:
    """The packages of ``extra`` (or just ``modules`` of it) that cannot be imported here."""
    return [name for name in modules or EXTRAS[extra] if importlib.util.find_spec(name) is None]


def require_extra(extra: str, what: str, modules: tuple[str, ...] = ()) -> None:
    """Raise MissingExtraError naming the extra to install when ``what``, which needs the packages
    of ``extra`` (or ``modules`` of them), cannot run here."""
    missing = missing_modules(extra, modules)
    if missing:
        raise MissingExtraError(
            f"{what} needs the {extra!r} extra, which this install lacks ({', '.join(missing)} not found): "
            f"pip install 'edgeattn[{extra}]'"
        )
