"""Execution providers by name: built-in ones, installed plugin ones (OpenVINO), their options, and
what a user is told when one cannot run here."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from edgeattn.config import get_preset
from edgeattn.errors import EdgeattnError
from edgeattn.exporters.export import export_model
from edgeattn.model import build_model
from edgeattn.runtime import load
from edgeattn.runtime.providers import (
    OPENVINO,
    built_in_provider,
    installed_plugins,
    onnxruntime_package,
    openvino_options,
    openvino_usable,
    parse_provider_options,
    plugin_devices,
    why_unavailable,
)
from edgeattn.runtime.session import CPU, create_session

pytestmark = pytest.mark.quick

HAS_OPENVINO = OPENVINO in installed_plugins()
#: OpenVINO runs the CPU here: built into onnxruntime (onnxruntime-openvino), or a plugin with a CPU device
OPENVINO_RUNS = openvino_usable()


@pytest.fixture(scope="module")
def export(shared_export):
    return shared_export("tiny", graphs=["encoder"])


def _inputs(vocab: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(0).integers(4, vocab, (2, 11)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    return ids, mask


def test_provider_options_parse_per_provider():
    names = [OPENVINO, CPU]
    parsed = parse_provider_options(names, ["precision_hint=bf16", 'OpenVINOExecutionProvider:load_config={"CPU": {}}'])
    assert parsed == [(OPENVINO, {"precision_hint": "bf16", "load_config": '{"CPU": {}}'}), CPU]
    for bad, said in [("novalue", "NAME:KEY=VALUE"), ("=x", "NAME:KEY=VALUE"), ("Other:a=1", "not among")]:
        with pytest.raises(EdgeattnError, match=said):
            parse_provider_options(names, [bad])


def test_openvino_settings_go_where_the_plugin_reads_them():
    """Plain ``precision_hint`` and the session's threads move into OpenVINO's load_config (as plain
    options the plugin ignores them); a load_config given is kept and added to."""
    options = openvino_options({"precision_hint": "bf16", "load_config": '{"CPU": {"PERF": "x"}}'}, "CPU", 2)
    assert json.loads(options.pop("load_config")) == {
        "CPU": {"PERF": "x", "INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": "2"}
    }
    assert options == {}
    assert "load_config" not in openvino_options({}, "GPU", 2)  # threads are the CPU's setting only


def test_built_in_openvino_takes_its_own_option_names():
    """Built into onnxruntime (onnxruntime-openvino), OpenVINO refuses ``device`` and ``precision_hint``
    and onnxruntime then runs everything on the CPU provider: edgeattn hands it ``device_type`` and
    ``load_config`` instead. Other providers pass unchanged."""
    name, options = built_in_provider((OPENVINO, {"precision_hint": "bf16", "device": "cpu"}), 2)
    assert name == OPENVINO and options.pop("device_type") == "CPU"
    assert json.loads(options.pop("load_config")) == {
        "CPU": {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": "2"}
    }
    assert options == {}
    assert built_in_provider(OPENVINO, None) == (OPENVINO, {"device_type": "CPU"})
    cuda = ("CUDAExecutionProvider", {"device_id": "0"})
    assert built_in_provider(cuda, 2) == cuda and built_in_provider(CPU, 2) == CPU


def test_openvino_built_into_onnxruntime_counts_as_usable(built_in_providers):
    built_in_providers(OPENVINO, CPU)
    assert openvino_usable() and openvino_usable("gpu") and not openvino_usable("FPGA")
    assert why_unavailable(OPENVINO) is None


def test_a_registered_plugin_listed_as_available_stays_a_plugin(monkeypatch):
    """ONNX Runtime 1.32 lists a registered plugin's providers among ``get_available_providers()``
    (``OpenVINOExecutionProvider`` and ``OpenVINOExecutionProvider.AUTO``); a session still takes them
    only through the plugin's devices, so they must not pass for built-in ones (they did, and every
    OpenVINO session on an Intel CPU quietly ran on the CPU provider)."""
    import onnxruntime as ort

    from edgeattn.runtime import providers

    monkeypatch.setattr(ort, "get_available_providers", lambda: [CPU, OPENVINO, f"{OPENVINO}.AUTO"])
    monkeypatch.setattr(providers, "_registered", {OPENVINO})
    monkeypatch.setattr(providers, "installed_plugins", lambda: {OPENVINO: object()})
    assert providers.built_in_providers() == [CPU]
    assert providers.is_plugin(OPENVINO)
    monkeypatch.setattr(providers, "_registered", set())  # onnxruntime-openvino: built in
    assert providers.built_in_providers() == [CPU, OPENVINO, f"{OPENVINO}.AUTO"] and not providers.is_plugin(OPENVINO)


@pytest.mark.slow  # an export of its own: out of the quick tier
def test_openvino_on_graphs_with_fused_operators_is_warned_about(tmp_path, built_in_providers, caplog):
    """OpenVINO hands ONNX Runtime's fused operators back to the CPU provider: loading such graphs
    on it says so (sessions are made on first use, so none is made here)."""

    out = tmp_path / "out"
    export_model(build_model(get_preset("tiny"), seed=0), out, graphs=["encoder"], verify=False, precisions=["int8"])
    built_in_providers(OPENVINO, CPU)
    with caplog.at_level(logging.WARNING, logger="edgeattn.runtime.exported_model"):
        load(out, providers=[OPENVINO])
        assert not caplog.records  # fp32: standard operators
        load(out, providers=[OPENVINO], precision="int8")
    assert len(caplog.records) == 1 and "the int8 graphs encoder hold ONNX Runtime's fused" in caplog.text


def test_the_onnxruntime_package_is_named_with_its_version():
    import onnxruntime as ort

    package, _, version = onnxruntime_package().partition(" ")
    assert package.startswith(("onnxruntime", "ort-nightly")) and version.split("+")[0] == ort.__version__.split("+")[0]


def test_a_provider_nothing_provides_warns_and_runs_on_the_cpu(export, tiny_config, caplog):
    reason = why_unavailable("NoSuchExecutionProvider")
    assert reason is not None and "no installed plugin package" in reason
    with caplog.at_level(logging.WARNING, logger="edgeattn.runtime.session"):
        model = load(export, providers=["NoSuchExecutionProvider"])
        hidden = model.encode(*_inputs(tiny_config.vocab_size))
    assert model.providers == [CPU] and np.isfinite(hidden).all()
    assert sum("NoSuchExecutionProvider" in r.getMessage() for r in caplog.records) == 1
    with pytest.raises(EdgeattnError, match="no installed plugin package"):
        create_session(export / "encoder.onnx", providers=["NoSuchExecutionProvider"], require=True)


@pytest.mark.skipif(not HAS_OPENVINO, reason="onnxruntime-ep-openvino is not installed")
def test_the_installed_openvino_plugin_is_found_by_name():
    plugin = installed_plugins()[OPENVINO]
    assert plugin.package == "onnxruntime-ep-openvino" and plugin.library.is_file()


@pytest.mark.skipif(not HAS_OPENVINO or bool(plugin_devices(OPENVINO)), reason="needs OpenVINO without a device")
def test_openvino_without_a_device_here_says_so(export):
    """OpenVINO's plugin offers devices of Intel CPUs only: elsewhere the user is told that, not left
    wondering why it runs on the CPU provider."""
    reason = why_unavailable(OPENVINO)
    assert reason is not None and "offers no CPU device on this machine" in reason
    assert "pip install onnxruntime-openvino" in reason  # what runs OpenVINO on a CPU the plugin does not serve
    with pytest.raises(EdgeattnError, match="offers no CPU device"):
        create_session(export / "encoder.onnx", providers=[OPENVINO], require=True)


@pytest.mark.skipif(not OPENVINO_RUNS, reason="needs OpenVINO that runs on this CPU")
@pytest.mark.parametrize("hint", ["f32", "bf16"])
def test_openvino_runs_the_export_by_name(export, tiny_config, hint):
    """Where OpenVINO runs on the CPU (built in, or a plugin offering it), the export runs on it by
    name, with its options: float32 to within 1e-4 of the CPU provider, bf16 (emulated, AVX-512 BF16
    or AMX) close in direction, and the hint really reaches OpenVINO (bf16 differs from f32)."""
    ids, mask = _inputs(tiny_config.vocab_size)
    reference = load(export, providers=[CPU]).encode(ids, mask)
    model = load(export, providers=[(OPENVINO, {"precision_hint": hint})], threads=2)
    assert model.providers[0] == OPENVINO
    session = create_session(export / "encoder.onnx", providers=[(OPENVINO, {"precision_hint": hint})], require=True)
    assert session.get_providers()[0] == OPENVINO
    hidden = model.encode(ids, mask)
    real = mask.astype(bool)
    if hint == "f32":
        np.testing.assert_allclose(hidden[real], reference[real], atol=1e-4)
    else:
        a, b = hidden[real], reference[real]
        cosine = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
        assert cosine.min() > 0.999 and np.abs(a - b).max() > 1e-4


def test_providers_command_lists_built_in_and_plugin_providers_without_torch():
    import subprocess
    import sys

    code = (
        "import json, sys\nfrom click.testing import CliRunner\nfrom edgeattn.cli import cli\n"
        "r = CliRunner().invoke(cli, ['providers', '--json'])\nassert r.exit_code == 0, r.output\n"
        "assert 'torch' not in sys.modules\nprint(r.output)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert CPU in data["built_in"]
    if HAS_OPENVINO:
        info = data["plugins"][OPENVINO]
        assert info["package"].startswith("onnxruntime-ep-openvino") and info["usable"] == bool(
            plugin_devices(OPENVINO)
        )
