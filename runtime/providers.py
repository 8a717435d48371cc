"""Execution providers by name: those built into onnxruntime and plugin ones installed beside it.

A plugin execution provider (ONNX Runtime 1.23+) is a shared library shipped in its own package,
such as ``onnxruntime-ep-openvino``, registered with ``onnxruntime.register_execution_provider_library``
and attached to a session for the devices it offers. Installed plugin packages are found by their
distribution name (``onnxruntime-ep-*``) and the functions the packaging guidance asks for
(``get_library_path()`` and ``get_ep_name()`` / ``get_ep_names()``), so any of them is usable by
name, like a built-in provider.

OpenVINO comes either way: as the plugin ``onnxruntime-ep-openvino`` beside the stock
``onnxruntime`` (it offers Intel devices only), or built into the ``onnxruntime-openvino``
package, which replaces ``onnxruntime`` and runs on any x86-64 CPU. edgeattn takes the same
options for both (``device``, ``precision_hint``, ``num_threads``) and hands each its own form.
Torch-free.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import onnxruntime as ort

from edgeattn.errors import EdgeattnError

log = logging.getLogger(__name__)

#: A provider as ONNX Runtime takes it: a name, or (name, {option: value}).
Provider = str | tuple[str, dict[str, Any]]

OPENVINO = "OpenVINOExecutionProvider"
#: The provider option edgeattn reads itself to pick a plugin's device (CPU, GPU, NPU; default CPU).
DEVICE_OPTION = "device"


@dataclass(frozen=True)
class Plugin:
    """One installed plugin execution-provider package."""

    package: str
    version: str
    module: str
    ep_names: tuple[str, ...]
    library: Path

    @property
    def label(self) -> str:
        return f"{self.package} {self.version}"


@functools.cache
def installed_plugins() -> dict[str, Plugin]:
    """{execution provider name: the installed package that provides it}. A package that cannot be
    imported or does not say its library and names is skipped with a warning."""
    found: dict[str, Plugin] = {}
    if not hasattr(ort, "register_execution_provider_library"):
        log.info("onnxruntime %s takes no plugin execution providers (1.23 and later do)", ort.__version__)
        return found
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if not name.startswith("onnxruntime-ep-"):
            continue
        module_name = name.replace("-", "_")
        try:
            module = importlib.import_module(module_name)
            names = module.get_ep_names() if hasattr(module, "get_ep_names") else [module.get_ep_name()]
            library = Path(module.get_library_path())
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the built-in providers
            log.warning("ignoring the execution-provider package %s: %s", name, exc)
            continue
        plugin = Plugin(name, dist.version, module_name, tuple(str(n) for n in names), library)
        for ep in plugin.ep_names:
            found.setdefault(ep, plugin)
    return found


#: Execution providers this process registered from plugin packages.
_registered: set[str] = set()


def built_in_providers() -> list[str]:
    """The providers built into this onnxruntime. Once a plugin is registered, ONNX Runtime 1.32
    lists its providers (``OpenVINOExecutionProvider``, ``OpenVINOExecutionProvider.AUTO``) among
    ``get_available_providers()`` too, though a session takes them only for the plugin's devices:
    those are left out here."""
    return [p for p in ort.get_available_providers() if p.split(".")[0] not in _registered]


@functools.cache
def _register(ep_name: str) -> Plugin:
    plugin = installed_plugins()[ep_name]
    try:
        ort.register_execution_provider_library(plugin.package, str(plugin.library))
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own untyped errors
        if "already registered" not in str(exc):
            raise EdgeattnError(f"onnxruntime cannot register {ep_name} from {plugin.label}: {exc}") from exc
    _registered.update(plugin.ep_names)
    return plugin


def plugin_devices(ep_name: str, device: str = "CPU") -> list[Any]:
    """The ``OrtEpDevice`` entries of plugin provider ``ep_name`` of this device type (registering its
    library on first use); empty when the plugin offers no such device on this machine."""
    _register(ep_name)
    wanted = device.upper()
    return [d for d in ort.get_ep_devices() if d.ep_name == ep_name and d.device.type.name == wanted]


def provider_name(provider: Provider) -> str:
    return provider if isinstance(provider, str) else provider[0]


def provider_options(provider: Provider) -> dict[str, Any]:
    return {} if isinstance(provider, str) else dict(provider[1])


def is_plugin(name: str) -> bool:
    """Whether ``name`` is not built into this onnxruntime but an installed plugin provides it."""
    return name not in built_in_providers() and name in installed_plugins()


def why_unavailable(provider: Provider) -> str | None:
    """None when ``provider`` can run here; else a sentence a user can act on."""
    name = provider_name(provider)
    if name in built_in_providers():
        return None
    if name not in installed_plugins():
        built_in = ", ".join(built_in_providers())
        plugins = ", ".join(f"{ep} ({p.label})" for ep, p in sorted(installed_plugins().items())) or "none"
        return (f"{name} is not available in this onnxruntime ({built_in}) and no installed plugin package "
                f"(onnxruntime-ep-*) provides it (installed plugins: {plugins})")  # fmt: skip
    device = str(provider_options(provider).get(DEVICE_OPTION, "CPU"))
    if not plugin_devices(name, device):
        plugin = installed_plugins()[name]
        offered = sorted({d.device.type.name for d in ort.get_ep_devices() if d.ep_name == name})
        hardware = sorted({f"{d.device.type.name} ({d.device.vendor})" for d in ort.get_ep_devices()})
        advice = (" OpenVINO's plugin offers Intel devices only; on other x86-64 CPUs, replace onnxruntime with "
                  "onnxruntime-openvino, which has OpenVINO built in (pip uninstall onnxruntime && "
                  "pip install onnxruntime-openvino)" if name == OPENVINO else "")  # fmt: skip
        seen = f"it offers: {', '.join(offered) or 'none'}; onnxruntime sees {', '.join(hardware)}"
        return f"{name} ({plugin.label}) offers no {device} device on this machine ({seen}).{advice}"
    return None


def openvino_usable(device: str = "CPU") -> bool:
    """Whether OpenVINO can run here on ``device``: built into this onnxruntime, or an installed plugin
    that offers that device."""
    if OPENVINO in built_in_providers():
        return device.upper() in ("CPU", "GPU", "NPU")
    return OPENVINO in installed_plugins() and bool(plugin_devices(OPENVINO, device))


def built_in_provider(provider: Provider, threads: int | None) -> Provider:
    """``provider`` as an onnxruntime that has it built in takes it. OpenVINO's edgeattn options
    (``device``, ``precision_hint``, ``num_threads``, see :func:`openvino_options`) become its own
    ``device_type`` and ``load_config``: given as they are, onnxruntime refuses them and silently
    runs the whole graph on the CPU provider instead. Other providers are returned unchanged."""
    if provider_name(provider) != OPENVINO:
        return provider
    options = provider_options(provider)
    device = str(options.pop(DEVICE_OPTION, options.pop("device_type", "CPU")))
    return OPENVINO, {**openvino_options(options, device, threads), "device_type": device.upper()}


def plugin_session_options(opts: ort.SessionOptions, provider: Provider, threads: int | None) -> None:
    """Attach plugin provider ``provider`` to ``opts`` for its device, with its options (the CPU
    provider stays behind it for what the plugin does not take)."""
    name = provider_name(provider)
    options = provider_options(provider)
    device = str(options.pop(DEVICE_OPTION, "CPU"))
    devices = plugin_devices(name, device)
    if not devices:
        raise EdgeattnError(why_unavailable(provider) or f"{name} offers no {device} device")
    if name == OPENVINO:
        options = openvino_options(options, device, threads)
    opts.add_provider_for_devices(devices, {k: str(v) for k, v in options.items()})


#: OpenVINO settings edgeattn takes as plain provider options and moves into ``load_config``, where
#: the plugin reads them (as plain options it ignores them with a warning).
OPENVINO_CONFIG_KEYS = {"precision_hint": "INFERENCE_PRECISION_HINT", "num_threads": "INFERENCE_NUM_THREADS"}


def openvino_options(options: dict[str, Any], device: str, threads: int | None) -> dict[str, Any]:
    """OpenVINO's provider options with ``precision_hint`` (``f32``, ``bf16``, ``f16``) and the session's
    thread count moved into its ``load_config`` JSON for ``device`` (a ``load_config`` given is kept
    and added to)."""
    options = dict(options)
    config = json.loads(options.pop("load_config", "{}") or "{}")
    section = config.setdefault(device.upper(), {})
    for key, ov_key in OPENVINO_CONFIG_KEYS.items():
        if key in options:
            section[ov_key] = str(options.pop(key))
    if threads is not None and device.upper() == "CPU":
        section.setdefault("INFERENCE_NUM_THREADS", str(threads))
    if section:
        options["load_config"] = json.dumps(config)
    return options


def parse_provider_options(names: list[str], specs: list[str] | tuple[str, ...]) -> list[Provider]:
    """``names`` with their options from ``NAME:KEY=VALUE`` specs (``KEY=VALUE`` alone: the first
    name's), as ONNX Runtime takes them; a spec for a provider not named is an error."""
    options: dict[str, dict[str, str]] = {}
    for spec in specs:
        target, _, pair = spec.partition(":") if ":" in spec.split("=", 1)[0] else ("", "", spec)
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise EdgeattnError(f"provider option {spec!r} is not NAME:KEY=VALUE or KEY=VALUE")
        if not target:
            if not names:
                raise EdgeattnError(f"provider option {spec!r} needs a provider; name one with --providers")
            target = names[0]
        if target not in names:
            raise EdgeattnError(f"provider option {spec!r} is for {target}, which is not among the providers "
                                f"({', '.join(names)})")  # fmt: skip
        options.setdefault(target, {})[key] = value
    return [(n, options[n]) if n in options else n for n in names]


#: Distributions that install the ``onnxruntime`` module, each with its own built-in providers.
ONNXRUNTIME_PACKAGES = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml",
                        "onnxruntime-qnn", "ort-nightly", "ort-nightly-gpu")  # fmt: skip


def onnxruntime_package() -> str:
    """The installed distribution that provides the ``onnxruntime`` module, with its version
    (``onnxruntime-openvino 1.24.1``); ``unknown`` when none of the known ones is installed."""
    for name in ONNXRUNTIME_PACKAGES:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def describe_plugins() -> dict[str, Any]:
    """Installed plugin providers, with the device types each offers here (for reports)."""
    out: dict[str, Any] = {}
    for name, plugin in installed_plugins().items():
        try:
            _register(name)
            devices = sorted({d.device.type.name for d in ort.get_ep_devices() if d.ep_name == name})
        except EdgeattnError as exc:
            devices = [f"cannot register: {exc}"]
        out[name] = {"package": plugin.label, "devices": devices}
    return out
