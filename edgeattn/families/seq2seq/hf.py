"""T5, T5 v1.1 / Flan-T5 and mT5 ``ForConditionalGeneration`` checkpoints from local Hugging Face
folders, as an edgeattn :class:`Seq2SeqTransformer`.

Facts the mapping encodes (each one a re-implementation easily gets wrong): attention scores are
not scaled by 1/√d; the norms are RMS norms with no mean and no bias, before each block (pre-norm),
with a final norm closing each stack; the relative-position bias is a bucketed table per head,
bidirectional in the encoder and causal in the decoder, stored in the first block of each stack
and used by every layer, with none in cross-attention; a head may be narrower than
d_model / heads (``d_kv``); the original layout has a ReLU feed-forward and an output layer tied to
the shared embedding, the decoder output then scaled by d_model^-0.5 before it; v1.1 has a gated
feed-forward with GELU's tanh form (``gelu_new``) and a separate output layer; decoding starts from
the pad token and ends at EOS (id 1). Every tensor lands on exactly one edgeattn parameter with
its shape asserted.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from edgeattn.config import ModelConfig
from edgeattn.errors import CheckpointError, ConfigError
from edgeattn.weight_file import parameters_on_meta

if TYPE_CHECKING:
    from edgeattn.hf import HFModel, Importer

log = logging.getLogger(__name__)

#: what an encoder-decoder is for: text in, text out
TASK = "generate"

#: model_type -> its ForConditionalGeneration architecture
ARCHITECTURES = {"t5": "T5ForConditionalGeneration", "mt5": "MT5ForConditionalGeneration"}
#: (feed_forward_proj, dense_act_fn) -> edgeattn activation
_FEED_FORWARD = {
    ("relu", "relu"): "relu",
    ("gated-gelu", "gelu_new"): "gated-gelu_tanh",
    ("gated-gelu", "gelu_pytorch_tanh"): "gated-gelu_tanh",
    ("gated-gelu", "gelu"): "gated-gelu",
}
_ATTENTION = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
#: (stack, sub-layer index) -> (edgeattn block, its norm)
_SUBLAYERS = {
    ("encoder", "0"): ("self_attn", "norm1"), ("encoder", "1"): ("ff", "norm2"),
    ("decoder", "0"): ("self_attn", "norm1"), ("decoder", "1"): ("cross_attn", "norm2"),
    ("decoder", "2"): ("ff", "norm3"),
}  # fmt: skip
_FF = {"wi": "linear1", "wi_0": "linear1", "wi_1": "gate", "wo": "linear2"}


def feed_forward(hf: dict[str, Any], path: object) -> str:
    """The edgeattn activation of a T5 config's feed-forward, or a ConfigError naming it."""
    proj = str(hf.get("feed_forward_proj", "relu"))
    act = str(hf.get("dense_act_fn") or ("gelu_new" if proj == "gated-gelu" else proj.removeprefix("gated-")))
    if (proj, act) not in _FEED_FORWARD:
        known = ", ".join(f"{p} ({a})" for p, a in _FEED_FORWARD)
        raise ConfigError(f"{path}: feed_forward_proj {proj!r} with dense_act_fn {act!r} is not one of {known}")
    return _FEED_FORWARD[(proj, act)]


def map_config(hf: dict[str, Any], tied: bool, path: object) -> ModelConfig:
    """The edgeattn config of a T5 config.json; ``tied``: the output layer is the shared embedding."""

    def need(key: str) -> Any:
        if key not in hf:
            raise ConfigError(f"{path} lacks {key!r}")
        return hf[key]

    pad = int(hf.get("pad_token_id") or 0)
    start = hf.get("decoder_start_token_id")
    eos = hf.get("eos_token_id", 1)
    eos = eos[0] if isinstance(eos, list) and eos else eos
    scale = bool(hf["scale_decoder_outputs"]) if "scale_decoder_outputs" in hf else tied
    layers = int(need("num_layers"))
    try:
        return ModelConfig(
            architecture="encoder-decoder", vocab_size=int(need("vocab_size")), d_model=int(need("d_model")),
            n_heads=int(need("num_heads")), d_kv=int(need("d_kv")), d_ff=int(need("d_ff")),
            n_encoder_layers=layers, n_decoder_layers=int(hf.get("num_decoder_layers") or layers),
            max_len=int(hf.get("n_positions") or 512), dropout=0.0, activation=feed_forward(hf, path),  # type: ignore[arg-type]
            norm="rmsnorm", norm_eps=float(hf.get("layer_norm_epsilon", 1e-6)), norm_first=True, position="t5",
            relative_buckets=int(hf.get("relative_attention_num_buckets", 32)),
            relative_max_distance=int(hf.get("relative_attention_max_distance", 128)), relative_shared=True,
            attention_scaled=False, bias=False, scale_embedding=False, embedding_norm=False, tie_embeddings=tied,
            scale_decoder_output=scale, pad_id=pad, bos_id=pad if start is None else int(start),
            eos_id=int(eos),
        )  # fmt: skip
    except (ConfigError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path} does not describe a model edgeattn can build: {exc}") from exc


def map_key(key: str) -> str | None:
    """The edgeattn name of a T5 tensor, or None when edgeattn's T5 layout has no such tensor."""
    fixed = {"shared.weight": "embed.weight", "lm_head.weight": "lm_head.weight",
             "encoder.final_layer_norm.weight": "encoder.final_norm.weight",
             "decoder.final_layer_norm.weight": "decoder.final_norm.weight"}  # fmt: skip
    if key in fixed:
        return fixed[key]
    m = re.match(r"(encoder|decoder)\.block\.(\d+)\.layer\.(\d)\.(.+)\.weight$", key)
    if not m:
        return None
    stack, block, sub, rest = m.groups()
    if (stack, sub) not in _SUBLAYERS:
        return None
    module, norm = _SUBLAYERS[(stack, sub)]
    prefix = f"{stack}.layers.{block}"
    if rest == "layer_norm":
        return f"{prefix}.{norm}.weight"
    attention = re.fullmatch(r"(SelfAttention|EncDecAttention)\.([qkvo])", rest)
    if attention and (attention.group(1) == "EncDecAttention") == (module == "cross_attn"):
        return f"{prefix}.{module}.{_ATTENTION[attention.group(2)]}.weight"
    if rest == "SelfAttention.relative_attention_bias" and module == "self_attn" and block == "0":
        return f"{prefix}.self_attn.relative.embedding.weight"
    dense = re.fullmatch(r"DenseReluDense\.(wi|wi_0|wi_1|wo)", rest)
    if dense and module == "ff":
        return f"{prefix}.ff.{_FF[dense.group(1)]}.weight"
    return None


def map_tensors(tensors: dict[str, torch.Tensor], config: ModelConfig, source: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under edgeattn's names. The stacks' own copies of the shared
    embedding (and a tied output layer saved anyway) must equal it; any other tensor with no
    place is an error naming it."""
    out: dict[str, torch.Tensor] = {}
    copies: dict[str, torch.Tensor] = {}
    unknown = []
    for key, value in tensors.items():
        if key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight") or (
            key == "lm_head.weight" and config.tie_embeddings
        ):
            copies[key] = value
            continue
        name = map_key(key)
        if name is None:
            unknown.append(key)
            continue
        out[name] = value
    if unknown:
        raise CheckpointError(f"{source} has tensor(s) edgeattn's T5 layout does not use: {', '.join(unknown[:8])}")
    if "embed.weight" not in out:
        embedded = [copies[k] for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight") if k in copies]
        if not embedded:
            raise CheckpointError(f"{source} is missing tensor(s): shared.weight")
        out["embed.weight"] = embedded[0]
    for key, value in copies.items():
        if value.shape != out["embed.weight"].shape or not torch.equal(value, out["embed.weight"]):
            what = "the output layer" if key == "lm_head.weight" else "a stack's embedding"
            raise CheckpointError(
                f"{source}: {key} ({what}) differs from shared.weight, but the config ties them (tie_word_embeddings)"
            )
    return out


def reference_outputs(model: Any, reference: Any, ids: torch.Tensor, mask: torch.Tensor
                      ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """Teacher-forced logits of the source's own first tokens as targets, beside transformers'."""
    targets = torch.cat([torch.full_like(ids[:, :1], model.config.bos_id), ids[:, :15]], dim=1)
    theirs = reference(input_ids=ids, attention_mask=mask, decoder_input_ids=targets).logits
    return {"logits": (model(ids, targets, mask), theirs)}


def importers() -> list[Importer]:
    """The seq2seq family's architectures (its record's ``importers``)."""
    from edgeattn.hf import Importer

    return [Importer(name, "seq2seq", "t5", TASK, import_t5, reference_outputs, tuple(ARCHITECTURES))
            for name in ARCHITECTURES.values()]  # fmt: skip


def import_t5(folder: Path, hf: dict[str, Any], importer: Importer, task: str) -> HFModel:
    """A T5-family checkpoint as a :class:`~edgeattn.families.seq2seq.model.Seq2SeqTransformer`."""
    from edgeattn.families.seq2seq.model import Seq2SeqTransformer
    from edgeattn.hf import HFModel, read_tensors, tokenizer_of
    from edgeattn.model import build_model
    from edgeattn.weights import load_state

    architecture = importer.architecture
    if task not in ("", TASK):
        raise ConfigError(f"{architecture} has no {task} head; its task is {TASK}")
    tensors = read_tensors(folder)
    tied = bool(hf.get("tie_word_embeddings", True))
    if not tied and "lm_head.weight" not in tensors:
        raise CheckpointError(f"{folder}: config.json unties the output layer but the weights have no lm_head.weight")
    config = map_config(hf, tied, folder / "config.json")
    with parameters_on_meta():  # storage given by load_state, in a file the system can page
        model = build_model(config)
    assert isinstance(model, Seq2SeqTransformer)
    source = f"{folder}"
    load_state(model, map_tensors(tensors, config, source), source, model.tied_aliases())
    log.info("imported %s from %s for generation", architecture, folder)
    return HFModel(model.eval(), architecture, TASK, None, None, folder, tokenizer_of(folder))
