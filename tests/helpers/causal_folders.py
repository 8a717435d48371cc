"""Small random decoder-only checkpoints of every architecture edgeattn imports, built with
``transformers`` and saved with ``save_pretrained``, and a tokenizer and chat template trained and
written here (shared by the eager, export and runtime tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

SMALL = {"vocab_size": 97, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "max_position_embeddings": 128}  # fmt: skip
#: pad, BOS, end of text, and the chat markup
SPECIALS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
END_OF_TURN = SPECIALS.index("<|im_end|>")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CORPUS = ["the sea is calm tonight", "write a haiku about the sea", "waves fold over the sand under the moon",
          "a small model runs at the edge of the network", "hello how are you today", "stop here and rest"] * 10


def models() -> dict[str, Any]:
    import transformers as t

    ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    return {
        "llama-gqa-tied": lambda: t.LlamaForCausalLM(t.LlamaConfig(
            **SMALL, **ids, num_key_value_heads=2, tie_word_embeddings=True, rms_norm_eps=1e-5)),
        "llama3.2-scaled": lambda: t.LlamaForCausalLM(t.LlamaConfig(
            **SMALL, **ids, num_key_value_heads=1, rope_theta=500000.0, rope_scaling={
                "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16})),
        "qwen2-biases": lambda: t.Qwen2ForCausalLM(t.Qwen2Config(
            **SMALL, **ids, num_key_value_heads=2, tie_word_embeddings=True)),
        "qwen3-qk-norm": lambda: t.Qwen3ForCausalLM(t.Qwen3Config(**SMALL, **ids, num_key_value_heads=2, head_dim=16)),
        "phi3-packed": lambda: t.Phi3ForCausalLM(t.Phi3Config(**SMALL, **ids, num_key_value_heads=4)),
        # windows of 4 tokens: the tests' prompts of 11 and 13 reach past them
        "gemma3-sliding": lambda: t.Gemma3ForCausalLM(t.Gemma3TextConfig(
            **SMALL, **ids, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=12, sliding_window=4,
            layer_types=["sliding_attention", "full_attention"], rope_theta=100000.0, rope_local_base_freq=500.0)),
        "gemma2-softcap": lambda: t.Gemma2ForCausalLM(t.Gemma2Config(
            **SMALL, **ids, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
            attn_logit_softcapping=0.5, final_logit_softcapping=2.0)),
        "mistral-window": lambda: t.MistralForCausalLM(t.MistralConfig(**SMALL, **ids, num_key_value_heads=2,
                                                                       sliding_window=4)),
        "smollm3-nope": lambda: t.SmolLM3ForCausalLM(t.SmolLM3Config(**SMALL, **ids, num_key_value_heads=2,
                                                                     no_rope_layers=[1, 0])),
        # 4 experts, 2 a token, the middle layer dense: mixtures of experts beside a plain feed-forward
        "qwen3-moe": lambda: t.Qwen3MoeForCausalLM(t.Qwen3MoeConfig(
            **{**SMALL, "num_hidden_layers": 3}, **ids, num_key_value_heads=2, head_dim=16, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True, mlp_only_layers=[1])),
        "gpt2": lambda: t.GPT2LMHeadModel(t.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                                       bos_token_id=1, eos_token_id=2)),
    }  # fmt: skip


MODELS = list(models())


def build(name: str, seed: int = 0) -> Any:
    """The random transformers model ``name``, with non-trivial norms and biases."""
    torch.manual_seed(seed)
    model = models()[name]()
    model.config._attn_implementation = "eager"  # the reference: sdpa leaves Gemma 2's soft-capping out
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def write_tokenizer(folder: Path, vocab_size: int = 97) -> None:
    """A BPE tokenizer trained on :data:`CORPUS` (SentencePiece-style spaces, the specials first), a
    ChatML template in tokenizer_config.json, and <|im_end|> among the end-of-sequence ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHATML, "bos_token": "<s>", "eos_token": "<|im_end|>", "pad_token": "<pad>"}))  # fmt: skip
    generation = json.loads((folder / "generation_config.json").read_text())
    generation["eos_token_id"] = [2, END_OF_TURN]
    (folder / "generation_config.json").write_text(json.dumps(generation))


def train(model: Any, folder: Path, steps: int = 120) -> Any:
    """``model`` trained a little on :data:`CORPUS` through ``folder``'s tokenizer: confident next-token
    predictions, as a real model's are (random weights give flat logits whose top token is noise)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rows = [[1, *tok.encode(line).ids, 2] for line in sorted(set(CORPUS))]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = (torch.arange(width)[None] < torch.tensor([len(r) for r in rows])[:, None]).long()
    labels = ids.masked_fill(mask == 0, -100)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def save_folder(name: str, out: Path, tokenizer: bool = False, seed: int = 0, trained: bool = False
                ) -> tuple[Path, Any]:  # fmt: skip
    """Model ``name`` saved in ``out`` (with a trained tokenizer when asked, and trained on the corpus
    through it when asked); returns (out, model)."""
    model = build(name, seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    if tokenizer or trained:
        write_tokenizer(out)
    if trained:
        train(model, out)
        model.save_pretrained(out)
        write_tokenizer(out)  # save_pretrained wrote its generation_config.json again
    return out, model


def heldout_notes(path: Path) -> Path:
    """A held-out file for the gate: 30 pairs of the corpus's lines never seen together, one a line."""
    lines = sorted(set(CORPUS))
    path.write_text("\n".join(f"{a} {b}" for a in lines for b in lines if a != b) + "\n")
    return path


def export_trained(root: Path, precision: str = "int8") -> Path:
    """A trained Llama with a tokenizer and ChatML template, exported by the command line at fp32
    and ``precision`` (gated on :func:`heldout_notes`): ``root / "lm"``."""
    from click.testing import CliRunner

    from edgeattn.cli import cli

    folder, _ = save_folder("llama-gqa-tied", root / "hf", trained=True)
    out = root / "lm"
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(out), "--precision", precision,
                                      "--heldout", str(heldout_notes(root / "notes.txt"))])  # fmt: skip
    assert result.exit_code == 0, result.output
    return out
