"""The torch-free install, proven: the wheel with the ``text`` extra in a fresh virtual environment
runs exports made by the full install, with ``import torch`` failing there.

``python .ci/torch_free.py prepare DIR`` (full install): exports the demo (encoder-decoder), a
small encoder and a small Llama with a tokenizer and a chat template (built with ``transformers``)
into DIR, with the answers the runtime gives here, and the full install's size.
``python .ci/torch_free.py check DIR`` (the fresh environment): the same answers through
``edgeattn run`` and the Python API, and the environment's size beside the full install's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

ENCODER = {"architecture": "encoder", "vocab_size": 40, "d_model": 32, "n_heads": 4, "d_ff": 64,
           "n_encoder_layers": 2, "n_decoder_layers": 0, "max_len": 64, "dropout": 0.0, "head": "sequence",
           "num_labels": 3}  # fmt: skip
IDS = [[5, 7, 9, 11, 3, 0], [4, 8, 15, 16, 23, 2]]
MASK = [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]
TEXTS = ["5 2 9 1", "3 1 4 1 5 9 2 6"]


def install_size(extras: tuple[str, ...]) -> tuple[int, list[str]]:
    """Bytes on disk of edgeattn with ``extras`` and every distribution it requires, as installed here."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [("edgeattn", set(extras))]
    while todo:
        name, wanted = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        first = key not in seen
        seen[key] = dist
        for req in dist.requires or []:
            m = re.match(r"\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?", req)
            marker = req.split(";", 1)[1] if ";" in req else ""
            extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
            if extra and extra.group(1) not in wanted:
                continue
            if not extra and not first:
                continue
            if marker and not extra and "platform" in marker and "x86_64" not in marker:
                continue
            sub = set(m.group(2)[1:-1].split(",")) if m.group(2) else set()
            sub_key = re.sub(r"[-_.]+", "-", m.group(1)).lower()
            if sub_key not in seen or sub:
                todo.append((m.group(1), sub))
    total = 0
    for dist in seen.values():
        for f in dist.files or []:
            path = Path(dist.locate_file(f))
            if path.is_file():
                total += path.stat().st_size
    return total, sorted(seen)


def prepare(out: Path) -> None:
    from edgeattn.runtime import load

    out.mkdir(parents=True, exist_ok=True)
    (out / "encoder.json").write_text(json.dumps(ENCODER))
    for args in (["export", "-o", str(out / "demo"), "--force"],
                 ["export", "--config", str(out / "encoder.json"), "-o", str(out / "encoder"), "--force"]):
        subprocess.run(["edgeattn", *args], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: the tests' builders
    from tests.helpers import causal_folders

    folder, _ = causal_folders.save_folder("llama-gqa-tied", out / "llama-hf", tokenizer=True)
    subprocess.run(["edgeattn", "export", "--from-hf", str(folder), "-o", str(out / "llama"), "--force"], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    llama = load(out / "llama", providers=["CPUExecutionProvider"])
    encoder = load(out / "encoder", providers=["CPUExecutionProvider"])
    expected = {
        "chat": llama.chat([{"role": "user", "content": TEXTS[0]}], 12),
        "completions": llama.generate_text(TEXTS, 12),
        "answers": load(out / "demo", providers=["CPUExecutionProvider"]).generate_text(TEXTS),
        "logits": encoder.classify(np.array(IDS), np.array(MASK)).tolist(),
        "full_install_bytes": install_size(("export", "text"))[0],
    }
    (out / "expected.json").write_text(json.dumps(expected))


def check(out: Path) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        sys.exit("torch imports in the torch-free environment")
    for name in ("onnx", "onnxscript", "transformers"):
        try:
            __import__(name)
        except ImportError:
            continue
        sys.exit(f"{name} imports in the torch-free environment")
    from edgeattn.runtime import load

    expected = json.loads((out / "expected.json").read_text())
    (out / "inputs.txt").write_text("\n".join(TEXTS) + "\n")
    run = subprocess.run(["edgeattn", "run", str(out / "demo"), "--file", str(out / "inputs.txt")],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0 and run.stdout.splitlines() == expected["answers"], (run.stdout, run.stderr)
    one = subprocess.run(["edgeattn", "run", str(out / "demo"), TEXTS[0]], capture_output=True, text=True)
    assert one.returncode == 0 and one.stdout.strip() == expected["answers"][0], (one.stdout, one.stderr)
    model = load(out / "demo")
    assert model.generate_text(TEXTS) == expected["answers"]
    logits = load(out / "encoder").classify(np.array(IDS), np.array(MASK))
    assert np.abs(logits - np.array(expected["logits"])).max() <= 1e-5, logits
    chat = subprocess.run(["edgeattn", "run", str(out / "llama"), TEXTS[0], "--max-new-tokens", "12"],
                          capture_output=True, text=True)  # fmt: skip
    assert chat.returncode == 0 and chat.stdout.rstrip("\n") == expected["chat"], (chat.stdout, chat.stderr)
    assert load(out / "llama").generate_text(TEXTS, 12) == expected["completions"]
    refused = subprocess.run(["edgeattn", "export", "-o", str(out / "again")], capture_output=True, text=True)
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "pip install 'edgeattn[export]'" in refused.stderr, refused.stderr
    size, dists = install_size(("text",))
    full = expected["full_install_bytes"]
    print(f"torch-free install: edgeattn run and the Python API answer as the full install does (an encoder, "
          f"an encoder-decoder, a language model's completions and chat); "
          f"'edgeattn export' says: {refused.stderr.strip()}")  # fmt: skip
    print(f"installed size: runtime with [text] {size / 2**20:.0f} MiB ({', '.join(dists)}); "
          f"full install with [export,text] {full / 2**20:.0f} MiB ({full / size:.0f}x)")  # fmt: skip


if __name__ == "__main__":
    {"prepare": prepare, "check": check}[sys.argv[1]](Path(sys.argv[2]))
