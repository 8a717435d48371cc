"""Small random checkpoints of every architecture edgeattn imports, as data both transformers
generations build (4.x in the project's environment, 5.x in ``.ci/transformers5.sh``'s), to prove
that the folders each one saves import to the same model.

Run by the transformers 5 environment as ``python tests/helpers/generations.py OUT``: every model
of :data:`MODELS` is built from its seed, saved with ``save_pretrained`` into ``OUT/NAME``, and its
outputs on :func:`sample_ids` written beside it (``outputs.npz``: transformers 5's own answer).
The project's tests build the same models with transformers 4.x from the same weights. Nothing here
imports edgeattn.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SMALL = {"vocab_size": 97, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "max_position_embeddings": 128, "pad_token_id": 0, "bos_token_id": 1,
         "eos_token_id": 2}  # fmt: skip
ENCODER = {"vocab_size": 99, "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2,
           "num_attention_heads": 4, "max_position_embeddings": 64}  # fmt: skip

#: name -> (model class, config class, config keyword arguments)
MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama-theta-tied": ("LlamaForCausalLM", "LlamaConfig",
                         {**SMALL, "num_key_value_heads": 2, "rope_theta": 100000.0, "tie_word_embeddings": True}),
    "llama3-scaled": ("LlamaForCausalLM", "LlamaConfig", {**SMALL, "num_key_value_heads": 1, "rope_theta": 500000.0,
                      "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    "llama-linear": ("LlamaForCausalLM", "LlamaConfig",
                     {**SMALL, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "llama-dynamic": ("LlamaForCausalLM", "LlamaConfig",
                      {**SMALL, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}),
    "qwen2-yarn": ("Qwen2ForCausalLM", "Qwen2Config", {**SMALL, "num_key_value_heads": 2, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}}),
    "qwen3-qk-norm": ("Qwen3ForCausalLM", "Qwen3Config",
                      {**SMALL, "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 1000000.0}),
    "phi3-partial": ("Phi3ForCausalLM", "Phi3Config", {**SMALL, "partial_rotary_factor": 0.5}),
    "phi3-longrope": ("Phi3ForCausalLM", "Phi3Config", {**SMALL, "original_max_position_embeddings": 64,
                      "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0],
                                       "long_factor": [2.0, 3.0, 4.0, 6.0]}}),
    # TOKENS of 21 reach past windows of 4
    "gemma3-sliding": ("Gemma3ForCausalLM", "Gemma3TextConfig", {**SMALL, "num_key_value_heads": 2, "head_dim": 16,
                       "query_pre_attn_scalar": 12, "sliding_window": 4, "num_hidden_layers": 3,
                       "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]}),
    "gemma2-softcap": ("Gemma2ForCausalLM", "Gemma2Config", {**SMALL, "num_key_value_heads": 1, "head_dim": 16,
                       "query_pre_attn_scalar": 24, "sliding_window": 4, "attn_logit_softcapping": 0.5,
                       "final_logit_softcapping": 2.0}),
    "mistral-window": ("MistralForCausalLM", "MistralConfig", {**SMALL, "num_key_value_heads": 2, "sliding_window": 4}),
    "smollm3-nope": ("SmolLM3ForCausalLM", "SmolLM3Config", {**SMALL, "num_key_value_heads": 2, "rope_theta": 2e6,
                     "no_rope_layers": [1, 0]}),
    "qwen3-moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", {**SMALL, "num_key_value_heads": 2, "head_dim": 16,
                  "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "num_hidden_layers": 3,
                  "decoder_sparse_step": 2}),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", {"vocab_size": 97, "n_embd": 32, "n_layer": 2, "n_head": 4,
                                               "n_positions": 128, "bos_token_id": 1, "eos_token_id": 2}),
    "t5-v1.1": ("T5ForConditionalGeneration", "T5Config", {"vocab_size": 97, "d_model": 32, "d_ff": 37, "d_kv": 8,
                "num_layers": 2, "num_heads": 4, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
                "decoder_start_token_id": 0}),
    "t5-tied": ("T5ForConditionalGeneration", "T5Config", {"vocab_size": 97, "d_model": 32, "d_ff": 37, "d_kv": 8,
                "num_layers": 2, "num_heads": 4, "decoder_start_token_id": 0}),
    "bert-classify": ("BertForSequenceClassification", "BertConfig", {**ENCODER, "num_labels": 3}),
    "roberta-tag": ("RobertaForTokenClassification", "RobertaConfig",
                    {**ENCODER, "max_position_embeddings": 66, "pad_token_id": 1, "type_vocab_size": 1}),
    "distilbert": ("DistilBertModel", "DistilBertConfig", {"vocab_size": 99, "dim": 32, "hidden_dim": 37,
                   "n_layers": 2, "n_heads": 4, "max_position_embeddings": 64}),
}  # fmt: skip
TOKENS = 21


def build(name: str, seed: int = 0) -> Any:
    """The random transformers model ``name`` (whichever transformers is installed), its weights
    nudged off their initial values so that every tensor matters."""
    import torch
    import transformers

    model_class, config_class, kwargs = MODELS[name]
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs))
    if model_class.endswith("ForCausalLM"):  # eager, the reference: sdpa leaves Gemma 2's soft-capping out
        model.config._attn_implementation = "eager"
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def sample_ids() -> Any:
    """Two rows of :data:`TOKENS` fixed token ids (no specials), and their all-ones mask."""
    import torch

    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 97, (2, TOKENS), generator=generator)
    return ids, torch.ones_like(ids)


def outputs(model: Any, ids: Any, mask: Any) -> dict[str, Any]:
    """What a model answers on ``ids``: logits (teacher-forced for an encoder-decoder) or hidden states."""
    import torch

    with torch.no_grad():
        if model.config.is_encoder_decoder:
            targets = torch.cat([torch.zeros_like(ids[:, :1]), ids[:, :9]], dim=1)
            return {"logits": model(input_ids=ids, attention_mask=mask, decoder_input_ids=targets).logits}
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        answer = {"hidden": out.hidden_states[-1]}
        if getattr(out, "logits", None) is not None:
            answer["logits"] = out.logits
        return answer


def main(out: Path) -> None:
    import numpy as np
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    ids, mask = sample_ids()
    for name in MODELS:
        model = build(name)
        model.save_pretrained(str(out / name))
        np.savez(out / name / "outputs.npz", **{k: v.numpy() for k, v in outputs(model, ids, mask).items()})
    (out / "built.json").write_text(json.dumps({"transformers": transformers.__version__, "models": list(MODELS)}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: generations.py OUT")
    main(Path(sys.argv[1]))
