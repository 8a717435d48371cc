"""Decoder-only language models from local Hugging Face folders: GPT-2, Llama (2, 3, 3.1, 3.2,
SmolLM2), Qwen2, Qwen3, Phi-3, Mistral, SmolLM3, Gemma 2 and Gemma 3, as a
:class:`~edgeattn.families.causal.model.CausalLM`.

``config.json`` is mapped onto a :class:`~edgeattn.families.causal.model.CausalLMConfig` and every
tensor lands on exactly one parameter with its shape asserted (``edgeattn.weights.load_state``).
Facts the mapping encodes: GPT-2 stores its projections as ``Conv1D`` (weights transposed), packs
q, k and v in ``c_attn``, adds learned positions and uses ``gelu_new``; Llama and Qwen use RMS
norm, SwiGLU and rotary positions (Qwen2 with q/k/v biases, Qwen3 with an RMS norm of each head's
queries and keys); Phi-3 packs ``qkv_proj`` and ``gate_up_proj``; Llama 3.1 / 3.2 scale the rotary
frequencies (``rope_scaling`` type ``llama3``); Mistral slides a window over every layer, others
over the layers ``layer_types`` names; SmolLM3 leaves rotation out of the layers
``no_rope_layers`` marks 0; Gemma's differences are :mod:`~edgeattn.families.causal.gemma`'s.
Nothing is downloaded; ``transformers`` is not needed.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from edgeattn.errors import CheckpointError, ConfigError
from edgeattn.families.causal import gemma, moe
from edgeattn.families.causal.model import CausalLM, CausalLMConfig
from edgeattn.runtime.families.causal.chat import load_chat_template
from edgeattn.runtime.jsonfile import read_json_object
from edgeattn.weight_file import parameters_on_meta
from edgeattn.weights import load_state

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from edgeattn.hf import HFModel, Importer

#: what a decoder-only model's export is for (its family's task)
TASK = "complete"

#: architecture -> the model_type its config.json names
ARCHITECTURES = {
    "GPT2LMHeadModel": "gpt2",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "MistralForCausalLM": "mistral",
    "SmolLM3ForCausalLM": "smollm3",
    **gemma.ARCHITECTURES,
    **moe.ARCHITECTURES,
}
#: architectures whose config ties the output layer to the embedding unless it says otherwise
_TIED_BY_DEFAULT = ("SmolLM3ForCausalLM", *gemma.ARCHITECTURES)
_ACTIVATIONS = {"silu": "silu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def _need(hf: dict[str, Any], path: Path, *keys: str) -> Any:
    for key in keys:
        if hf.get(key) is not None:
            return hf[key]
    raise ConfigError(f"{path} lacks {keys[0]!r}")


def _activation(name: Any, path: Path) -> str:
    if name not in _ACTIVATIONS:
        raise ConfigError(f"{path}: activation {name!r} is not one of {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


#: rope kind -> the fields transformers reads for it (4.x's rope_scaling and 5.x's rope_parameters alike)
_ROPE_FIELDS = {
    "default": (), "linear": ("factor",), "dynamic": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"),
    "longrope": ("short_factor", "long_factor", "factor", "attention_factor", "original_max_position_embeddings"),
}  # fmt: skip
_ROPE_COMMON = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


def _rope_fields(hf: dict[str, Any], path: Path) -> dict[str, Any]:
    """The rotary settings of a config.json in either layout, merged: transformers 5's
    ``rope_parameters`` and 4.x's top-level ``rope_theta`` / ``partial_rotary_factor`` and
    ``rope_scaling``; a value the two layouts both give must agree."""
    params = hf.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise ConfigError(f"{path}: rope_parameters must be an object, got {params!r}")
    if params and all(isinstance(v, dict) for v in params.values()):
        raise ConfigError(f"{path}: rope_parameters per layer type ({', '.join(params)}) are not supported")
    legacy = hf.get("rope_scaling") or {}
    if not isinstance(legacy, dict):
        raise ConfigError(f"{path}: rope_scaling must be an object, got {legacy!r}")
    merged = dict(legacy)
    for key in ("rope_theta", "partial_rotary_factor"):
        if hf.get(key) is not None:
            merged[key] = hf[key]
    if "type" in merged and "rope_type" not in merged:
        merged["rope_type"] = merged["type"]
    for key, value in (params or {}).items():
        key = "rope_type" if key == "type" else key
        if merged.get(key) is not None and value is not None and merged[key] != value:
            raise ConfigError(f"{path}: {key} is {merged[key]!r} at the top level / in rope_scaling but {value!r} in "
                              f"rope_parameters; which one the model was trained with is unclear")  # fmt: skip
        if value is not None:
            merged[key] = value
    merged.pop("type", None)
    return merged


def rope_settings(hf: dict[str, Any], path: Path, max_len: int) -> dict[str, Any]:
    """The CausalLMConfig fields of a config.json's rotary positions: ``rope_theta``, ``rope_type``,
    ``rope_scaling``, ``rotary_fraction`` and, where the scaling only holds within a window,
    ``max_len``. A rope type or field edgeattn does not implement is a ConfigError naming it."""
    fields = _rope_fields(hf, path)
    kind = str(fields.get("rope_type") or "default")
    if kind not in _ROPE_FIELDS:
        raise ConfigError(f"{path}: rope type {kind!r} is not one edgeattn implements ({', '.join(_ROPE_FIELDS)})")
    unknown = sorted(set(fields) - set(_ROPE_FIELDS[kind]) - set(_ROPE_COMMON))
    if unknown:
        raise ConfigError(f"{path}: rope field(s) {', '.join(unknown)} of rope type {kind} are not ones edgeattn "
                          f"implements ({', '.join(_ROPE_FIELDS[kind]) or 'it takes none'})")  # fmt: skip
    out: dict[str, Any] = {"rope_theta": float(fields.get("rope_theta") or 10000.0),
                           "rotary_fraction": float(fields.get("partial_rotary_factor") or 1.0), "max_len": max_len}
    top_original = hf.get("original_max_position_embeddings")  # Phi-3 keeps it at the top level
    original = fields.get("original_max_position_embeddings") or top_original

    def number(key: str) -> float:
        if not isinstance(fields.get(key), int | float) or isinstance(fields.get(key), bool):
            raise ConfigError(f"{path}: rope type {kind} needs a number {key}, got {fields.get(key)!r}")
        return float(fields[key])

    if kind == "default":
        return {**out, "rope_type": "default", "rope_scaling": ()}
    if kind == "linear":
        return {**out, "rope_type": "linear", "rope_scaling": (("factor", number("factor")),)}
    if kind == "dynamic":  # dynamic NTK equals the plain frequencies up to the window it was trained on
        number("factor")
        window = min(max_len, int(original or max_len))
        if window < max_len:
            log.warning("%s: dynamic rope rescales past %d tokens; the export's context is %d", path, window, window)
        return {**out, "max_len": window, "rope_type": "default", "rope_scaling": ()}
    if kind == "llama3":
        keys = _ROPE_FIELDS["llama3"]
        return {**out, "rope_type": "llama3", "rope_scaling": tuple((k, number(k)) for k in keys)}
    if kind == "yarn":
        scaling: list[tuple[str, float]] = [("factor", number("factor")),
                                            ("original_max_position_embeddings", float(original or max_len))]
        for key in _ROPE_FIELDS["yarn"][2:]:
            if fields.get(key) is not None:
                scaling.append((key, float(bool(fields[key])) if key == "truncate" else number(key)))
        return {**out, "rope_type": "yarn", "rope_scaling": tuple(scaling)}
    # longrope (Phi-3): the short factors up to the original window, the long ones past it
    if not original:
        raise ConfigError(f"{path}: rope type longrope needs original_max_position_embeddings")
    short = fields.get("short_factor")
    if not isinstance(short, list) or not all(isinstance(v, int | float) for v in short):
        raise ConfigError(f"{path}: rope type longrope needs a list short_factor, got {short!r}")
    factor = fields.get("factor") or max_len / float(original)
    attention = fields.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(float(original)))
    window = min(max_len, int(original))
    if window < max_len:
        log.warning("%s: longrope's long factors take over past %d tokens, which edgeattn does not export; "
                    "the export's context is %d (of %d)", path, window, window, max_len)  # fmt: skip
    return {**out, "max_len": window, "rope_type": "longrope", "rope_scaling": (
        ("short_factor", tuple(float(v) for v in short)), ("attention_factor", float(attention)),
        ("original_max_position_embeddings", float(original)))}  # fmt: skip


def checkpoint_dtype(hf: dict[str, Any]) -> str | None:
    """The dtype the weights were saved in: transformers 5's ``dtype`` or 4.x's ``torch_dtype``."""
    value = hf.get("dtype") or hf.get("torch_dtype")
    return None if value is None else str(value)


def map_config(hf: dict[str, Any], architecture: str, path: Path) -> CausalLMConfig:
    """The CausalLMConfig of a decoder-only config.json."""
    if architecture == "GPT2LMHeadModel":
        d = int(_need(hf, path, "n_embd"))
        return CausalLMConfig(
            vocab_size=int(_need(hf, path, "vocab_size")), d_model=d, n_layers=int(_need(hf, path, "n_layer")),
            n_heads=int(_need(hf, path, "n_head")), n_kv_heads=int(_need(hf, path, "n_head")),
            d_ff=int(hf.get("n_inner") or 4 * d), max_len=int(_need(hf, path, "n_positions")), norm="layernorm",
            norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
            activation=_activation(hf.get("activation_function", "gelu_new"), path), gated=False,
            position="learned", qkv_bias=True, out_bias=True, mlp_bias=True,
            tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        )  # fmt: skip
    heads = int(_need(hf, path, "num_attention_heads"))
    d = int(_need(hf, path, "hidden_size"))
    head_dim = int(hf.get("head_dim") or d // heads)
    n_layers = int(_need(hf, path, "num_hidden_layers"))
    is_gemma = architecture in gemma.ARCHITECTURES
    rope_view, local_theta = gemma.rope_views(hf, path) if is_gemma else (hf, 0.0)
    fields: dict[str, Any] = dict(
        vocab_size=int(_need(hf, path, "vocab_size")), d_model=d, n_layers=n_layers,
        n_heads=heads, n_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=head_dim if head_dim != d // heads else 0, d_ff=int(_need(hf, path, "intermediate_size")),
        norm="rmsnorm", norm_eps=float(_need(hf, path, "rms_norm_eps")),
        activation=_activation(hf.get("hidden_act") or hf.get("hidden_activation") or "silu", path),
        **rope_settings(rope_view, path, int(_need(hf, path, "max_position_embeddings"))),
        qkv_bias=architecture == "Qwen2ForCausalLM" or bool(hf.get("attention_bias", False)),
        out_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)), qk_norm=architecture in ("Qwen3ForCausalLM", *moe.ARCHITECTURES),
        tie_embeddings=bool(hf.get("tie_word_embeddings", architecture in _TIED_BY_DEFAULT)),
        **window_settings(hf, architecture, path, n_layers),
    )  # fmt: skip
    if local_theta and "sliding" in fields["layer_types"]:
        fields["local_rope_theta"] = local_theta
    no_rope = hf.get("no_rope_layers")  # SmolLM3: 1 where a layer rotates, 0 where it does not
    if no_rope is not None:
        if not isinstance(no_rope, list) or len(no_rope) != n_layers:
            raise ConfigError(f"{path}: no_rope_layers must list one 0 or 1 a layer, got {no_rope!r}")
        fields["nope_layers"] = tuple(i for i, rotates in enumerate(no_rope) if not rotates)
    if is_gemma:
        fields.update(gemma.config_fields(hf, architecture, path))
    if architecture in moe.ARCHITECTURES:
        fields.update(moe.config_fields(hf, path, n_layers))
    return CausalLMConfig(**fields)


def window_settings(hf: dict[str, Any], architecture: str, path: Path, n_layers: int) -> dict[str, Any]:
    """``sliding_window`` and ``layer_types`` of a config.json: its ``layer_types`` where it lists
    them (Gemma's defaults where it does not), every layer sliding for Mistral with a window."""
    types = hf.get("layer_types")
    if types is None and architecture in gemma.ARCHITECTURES:
        types = gemma.default_layer_types(hf, architecture, n_layers)
    if types is None and architecture == "MistralForCausalLM" and hf.get("sliding_window"):
        types = ["sliding_attention"] * n_layers
    if types is None:
        return {}
    names = {"full_attention": "full", "sliding_attention": "sliding"}
    if not isinstance(types, list) or len(types) != n_layers or not set(types) <= set(names):
        raise ConfigError(f"{path}: layer_types must name full_attention or sliding_attention for each of the "
                          f"{n_layers} layers, got {types!r}")  # fmt: skip
    if "sliding_attention" not in types:
        return {}
    window = hf.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ConfigError(f"{path}: sliding layers need a positive sliding_window, got {window!r}")
    return {"sliding_window": window, "layer_types": tuple(names[t] for t in types)}


_LLAMA_LAYER = {
    "input_layernorm.weight": "norm1.weight", "post_attention_layernorm.weight": "norm2.weight",
    **{f"self_attn.{p}_proj.{w}": f"attn.{p}_proj.{w}" for p in "qkvo" for w in ("weight", "bias")},
    "self_attn.q_norm.weight": "attn.q_norm.weight", "self_attn.k_norm.weight": "attn.k_norm.weight",
    **{f"mlp.{p}_proj.{w}": f"ff.{p}_proj.{w}" for p in ("gate", "up", "down") for w in ("weight", "bias")},
}  # fmt: skip
_GPT2_LAYER = {"ln_1": "norm1", "ln_2": "norm2", "attn.c_proj": "attn.o_proj", "mlp.c_fc": "ff.up_proj",
               "mlp.c_proj": "ff.down_proj"}  # fmt: skip


def _llama_tensors(tensors: dict[str, torch.Tensor], config: CausalLMConfig, source: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[str, torch.Tensor]] = {}  # layer -> its router's and experts' tensors
    for key, value in tensors.items():
        if key in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            out[{"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight"}.get(key, key)] = value
            continue
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", key)
        if m is None:
            raise CheckpointError(f"{source}: tensor {key} is not one edgeattn maps")
        layer, rest = m.groups()
        if config.n_experts and moe.is_expert_tensor(rest):
            experts.setdefault(layer, {})[rest] = value
            continue
        if rest in ("self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"):  # Phi-3 packs them
            if rest.startswith("self_attn"):
                d, q, kv = config.dim, config.n_heads, config.n_kv_heads
                parts = dict(zip("qkv", value.split([q * d, kv * d, kv * d]), strict=True))
                out.update({f"layers.{layer}.attn.{p}_proj.weight": t for p, t in parts.items()})
            else:
                gate, up = value.chunk(2, dim=0)
                out[f"layers.{layer}.ff.gate_proj.weight"], out[f"layers.{layer}.ff.up_proj.weight"] = gate, up
            continue
        if rest not in _LLAMA_LAYER:
            raise CheckpointError(f"{source}: tensor {key} is not one edgeattn maps")
        out[f"layers.{layer}.{_LLAMA_LAYER[rest]}"] = value
    return {**out, **moe.stack_experts(experts, config.n_experts, source)}


def _gpt2_tensors(tensors: dict[str, torch.Tensor], config: CausalLMConfig, source: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        key = key.removeprefix("transformer.")
        if key.endswith(".attn.bias") or key.endswith(".attn.masked_bias"):  # causal-mask buffers, not weights
            continue
        top = {"wte.weight": "embed.weight", "wpe.weight": "pos_embed.weight", "ln_f.weight": "norm.weight",
               "ln_f.bias": "norm.bias", "lm_head.weight": "lm_head.weight"}  # fmt: skip
        if key in top:
            out[top[key]] = value
            continue
        m = re.fullmatch(r"h\.(\d+)\.(.+)\.(weight|bias)", key)
        if m is None:
            raise CheckpointError(f"{source}: tensor {key} is not one edgeattn maps")
        layer, module, kind = m.groups()
        if module == "attn.c_attn":  # Conv1D: (in, 3 * out) weight, q k v side by side
            parts = value.split(config.d_model, dim=-1)
            for p, t in zip("qkv", parts, strict=True):
                out[f"layers.{layer}.attn.{p}_proj.{kind}"] = t.t() if kind == "weight" else t
            continue
        if module not in _GPT2_LAYER:
            raise CheckpointError(f"{source}: tensor {key} is not one edgeattn maps")
        conv = kind == "weight" and module != "ln_1" and module != "ln_2"  # Conv1D weights are stored transposed
        out[f"layers.{layer}.{_GPT2_LAYER[module]}.{kind}"] = value.t() if conv else value
    return out


_TENSORS: dict[str, Callable[[dict[str, torch.Tensor], CausalLMConfig, str], dict[str, torch.Tensor]]] = {
    "GPT2LMHeadModel": _gpt2_tensors,
    **dict.fromkeys(set(ARCHITECTURES) - {"GPT2LMHeadModel", *gemma.ARCHITECTURES}, _llama_tensors),
    **dict.fromkeys(gemma.ARCHITECTURES, gemma.map_tensors),
}


def map_tensors(tensors: dict[str, torch.Tensor], config: CausalLMConfig, architecture: str, source: str
                ) -> dict[str, torch.Tensor]:  # fmt: skip
    """The folder's tensors under edgeattn's names (a tied head's copy dropped when it equals the embedding)."""
    out = _TENSORS[architecture](tensors, config, source)
    if config.tie_embeddings and "lm_head.weight" in out:
        if not torch.equal(out.pop("lm_head.weight"), out["embed.weight"]):
            raise CheckpointError(f"{source}: config.json ties the output layer but lm_head.weight differs")
    return out


def special_ids(hf: dict[str, Any], folder: Path) -> tuple[int, int, int, list[int]]:
    """(pad, bos, eos, stop ids) of a folder: ``generation_config.json``'s end-of-sequence ids (a chat
    model may list several) before ``config.json``'s; the pad id is the first stop id when none is set."""
    generation_path = folder / "generation_config.json"
    generation = read_json_object(generation_path, ConfigError) if generation_path.is_file() else {}

    def ids(key: str) -> list[int]:
        for data in (generation, hf):
            value = data.get(key)
            if value is not None:
                values = value if isinstance(value, list) else [value]
                if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                    raise ConfigError(f"{folder}: {key} {value!r} is not token ids")
                inside = [v for v in values if 0 <= v < hf["vocab_size"]]
                if len(inside) < len(values):  # a token the model cannot produce ends nothing
                    log.warning("%s: %s %s lies outside the vocabulary of %d; left out", folder, key, value,
                                hf["vocab_size"])  # fmt: skip
                return inside
        return []

    stops = ids("eos_token_id")
    bos = (ids("bos_token_id") or stops or [0])[0]
    pad = (ids("pad_token_id") or stops or [0])[0]
    return pad, bos, (stops or [0])[0], stops


def importers() -> list[Importer]:
    """The causal family's architectures (its record's ``importers``)."""
    from edgeattn.hf import Importer

    return [Importer(name, "causal", model_type, TASK, import_causal, reference_outputs, (model_type,))
            for name, model_type in ARCHITECTURES.items()]  # fmt: skip


def import_causal(folder: Path, hf: dict[str, Any], importer: Importer, task: str) -> HFModel:
    """A decoder-only checkpoint as a :class:`CausalLM` with its tokenizer, chat template and stop ids
    (one of :data:`edgeattn.hf.IMPORTERS`)."""
    from edgeattn.hf import HFModel, read_tensors, tokenizer_of

    architecture = importer.architecture
    if task not in ("", TASK):
        raise ConfigError(f"{architecture} is a language model; its task is {TASK}, not {task}")
    path = folder / "config.json"
    section = map_config(hf, architecture, path)
    pad, bos, eos, stops = special_ids(hf, folder)
    with parameters_on_meta():  # storage given by load_state, in a file the system can page
        model = CausalLM(section.model_config(pad_id=pad, bos_id=bos, eos_id=eos))
    source = str(folder)
    load_state(model, map_tensors(read_tensors(folder), section, architecture, source), source, model.tied_aliases())
    return HFModel(model.eval(), architecture, TASK, None, None, folder, tokenizer_of(folder),
                   load_chat_template(folder), stops or [eos])  # fmt: skip


def reference_outputs(model: CausalLM, reference: Any, ids: torch.Tensor, mask: torch.Tensor
                      ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """Next-token logits at every position, beside transformers'."""
    return {"logits": (model(ids, mask), reference(input_ids=ids, attention_mask=mask).logits)}


def import_causal_folder(folder: str | Path) -> CausalLM:
    """The decoder-only model of a local Hugging Face folder, every tensor mapped with its shape asserted."""
    from edgeattn.hf import import_folder

    hf = import_folder(folder)
    if not isinstance(hf.model, CausalLM):
        raise ConfigError(f"{folder} holds a {hf.architecture}, not a language model: "
                          f"edgeattn's are {', '.join(ARCHITECTURES)}")  # fmt: skip
    return hf.model
