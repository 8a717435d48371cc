"""Greedy chat answers of the real SmolLM2-135M-Instruct at every precision, beside llama.cpp's
on the same prompt token ids: what each quantisation does to real answers, in words.

The prompts, their token ids (the folder's chat template, as transformers renders it) and
transformers' own float32 answers are the folder's ``reference.json`` (``tests/real/build_smollm2.py``);
llama.cpp runs the GGUF files ``benchmarks/real_quality.py`` made (its ``--work`` folder) in the
peers' environment, greedy, one token at a time.

Usage: ``python benchmarks/real_answers.py EXPORT [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FOLDER = Path(os.environ.get("EDGEATTN_REAL", Path.home() / ".cache" / "edgeattn-real")) / "smollm2-135m-instruct"
PEERS = Path(os.environ.get("EDGEATTN_PEERS", Path.home() / ".cache" / "edgeattn-peers"))
LLAMA_FILES = {"llama.cpp Q8_0": "q8_0.gguf", "llama.cpp Q4_K_M": "q4_k_m.gguf", "llama.cpp Q4_0": "q4_0.gguf"}
_WORKER = r"""
import json, sys
import numpy as np
import llama_cpp
path, job = sys.argv[1], json.load(sys.stdin)
llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=2, logits_all=True, verbose=False)
out = []
for ids in job["prompts"]:
    llm.reset()
    llm.eval(ids)
    answer = []
    for _ in range(job["tokens"]):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        if token in job["stops"]:
            break
        answer.append(token)
        llm.eval([token])
    out.append(answer)
json.dump(out, sys.stdout)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--folder", type=Path, default=FOLDER)
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache" / "edgeattn-real" / "gguf")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/real-answers-smollm2-135m.json")
    args = parser.parse_args()
    from edgeattn.benchmark.machine import machine_info
    from edgeattn.runtime import load

    reference = json.loads((args.folder / "reference.json").read_text())
    cases, tokens = reference["answers"], reference["answer_tokens"]
    fp32 = load(args.export, precision="fp32")
    stops = list(fp32.stop_ids)
    answers: dict[str, list[str]] = {"transformers fp32": [c["answer"].strip() for c in cases]}
    for precision in ("fp32", "int8", "int4"):
        model = fp32 if precision == "fp32" else load(args.export, precision=precision)
        answers[f"edgeattn {precision}"] = [
            model.generate_answers([[{"role": "user", "content": c["prompt"]}]], tokens)[0][0].strip() for c in cases
        ]
    python = PEERS / "bin" / "python"
    for name, file in LLAMA_FILES.items():
        path = args.work / file
        if not python.is_file() or not path.is_file():
            print(f"{name}: no {path} (benchmarks/real_quality.py makes it) or no peers' environment: left out")
            continue
        job = {"prompts": [c["prompt_ids"] for c in cases], "tokens": tokens, "stops": stops}
        done = subprocess.run([str(python), "-c", _WORKER, str(path)], input=json.dumps(job), text=True,
                              capture_output=True, check=True)  # fmt: skip
        answers[name] = [fp32.tokenizer.decode(np.array(ids)).strip() for ids in json.loads(done.stdout)]
    for i, case in enumerate(cases):
        print(f"\n{case['prompt']}")
        for name, said in answers.items():
            print(f"  {name:20s} {said[i]!r}")
    report = {"date": time.strftime("%Y-%m-%d"), "machine": machine_info(), "checkpoint": args.folder.name,
              "new_tokens": tokens, "prompts": [c["prompt"] for c in cases], "answers": answers}  # fmt: skip
    args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
