"""T5 checkpoints from local Hugging Face folders: both layouts (the original: ReLU, tied output
layer; v1.1 / Flan-T5: gated GELU, separate output layer) against ``transformers`` eager, through
the exported graphs, greedy and beam search, text in and out, and the precisions' hard cases."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from edgeattn.errors import CheckpointError, ConfigError
from edgeattn.exporters.package import export_model
from edgeattn.hf import import_folder
from edgeattn.runtime import load
from edgeattn.sources import resolve_model

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

LAYOUTS = ("t5", "v1.1")
CORPUS = [
    "summarize: the cat sat on the mat and the dog sat on the log",
    "translate English to German: the house is wonderful",
    "summarize: studies have shown that owning a dog is good for you",
    "the quick brown fox jumps over the lazy dog near the river bank",
    "rewrite: a small model runs at the edge without a server",
]


def _tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A unigram (SentencePiece-style) tokenizer trained here: <pad> 0, </s> 1, <unk> 2, </s> appended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=90, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    tok.train_from_iterator(CORPUS * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])  # fmt: skip
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                                unk_token="<unk>")  # fmt: skip
    fast.model_input_names = ["input_ids", "attention_mask"]  # as T5's own tokenizer declares
    return fast


def t5_checkpoint(layout: str, layers: int = 2, decoder_layers: int | None = None, seed: int = 0):
    """A small random T5 of one layout, its weights moved off their initialisation so that greedy
    and beam search produce varied tokens and end at EOS."""
    torch.manual_seed(seed)
    config = transformers.T5Config(
        vocab_size=96, d_model=32, d_kv=8, num_heads=3, d_ff=48, num_layers=layers, num_decoder_layers=decoder_layers,
        relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
        feed_forward_proj="relu" if layout == "t5" else "gated-gelu", tie_word_embeddings=layout == "t5",
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" not in name:
                p.normal_(0.0, 0.4 if "relative" not in name else 1.0)
        model.shared.weight[1] += 1.5 if layout == "t5" else 0.8  # EOS within reach
        if layout != "t5":
            model.lm_head.weight[1] += 0.6
    return model


def t5_folder(path: Path, layout: str, **sizes: int) -> Path:
    """``save_pretrained`` of a checkpoint and the tokenizer into ``path``."""
    t5_checkpoint(layout, **sizes).save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=LAYOUTS)
def exported(request, tmp_path_factory):
    """(layout, transformers model, its tokenizer, the fp32 export loaded) per layout."""
    root = tmp_path_factory.mktemp(f"t5-{request.param}")
    folder = t5_folder(root / "hf", request.param)
    source = resolve_model(from_hf=folder)
    export_model(source.model, root / "out", **source.export_fields())
    reference = transformers.T5ForConditionalGeneration.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return request.param, reference, tokenizer, load(root / "out", providers=["CPUExecutionProvider"])


def _batch() -> tuple[np.ndarray, np.ndarray]:
    """Three rows of lengths 11, 7 and 3 (the export traced 8), right-padded."""
    rng = np.random.default_rng(3)
    ids = np.zeros((3, 11), np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate((11, 7, 3)):
        ids[row, :n] = rng.integers(3, 90, n)
        ids[row, n - 1] = 1
        mask[row, :n] = 1
    return ids, mask


# ----------------------------------------------------------------------------- the mapping
@pytest.mark.parametrize("layout", LAYOUTS)
def test_import_maps_both_layouts(tmp_path, layout):
    hf = import_folder(t5_folder(tmp_path / "hf", layout, layers=2, decoder_layers=3))
    c = hf.model.config
    assert hf.task == "generate" and hf.tokenizer is not None
    assert (c.n_encoder_layers, c.n_decoder_layers, c.head_dim, c.d_model) == (2, 3, 8, 32)  # 3 heads of 8 over 32
    assert c.tie_embeddings == c.scale_decoder_output == (layout == "t5")
    assert c.activation == ("relu" if layout == "t5" else "gated-gelu_tanh")
    assert (c.bos_id, c.eos_id, c.pad_id, c.attention_scaled, c.norm) == (0, 1, 0, False, "rmsnorm")
    enc = hf.model.encoder.layers
    assert enc[1].self_attn.relative is enc[0].self_attn.relative  # one table per stack
    assert hf.model.decoder.layers[0].cross_attn.relative is None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_eager_matches_transformers_with_more_decoder_layers(tmp_path, layout):
    folder = t5_folder(tmp_path / "hf", layout, layers=2, decoder_layers=3)
    ours = import_folder(folder).model
    ref = transformers.T5ForConditionalGeneration.from_pretrained(folder).eval()
    ids, mask = (torch.tensor(a) for a in _batch())
    target = torch.tensor([[0, 5, 9, 33], [0, 7, 7, 1], [0, 40, 2, 3]])
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask, decoder_input_ids=target)
        memory = ours.encode(ids, mask)
        logits = ours.decode(target, memory=memory, memory_mask=mask)[0]
    m = mask.bool()
    assert (memory - want.encoder_last_hidden_state)[m].abs().max() < 1e-4
    assert (logits - want.logits).abs().max() < 1e-4


# --------------------------------------------------------------------- exported graphs
def test_exported_graphs_match_transformers(exported):
    _, ref, _, rt = exported
    ids, mask = _batch()
    target = np.array([[0, 5, 9, 33, 4], [0, 7, 7, 1, 0], [0, 40, 2, 3, 3]])
    with torch.no_grad():
        feeds = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": target}
        want = ref(**{k: torch.tensor(v) for k, v in feeds.items()})
    hidden = rt.encode(ids, mask)
    real = mask.astype(bool)
    assert np.abs(hidden - want.encoder_last_hidden_state.numpy())[real].max() < 1e-4
    stepper = rt.stepper(ids, mask)
    for t in range(target.shape[1]):  # one token at a time through the cache
        logits = stepper.step(target[:, t])
        assert np.abs(logits - want.logits[:, t].numpy()).max() < 1e-4, f"step {t}"


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_generation_is_token_identical_to_transformers(exported, strategy):
    layout, ref, _, rt = exported
    ids, mask = _batch()
    beams = {"num_beams": 3} if strategy == "beam" else {}
    with torch.no_grad():
        want = ref.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=12,
                            do_sample=False, num_beams=beams.get("num_beams", 1), early_stopping=False,
                            length_penalty=1.0)[:, 1:].numpy()  # fmt: skip
    got = rt.generate(ids, mask, max_new_tokens=12, strategy=strategy, **beams).tokens
    width = max(want.shape[1], got.shape[1])
    pad = [_after_eos_as_pad(np.pad(a, ((0, 0), (0, width - a.shape[1])))) for a in (want, got)]
    assert np.array_equal(*pad), f"{layout} {strategy}:\n{want}\n{got}"
    assert (want == 1).any(), "the test model should reach EOS"


def _after_eos_as_pad(tokens: np.ndarray) -> np.ndarray:
    """Rows with every token after the first EOS set to the pad id (transformers' beam search fills
    them with EOS)."""
    ended = np.cumsum(tokens == 1, axis=1) - (tokens == 1) > 0
    return np.where(ended, 0, tokens)


def test_text_in_and_out_and_streaming(exported):
    _, ref, tokenizer, rt = exported
    texts = CORPUS[:3]
    batch = tokenizer(texts, return_tensors="pt", padding=True, return_token_type_ids=False)
    with torch.no_grad():
        want = ref.generate(**batch, max_new_tokens=10, do_sample=False, num_beams=1)
    answers = rt.generate_text(texts, max_new_tokens=10)
    assert answers == tokenizer.batch_decode(want, skip_special_tokens=True)
    pieces = list(rt.stream_text(texts[0], max_new_tokens=10))
    assert "".join(pieces) == answers[0] and len(pieces) > 1


def test_cli_runs_a_t5_export(exported, tmp_path):
    from click.testing import CliRunner

    from edgeattn.cli import cli

    _, _, _, rt = exported
    text = CORPUS[1]
    beam = CliRunner().invoke(cli, ["run", str(rt.export_dir), text, "--strategy", "beam", "--beams", "3",
                                    "--max-new-tokens", "10"])  # fmt: skip
    assert beam.exit_code == 0, beam.output
    assert beam.output.strip() == rt.generate_text([text], 10, strategy="beam", num_beams=3)[0].strip()
    stream = CliRunner().invoke(cli, ["run", str(rt.export_dir), text, "--stream", "--max-new-tokens", "10"])
    assert stream.exit_code == 0 and stream.output.strip() == rt.generate_text([text], 10)[0].strip()


# ---------------------------------------------------------------------------- bad folders
def _broken(tmp_path: Path, change: str) -> Path:
    folder = t5_folder(tmp_path / "hf", "v1.1")
    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(folder / "model.safetensors")
    if change == "silu":
        config["feed_forward_proj"], config["dense_act_fn"] = "gated-silu", "silu"
    elif change == "no-lm-head":
        del tensors["lm_head.weight"]
    elif change == "stray":
        tensors["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"] = torch.zeros(8, 3)
    elif change == "shape":
        tensors["encoder.block.1.layer.0.SelfAttention.q.weight"] = torch.zeros(32, 32)
    elif change == "no-d_kv":
        del config["d_kv"]
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("silu", "feed_forward_proj 'gated-silu' with dense_act_fn 'silu' is not one of"),
        ("no-lm-head", "unties the output layer but the weights have no lm_head.weight"),
        ("stray", "does not use: decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"),
        ("shape", r"encoder.layers.1.self_attn.q_proj.weight has shape \(32, 32\), the model expects \(24, 32\)"),
        ("no-d_kv", "lacks 'd_kv'"),
    ],
)
def test_bad_folders_fail_with_one_line(tmp_path, change, message):
    with pytest.raises((ConfigError, CheckpointError), match=message) as info:
        import_folder(_broken(tmp_path, change))
    assert "\n" not in str(info.value)


def test_a_tied_output_layer_saved_apart_must_equal_the_embedding(tmp_path):
    folder = t5_folder(tmp_path / "hf", "t5")
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = tensors["shared.weight"].clone()
    save_file(tensors, str(folder / "model.safetensors"))
    import_folder(folder)  # equal: accepted
    tensors["lm_head.weight"][0, 0] += 1
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="lm_head.weight .the output layer. differs from shared.weight"):
        import_folder(folder)
