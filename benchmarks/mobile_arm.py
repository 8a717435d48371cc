"""A mobile bundle's ORT files on ARM kernels: the same files run by onnxruntime for aarch64 (in an
arm64 Debian root under qemu's user-mode emulation, as four CPU models: NEON only, with the dot
product, with i8mm, with SVE and i8mm, so ONNX Runtime's ARM paths for each run) and by
onnxruntime here, on the same inputs of sizes never traced. Answers, not speed (emulation's
timings mean nothing): each file's worst absolute error and worst row cosine against this
machine's, and whether it holds the bundle's own bound (float32 within 1e-4 + 1e-5·|x|, reduced
precisions at a worst cosine of 0.999). Prints the table, writes the JSON.

    python benchmarks/mobile_arm.py --arm-root DIR [--out FILE]

DIR: an arm64 Debian root with python3 and onnxruntime (as made here, 2026-12-02):
``apt-get install debootstrap qemu-user-static binfmt-support``, ``mount binfmt_misc -t
binfmt_misc /proc/sys/fs/binfmt_misc && update-binfmts --enable qemu-aarch64``, ``debootstrap
--arch=arm64 --variant=minbase --include=python3,python3-venv bookworm DIR``, ``mount -t proc proc
DIR/proc``, files ``DIR/sys/devices/system/cpu/possible`` and ``present`` holding ``0-1`` (ONNX
Runtime's cpuinfo reads them; binding the host's /sys crashes it under emulation), then
onnxruntime's aarch64 wheel and its dependencies (``pip download --platform manylinux_2_28_aarch64
--only-binary=:all: --python-version 3.11 onnxruntime==1.32.0``) installed in ``DIR/venv``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from edgeattn.benchmark.machine import machine_info
from edgeattn.benchmark.report import publish

ROOT = Path(__file__).resolve().parents[1]
#: qemu's CPU models the files run on: NEON only, + dot product, + i8mm (SVE off), + SVE with i8mm
CPUS = ("cortex-a53", "neoverse-n1", "max,sve=off", "max")

RUN = """
import json, platform, sys
import numpy as np, onnxruntime as ort
work = sys.argv[1]
# the instructions the (emulated) CPU offers, from the auxiliary vector's HWCAP words, as ONNX Runtime reads them
words = np.frombuffer(open("/proc/self/auxv", "rb").read(), dtype=np.uint64).reshape(-1, 2)
aux = {int(k): int(v) for k, v in words}
hwcap, hwcap2 = aux.get(16, 0), aux.get(26, 0)
features = {"asimd": hwcap >> 1 & 1, "asimddp (dot product)": hwcap >> 20 & 1, "sve": hwcap >> 22 & 1,
            "i8mm": hwcap2 >> 13 & 1, "bf16": hwcap2 >> 14 & 1, "sve2": hwcap2 >> 1 & 1}
out = {"onnxruntime": ort.__version__, "machine": platform.machine(),
       "features": [name for name, on in features.items() if on]}
for name in json.load(open(work + "/files.json")):
    session = ort.InferenceSession(work + "/" + name, providers=["CPUExecutionProvider"])
    feeds = np.load(work + "/" + name + ".feeds.npz")
    cases = sorted({k.split("/")[0] for k in feeds.files})
    results = {}
    for case in cases:
        inputs = {k.split("/", 1)[1]: feeds[k] for k in feeds.files if k.startswith(case + "/")}
        for i, value in enumerate(session.run(None, inputs)):
            results[f"{case}/{i}"] = value
    np.savez(work + "/" + name + ".arm.npz", **results)
json.dump(out, open(work + "/arm.json", "w"))
"""


@dataclass
class ArmBench:
    rows: list[dict] = field(default_factory=list)
    arm: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"benchmark": "mobile arm", "machine": machine_info(), "arm": self.arm, "rows": self.rows}

    def table(self) -> str:
        from edgeattn.benchmark.results_page import arm_table

        return arm_table(self.to_dict())


def _exports(work: Path) -> list[tuple[str, Path]]:
    """A small BERT-shaped encoder (random weights) and a trained Llama (gated) at fp32, int8 and
    int4, with their mobile bundles."""
    sys.path.insert(0, str(ROOT))  # the tests' trained Llama and its tokenizer
    from edgeattn.config import get_preset
    from edgeattn.exporters.export import export_model
    from edgeattn.exporters.mobile import package_mobile
    from edgeattn.model import build_model
    from tests.helpers import causal_folders

    config = replace(get_preset("bert-base"), d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=4, max_len=128)
    encoder = work / "encoder"
    export_model(build_model(config, seed=0), encoder, graphs=["encoder"], precisions=["int8", "int4"], verify=False)
    lm = causal_folders.export_trained(work / "llama", "int8,int4")
    bundles = []
    for name, export in (("encoder", encoder), ("llama", lm)):
        package_mobile(export, work / f"{name}-mobile")
        bundles.append((name, export))
    return bundles


def measure(work: Path, arm_root: Path) -> ArmBench:
    from edgeattn.exporters.mobile import BUNDLE
    from edgeattn.exporters.sampling import sample_inputs
    from edgeattn.runtime.families import family_of
    from edgeattn.runtime.manifest import read_manifest
    from edgeattn.runtime.session import create_session
    from edgeattn.runtime.specs import graph_spec

    bench = ArmBench()
    shared = arm_root / "edgeattn-check"
    shutil.rmtree(shared, ignore_errors=True)
    shared.mkdir()
    want: dict[str, list[np.ndarray]] = {}
    files = []
    for name, export in _exports(work):
        config = read_manifest(export).config
        described = json.loads((work / f"{name}-mobile" / BUNDLE).read_text())
        for f in described["files"]:
            spec = graph_spec(f["graph"], config)
            rng = np.random.default_rng(11)
            sizes = family_of(config).role(f["graph"]).sizes(config)[:3]
            feeds = {f"{k}/{n}": v for k, case in enumerate(sizes)
                     for n, v in sample_inputs(spec, config, case, rng).items()}  # fmt: skip
            label = f"{name}-{f['file']}"
            shutil.copy2(work / f"{name}-mobile" / f["file"], shared / label)
            np.savez(shared / f"{label}.feeds.npz", **feeds)
            session = create_session(shared / label)
            want[label] = {f"{k}/{i}": value for k in range(len(sizes)) for i, value in enumerate(session.run(
                None, {n.split("/", 1)[1]: v for n, v in feeds.items() if n.startswith(f"{k}/")}))}  # fmt: skip
            files.append((label, name, f["precision"]))
    (shared / "files.json").write_text(json.dumps([label for label, _, _ in files]))
    (shared / "run.py").write_text(RUN)
    for cpu in CPUS:
        subprocess.run(["chroot", str(arm_root), "/venv/bin/python", "/edgeattn-check/run.py", "/edgeattn-check"],
                       check=True, timeout=3600, env={**os.environ, "QEMU_CPU": cpu})  # fmt: skip
        bench.arm[cpu] = json.loads((shared / "arm.json").read_text())
        bench.rows += _compare(shared, files, want, cpu)
    shutil.rmtree(shared)
    return bench


def _compare(shared: Path, files: list[tuple[str, str, str]], want: dict[str, dict[str, np.ndarray]],
             cpu: str) -> list[dict]:  # fmt: skip
    from edgeattn.exporters.mobile import compare_outputs
    from edgeattn.runtime.precisions import PRECISIONS

    rows = []
    for label, name, precision in files:
        got = np.load(shared / f"{label}.arm.npz")
        found = compare_outputs([(expected, got[key]) for key, expected in want[label].items()],
                                PRECISIONS[precision].float32_parity)  # fmt: skip
        rows.append({"cpu": cpu, "model": name, "file": label.split("-", 1)[1], "precision": precision,
                     "max_abs": found["max_abs"], "worst_cosine": round(found["worst_cosine"], 7),
                     "passed": found["passed"]})  # fmt: skip
        logging.info("%s", rows[-1])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm-root", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mobile-arm.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        bench = measure(Path(tmp), args.arm_root.resolve())
    publish(bench, args.out)


if __name__ == "__main__":
    main()
