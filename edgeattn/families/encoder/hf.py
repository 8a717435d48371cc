"""The encoder family's Hugging Face import: BERT, RoBERTa (and the checkpoints that share its layout:
XLM-RoBERTa, CamemBERT) and DistilBERT, bare or with a sequence- or token-classification head, become
an edgeattn :class:`~edgeattn.families.encoder.model.EncoderModel`: ``config.json`` is mapped onto a
:class:`ModelConfig`, and every tensor lands on exactly one edgeattn parameter with its shape asserted.

Facts the mapping encodes: BERT adds token-type (segment) embeddings and has a tanh pooler before
its sequence classifier; RoBERTa's positions start after its padding index and count only real
tokens, its single token-type row is folded into the position table, and its classification head
is a tanh dense layer on the first token; DistilBERT has its own key names, no token types, and a
ReLU pre-classifier. All three are post-LN with an embedding LayerNorm and exact GELU.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from edgeattn.config import ModelConfig
from edgeattn.errors import CheckpointError, ConfigError
from edgeattn.families.encoder.model import EncoderModel
from edgeattn.model import build_model
from edgeattn.runtime.manifest import EmbeddingPooling
from edgeattn.weight_file import parameters_on_meta
from edgeattn.weights import load_state

if TYPE_CHECKING:
    from edgeattn.hf import HFModel, Importer

log = logging.getLogger(__name__)

#: an encoder's model_type -> the layout its weights use
LAYOUTS = {"bert": "bert", "roberta": "roberta", "xlm-roberta": "roberta", "camembert": "roberta",
           "distilbert": "distilbert"}  # fmt: skip


#: architecture suffix -> task
HEADS = {"Model": "encode", "ForSequenceClassification": "classify", "ForTokenClassification": "tag"}


_PREFIX = {"Bert": "bert", "Roberta": "roberta", "XLMRoberta": "roberta", "Camembert": "roberta",
           "DistilBert": "distilbert"}  # fmt: skip


def importers() -> list[Importer]:
    """The encoder family's architectures: BERT, RoBERTa (XLM-RoBERTa, CamemBERT) and DistilBERT,
    bare or with a sequence- or token-classification head."""
    from edgeattn.hf import Importer

    return [Importer(f"{prefix}{suffix}", "encoder", layout, task, _import_encoder, encoder_reference,
                     tuple(t for t, of in LAYOUTS.items() if of == layout))
            for prefix, layout in _PREFIX.items() for suffix, task in HEADS.items()]  # fmt: skip


def encoder_reference(model: EncoderModel, reference: Any, ids: torch.Tensor, mask: torch.Tensor
                      ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """An encoder's last hidden states (and its head's logits) beside transformers'."""
    hidden, logits = model(ids, mask)
    theirs = reference(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    want = theirs.last_hidden_state if getattr(theirs, "last_hidden_state", None) is not None else \
        theirs.hidden_states[-1]  # fmt: skip
    out = {"hidden states": (hidden, want)}
    if logits is not None and getattr(theirs, "logits", None) is not None:
        out["logits"] = (logits, theirs.logits)
    return out


_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def map_config(hf: dict[str, Any], family: str, task: str, labels: list[str] | None, pooler: bool,
               path: Path) -> ModelConfig:  # fmt: skip
    """The edgeattn config of a Hugging Face config.json (``pooler``: the checkpoint has one)."""

    def need(*keys: str) -> Any:
        for key in keys:
            if key in hf:
                return hf[key]
        raise ConfigError(f"{path} lacks {keys[0]!r}")

    if family == "distilbert":
        d, heads, ff, layers = need("dim"), need("n_heads"), need("hidden_dim"), need("n_layers")
        act, eps, types = need("activation"), 1e-12, 0
    else:
        d, heads = need("hidden_size"), need("num_attention_heads")
        ff, layers = need("intermediate_size"), need("num_hidden_layers")
        act, eps, types = need("hidden_act"), float(hf.get("layer_norm_eps", 1e-12)), int(hf.get("type_vocab_size", 2))
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise ConfigError(f"{path}: position_embedding_type {hf['position_embedding_type']!r} is not supported")
    if act not in _ACTIVATIONS:
        raise ConfigError(f"{path}: activation {act!r} is not one of {', '.join(_ACTIVATIONS)}")
    pad = int(hf.get("pad_token_id") or 0)
    positions = int(need("max_position_embeddings"))
    offset = pad + 1 if family == "roberta" else 0
    head = {"classify": "sequence", "tag": "token"}.get(task, "none")
    fold = family == "roberta" and types == 1  # one token-type row: added to every position instead
    try:
        return ModelConfig(
            architecture="encoder", vocab_size=int(need("vocab_size")), d_model=int(d), n_heads=int(heads),
            d_ff=int(ff), n_encoder_layers=int(layers), n_decoder_layers=0, max_len=positions - offset, dropout=0.0,
            activation=_ACTIVATIONS[act], norm="layernorm", norm_eps=eps, norm_first=False, position="learned",
            scale_embedding=False, embedding_norm=True, tie_embeddings=False, head=head,
            num_labels=len(labels) if labels else int(hf.get("num_labels", 2)), pooling="first",
            pooler=("relu" if family == "distilbert" else "tanh") if pooler else "none",
            token_types=0 if fold or family == "distilbert" else types, position_offset=offset,
            pad_id=pad, bos_id=pad, eos_id=pad,
        )  # fmt: skip
    except (ConfigError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path} does not describe a model edgeattn can build: {exc}") from exc


_BERT_LAYER = {
    "attention.self.query": "self_attn.q_proj", "attention.self.key": "self_attn.k_proj",
    "attention.self.value": "self_attn.v_proj", "attention.output.dense": "self_attn.out_proj",
    "attention.output.LayerNorm": "norm1", "intermediate.dense": "ff.linear1", "output.dense": "ff.linear2",
    "output.LayerNorm": "norm2",
}  # fmt: skip


_DISTIL_LAYER = {
    "attention.q_lin": "self_attn.q_proj", "attention.k_lin": "self_attn.k_proj", "attention.v_lin": "self_attn.v_proj",
    "attention.out_lin": "self_attn.out_proj", "sa_layer_norm": "norm1", "ffn.lin1": "ff.linear1",
    "ffn.lin2": "ff.linear2", "output_layer_norm": "norm2",
}  # fmt: skip


def map_key(key: str, family: str) -> str | None:
    """The edgeattn name of a Hugging Face tensor, or None when the layout has no such tensor."""
    key = re.sub(rf"^{family}\.", "", key)
    if family == "distilbert":
        fixed = {
            "embeddings.word_embeddings": "embed",
            "embeddings.position_embeddings": "encoder.position",
            "embeddings.LayerNorm": "encoder.embed_norm",
            "pre_classifier": "pooler",
            "classifier": "classifier",
        }
        layer = re.match(r"transformer\.layer\.(\d+)\.(.+)\.(weight|bias)$", key)
        table = _DISTIL_LAYER
    else:
        fixed = {"embeddings.word_embeddings": "embed", "embeddings.position_embeddings": "encoder.position",
                 "embeddings.token_type_embeddings": "token_type", "embeddings.LayerNorm": "encoder.embed_norm",
                 "pooler.dense": "pooler", "classifier.dense": "pooler", "classifier.out_proj": "classifier",
                 "classifier": "classifier"}  # fmt: skip
        layer = re.match(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$", key)
        table = _BERT_LAYER
    if layer:
        name = table.get(layer.group(2))
        return None if name is None else f"encoder.layers.{layer.group(1)}.{name}.{layer.group(3)}"
    stem, _, leaf = key.rpartition(".")
    return f"{fixed[stem]}.{leaf}" if stem in fixed and leaf in ("weight", "bias") else None


def map_tensors(
    tensors: dict[str, torch.Tensor], family: str, config: ModelConfig, source: str
) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under edgeattn's names; a tensor with no place is an error naming it."""
    from edgeattn.hf import renamed

    kept = {}
    for key, value in tensors.items():
        if key.endswith("embeddings.position_ids"):  # a buffer older checkpoints saved: 0..max_len-1
            if not torch.equal(value.reshape(-1), torch.arange(value.numel(), dtype=value.dtype)):
                raise CheckpointError(f"{source}: {key} is not the positions 0..{value.numel() - 1}")
            continue
        kept[key] = value
    out = renamed(kept, lambda key: map_key(key, family), source, family)
    if family == "roberta" and not config.token_types and "token_type.weight" in out:
        rows = out.pop("token_type.weight")
        if rows.shape[0] != 1 or "encoder.position.weight" not in out:
            raise CheckpointError(f"{source}: a {tuple(rows.shape)} token-type table cannot be folded into positions")
        out["encoder.position.weight"] = out["encoder.position.weight"] + rows[0]
    return out


def sentence_pooling(folder: Path) -> EmbeddingPooling | None:
    """The pooling a sentence-transformers folder describes (``modules.json``), or None."""
    from edgeattn.hf import read_json

    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{modules_file} is not readable JSON: {exc}") from exc
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    pooling = EmbeddingPooling(normalize="Normalize" in kinds)
    if "Pooling" in kinds:
        config = read_json(folder / str(kinds["Pooling"].get("path", "1_Pooling")) / "config.json")
        modes = [m for m in ("mean", "cls", "max") if config.get(f"pooling_mode_{m}_tokens" if m != "cls" else
                                                                  "pooling_mode_cls_token")]  # fmt: skip
        if len(modes) != 1:
            raise ConfigError(f"{folder}: pooling {modes or 'none'} is not one of mean, cls, max")
        pooling.mode = modes[0]
    return pooling


def _import_encoder(folder: Path, hf: dict[str, Any], importer: Importer, task: str) -> HFModel:
    """A BERT-family checkpoint as an :class:`EncoderModel` for ``task`` (empty: what its head and
    a sentence-embedding folder's pooling imply)."""
    from edgeattn.hf import GENERATE, HFModel, label_names, read_tensors, tokenizer_of

    config_file = folder / "config.json"
    architecture, family, implied = importer.architecture, importer.layout, importer.task
    pooling = sentence_pooling(folder)
    if implied == "encode" and pooling is not None:
        implied = "embed"
    task = task or implied
    if (task in ("classify", "tag") or task == GENERATE) and implied != task:
        raise ConfigError(f"{architecture} has no {task} head; its task is {implied}")
    labels = label_names(hf, config_file) if task in ("classify", "tag") else None
    tensors = read_tensors(folder)
    if task in ("encode", "embed") and implied in ("classify", "tag"):  # --task asks for the encoder alone
        head = [k for k in tensors if re.match(r"(classifier|pre_classifier)\.", k)]
        log.info("task %s: leaving out the %s head's tensors %s", task, implied, head)
        tensors = {k: v for k, v in tensors.items() if k not in head}
    has_pooler = any(re.search(r"(^|\.)(pooler\.dense|classifier\.dense|pre_classifier)\.weight$", k) for k in tensors)
    config = map_config(hf, family, task, labels, has_pooler, config_file)
    with parameters_on_meta():  # storage given by load_state, in a file the system can page
        model = build_model(config)
    assert isinstance(model, EncoderModel)
    source = f"{folder}"
    load_state(model, map_tensors(tensors, family, config, source), source)
    log.info("imported %s (%s) from %s for %s", architecture, family, folder, task)
    pooling = (pooling or EmbeddingPooling()) if task == "embed" else None
    return HFModel(model.eval(), architecture, task, labels, pooling, folder, tokenizer_of(folder))
