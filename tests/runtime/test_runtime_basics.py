"""The runtime imports and runs with torch unimportable, and checks its inputs against the specs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from edgeattn.exporters.export import export_model
from edgeattn.model import build_model
from edgeattn.runtime import ExportedModel, InputError

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    from edgeattn.config import get_preset

    out = tmp_path_factory.mktemp("rt") / "out"
    model = build_model(get_preset("tiny"), seed=4)
    export_model(model, out, verify=False)
    return out, model


def test_runtime_runs_with_torch_unimportable(export_dir):
    out, model = export_dir
    ids = np.array([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]], dtype=np.int64)
    mask = (ids != 0).astype(np.int64)
    expected = model.greedy(torch.from_numpy(ids), torch.from_numpy(mask), 8).numpy()
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # any 'import torch' now fails
        import numpy as np
        import edgeattn.runtime as rt
        m = rt.ExportedModel({str(out)!r})
        ids = np.array({ids.tolist()}, dtype=np.int64)
        tokens = m.greedy(ids, (ids != 0).astype(np.int64), 8)
        print(tokens.tolist())
        assert not any(name == "torch" or name.startswith("torch.") for name in sys.modules if sys.modules[name])
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(expected.tolist())


def test_inputs_are_checked_against_the_spec(export_dir):
    out, _ = export_dir
    m = ExportedModel(out)
    ids = np.ones((2, 5), dtype=np.int64)
    with pytest.raises(InputError, match="input 'input_ids' must have dtype int64, got int32"):
        m.run("encoder", {"input_ids": ids.astype(np.int32), "attention_mask": ids})
    with pytest.raises(InputError, match=r"input 'input_ids' must have shape \(batch, src_len\), got rank 1"):
        m.run("encoder", {"input_ids": ids[0], "attention_mask": ids})
    with pytest.raises(InputError, match="'attention_mask' has batch=3 but 'input_ids' has batch=2"):
        m.run("encoder", {"input_ids": ids, "attention_mask": np.ones((3, 5), dtype=np.int64)})
    with pytest.raises(InputError, match="needs input"):
        m.run("encoder", {"input_ids": ids})


def test_spinning_policies_set_onnx_runtime_options(export_dir):
    from edgeattn.errors import EdgeattnError
    from edgeattn.runtime.session import session_options

    def entries(spinning):
        opts = session_options(2, spinning)
        stop = opts.get_session_config_entry("session.force_spinning_stop") if spinning == "run" else None
        return opts.get_session_config_entry("session.intra_op.allow_spinning"), stop

    assert entries(True) == entries("on") == ("1", None)
    assert entries(False) == entries("off") == ("0", None)
    assert entries("run") == ("1", "1")
    default = session_options(2)  # spinning while a run lasts: a model's idle sessions leave the cores alone
    assert default.get_session_config_entry("session.force_spinning_stop") == "1"
    with pytest.raises(EdgeattnError, match="spinning must be"):
        session_options(2, "sometimes")
    out, _ = export_dir
    ids = np.array([[5, 6, 7]], dtype=np.int64)
    outputs = [ExportedModel(out, threads=2, spinning=s).encode(ids) for s in ("on", "run", "off")]
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(outputs[0], outputs[2])


def test_sessions_without_threads_take_them_from_the_environment(monkeypatch):
    from edgeattn.errors import EdgeattnError
    from edgeattn.runtime.session import THREADS_ENV, default_threads, session_options

    monkeypatch.setenv(THREADS_ENV, "3")
    assert default_threads() == 3 and session_options().intra_op_num_threads == 3
    assert session_options(threads=2).intra_op_num_threads == 2  # asked for, it wins
    monkeypatch.delenv(THREADS_ENV)
    assert default_threads() is None and session_options().intra_op_num_threads == 0  # ONNX Runtime decides
    monkeypatch.setenv(THREADS_ENV, "many")
    with pytest.raises(EdgeattnError, match="EDGEATTN_THREADS must be a positive integer"):
        default_threads()


def test_signed_int8_weights_do_not_saturate_on_any_cpu():
    """Products of activations 255 and signed weights 127 overflow the 16-bit pair sums of the
    u8 x s8 kernels of CPUs without VNNI/AMX (an int8 export made on a VNNI machine, run on an AVX2
    one): the runtime's sessions give the exact integer products on every CPU."""
    from edgeattn.host import cpu_flags
    from edgeattn.runtime.session import create_session
    from tests.helpers.saturation import saturating_product

    model, a, want = saturating_product()
    got = create_session(model.SerializeToString()).run(["y"], {"a": a})[0]
    np.testing.assert_array_equal(got, want, err_msg=f"CPU flags {cpu_flags()}")
