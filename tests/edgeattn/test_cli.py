"""The edgeattn command line, run as a user would: subprocesses in a temporary directory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgeattn import __version__
from edgeattn.model import build_model
from edgeattn.weights import save_weights


def edgeattn(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgeattn.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


@pytest.mark.quick
def test_help_and_version():
    result = edgeattn("--help")
    assert result.returncode == 0
    for command in ("export", "verify", "inspect"):
        assert command in result.stdout
    version = edgeattn("--version")
    assert version.returncode == 0 and __version__ in version.stdout


@pytest.mark.quick
def test_help_does_not_import_torch():
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom edgeattn.cli import cli\n"
        "r = CliRunner().invoke(cli, ['--help'])\nassert r.exit_code == 0\n"
        "assert 'torch' not in sys.modules, 'edgeattn --help imported torch'\n"
        "r = CliRunner().invoke(cli, ['export', '--help'])\nassert r.exit_code == 0\n"
        "heavy = sorted({'torch', 'onnx', 'onnxruntime'} & set(sys.modules))\n"
        "assert not heavy, f'edgeattn export --help imported {heavy}'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("export", "--opset", "seventeen"), "'seventeen' is not a valid integer"),
        (("--nope",), "No such option '--nope'"),
        (("run",), "Missing argument 'EXPORT_DIR'"),
        (("bench", "--shapes", "1xq"), "--shapes BATCHxSEQ"),
    ],
)
@pytest.mark.quick
def test_bad_usage_is_one_line_and_exit_2(args, message):
    result = edgeattn(*args)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("edgeattn: error: ") and message in result.stderr and "--help" in result.stderr


def test_empty_binary_and_missing_input_files_are_one_line(tmp_path):
    assert edgeattn("export", "-o", "out", "--preset", "tiny", "--no-verify", cwd=tmp_path).returncode == 0
    (tmp_path / "empty.txt").write_text("\n  \n")
    (tmp_path / "binary.txt").write_bytes(bytes(range(128, 256)) * 4)
    cases = {"empty.txt": (2, "holds no input lines"), "binary.txt": (1, "not UTF-8 text (byte 0x80 at offset 0)"),
             "missing.txt": (1, "No such file or directory")}  # fmt: skip
    for name, (code, message) in cases.items():
        result = edgeattn("run", "out", "--file", name, cwd=tmp_path)
        assert result.returncode == code and len(result.stderr.strip().splitlines()) == 1, (name, result.stderr)
        assert message in result.stderr, (name, result.stderr)
    bare = edgeattn()
    assert bare.returncode == 2 and "Usage: edgeattn" in bare.stderr  # the help, as click gives it


@pytest.mark.slow
def test_export_then_verify_then_inspect(tmp_path):
    assert edgeattn("export", "-o", "out", "--preset", "tiny", "--no-verify", cwd=tmp_path).returncode == 0
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["graphs"]["encoder"]["parity"] is None
    # a second export into an earlier export replaces it without --force
    result = edgeattn("export", "-o", "out", "--preset", "tiny", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "greedy decode" in result.stdout and "FAIL" not in result.stdout
    verify = edgeattn("verify", "out", cwd=tmp_path)
    assert verify.returncode == 0, verify.stderr
    assert "decoder" in verify.stdout and "ok" in verify.stdout
    info = json.loads(edgeattn("inspect", "out", "--json", cwd=tmp_path).stdout)
    enc = info["graphs"]["encoder"]
    assert enc["inputs"][0] == {"name": "input_ids", "dtype": "int64", "shape": ["batch", "src_len"]}
    assert enc["opsets"]["ai.onnx"] == 17 and enc["parameters"] > 0 and enc["parity"]["passed"]
    single = edgeattn("inspect", "out/decoder.onnx", cwd=tmp_path)
    assert single.returncode == 0 and "past_len" in single.stdout and "operators:" in single.stdout


def test_export_from_checkpoint(tmp_path, tiny_config):
    cfg = tiny_config.replace(architecture="encoder", head="sequence")
    save_weights(build_model(cfg, seed=3), tmp_path / "ckpt" / "model.safetensors")
    result = edgeattn("export", "-o", "out", "--checkpoint", "ckpt/model.safetensors", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["source"] == "checkpoint model.safetensors" and set(manifest["graphs"]) == {"attention", "encoder"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--preset", "nope"], "unknown preset 'nope'"),
        (["--config", "missing.json"], "cannot read config"),
        (["--checkpoint", "absent.safetensors"], "does not exist"),
        (["--checkpoint", "garbage.safetensors"], "not a readable safetensors"),
        (["--checkpoint", "ckpt/model.safetensors", "--config", "wide.json"], "has shape"),
        (["--opset", "99"], "opset 99 cannot be produced"),
        (["--graphs", "encoder,bogus"], "unknown graph 'bogus'"),
    ],
)
def test_user_errors_are_one_line_with_exit_1_and_leave_nothing(tmp_path, tiny_config, args, message):
    save_weights(build_model(tiny_config, seed=3), tmp_path / "ckpt" / "model.safetensors")
    tiny_config.replace(d_model=64).save(tmp_path / "wide.json")
    (tmp_path / "garbage.safetensors").write_bytes(b"not a safetensors file at all")
    before = set(tmp_path.iterdir())
    result = edgeattn("export", "-o", "out", *args, cwd=tmp_path)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert set(tmp_path.iterdir()) == before


def test_unwritable_output_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    result = edgeattn("export", "-o", "file/out", "--no-verify", cwd=tmp_path)
    assert result.returncode == 1 and "edgeattn: error:" in result.stderr and "Traceback" not in result.stderr


def test_verify_and_inspect_on_non_exports(tmp_path):
    result = edgeattn("verify", str(tmp_path))
    assert result.returncode == 1 and "manifest.json" in result.stderr
    (tmp_path / "x.onnx").write_bytes(b"junk")
    result = edgeattn("inspect", str(tmp_path / "x.onnx"))
    assert result.returncode == 1 and "not a readable ONNX file" in result.stderr


def test_export_with_precisions_and_quantize_command(tmp_path):
    result = edgeattn("export", "-o", "out", "--preset", "tiny", "--precision", "fp32-opt,int8", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "precision int8: ok" in result.stdout and "precision fp32-opt: ok" in result.stdout
    added = edgeattn("quantize", "out", "--precision", "int4", cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    assert "added int4" in added.stdout
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert set(manifest["gates"]) == {"fp32-opt", "int8", "int4"}
    fused = edgeattn("verify", "out", "--precision", "fp32-opt", cwd=tmp_path)
    assert fused.returncode == 0, fused.stderr
    assert "greedy decode" in fused.stdout
    info = json.loads(edgeattn("inspect", "out", "--json", cwd=tmp_path).stdout)
    assert info["graphs"]["encoder"]["precision"] == "fp32"
    bad = edgeattn("quantize", "out", "--precision", "int3", cwd=tmp_path)
    assert bad.returncode == 1 and "unknown precision 'int3'" in bad.stderr
    (tmp_path / "calib.txt").write_text("5 6 7\n8 9\n10\n")
    static = edgeattn("quantize", "out", "--precision", "int8-static", "--calibration", "calib.txt", cwd=tmp_path)
    assert static.returncode == 0, static.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    info = manifest["graphs"]["encoder"]["precisions"]["int8-static"]["quantization"]
    assert info["calibration_data"] == "file calib.txt (3 sequences)"
    (tmp_path / "calib.txt").write_text("5 6 7\n8 nine\n")
    bad_file = edgeattn("quantize", "out", "--precision", "int8-static", "--calibration", "calib.txt", cwd=tmp_path)
    assert bad_file.returncode == 1 and "calib.txt line 2" in bad_file.stderr
    assert "Traceback" not in bad_file.stderr and len(bad_file.stderr.strip().splitlines()) == 1
    unused = edgeattn("quantize", "out", "--precision", "int8", "--calibration", "calib.txt", cwd=tmp_path)
    assert unused.returncode == 2 and "--calibration is for int8-static" in unused.stderr
    # int8-static's encoder from the fused form by default, from the plain graph when asked
    assert manifest["graphs"]["encoder"]["precisions"]["int8-static"]["source"].startswith("fp32-opt")
    plain_static = edgeattn("quantize", "out", "--precision", "int8-static", "--static-form", "plain", cwd=tmp_path)
    assert plain_static.returncode == 0, plain_static.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["graphs"]["encoder"]["precisions"]["int8-static"]["source"] == "fp32"
    assert manifest["graphs"]["decoder"]["precisions"]["int8-static"]["source"].startswith("fp32-opt")
    unformed = edgeattn("quantize", "out", "--precision", "int8", "--static-form", "plain", cwd=tmp_path)
    assert unformed.returncode == 2 and "--static-form is for int8-static" in unformed.stderr


@pytest.mark.quick
def test_commands_that_need_the_exporter_say_which_extra_where_it_is_missing(tmp_path):
    """On a runtime-only install (torch, onnx absent) `edgeattn export` is one line naming the extra
    to install, exit 1; `edgeattn run --help` still works."""
    code = (
        "import sys\nfor m in ('torch', 'onnx', 'onnxscript'): sys.modules[m] = None\n"
        "from click.testing import CliRunner\nfrom edgeattn.cli import cli\n"
        f"r = CliRunner().invoke(cli, ['export', '-o', {str(tmp_path / 'out')!r}])\n"
        "print(r.exit_code); print(r.output, end='')\n"
        "r = CliRunner().invoke(cli, ['inspect', '.'])\nprint(r.exit_code); print(r.output, end='')\n"
        "print(CliRunner().invoke(cli, ['run', '--help']).exit_code)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "1" and lines[2] == "1" and lines[4] == "0", lines
    assert lines[1] == ("edgeattn: error: 'edgeattn export' needs the 'export' extra, which this install lacks "
                        "(torch, onnx, onnxscript not found): pip install 'edgeattn[export]'")  # fmt: skip
    assert "(onnx not found)" in lines[3] and not (tmp_path / "out").exists()


@pytest.mark.quick
def test_run_offers_each_familys_options_and_nothing_else():
    """``edgeattn run``'s options are the ones every run takes and those of each family's record's hook."""
    from edgeattn.cli import run
    from edgeattn.runtime.families import FAMILIES, resolve

    hooks = [resolve(f.run_hook) for f in FAMILIES.values()]
    wanted = {o.name for hook in hooks for o in hook.options}
    base = {"export_dir", "text", "input_file", "precision", "threads", "cpu", "providers", "provider_specs"}
    assert {p.name for p in run.params} == wanted | base
    assert {"timestamps", "raw", "aggregation", "stops", "as_json"} <= wanted
