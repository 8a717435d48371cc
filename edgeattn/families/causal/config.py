"""The decoder-only family's own section of a model config (torch-free).

:class:`CausalLMConfig` holds what a decoder-only language model needs beyond what every model
has: grouped-query heads, rotary positions and their scaling, the norm and feed-forward kinds,
biases. A :class:`~edgeattn.config.ModelConfig` of architecture ``decoder-only`` carries one as
its section (written as ``causal``), the shared fields (sizes, special token ids) mirrored from it:
:meth:`CausalLMConfig.model_config` builds one.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from edgeattn.errors import ConfigError

if TYPE_CHECKING:
    from edgeattn.config import ModelConfig

RopeLayout = Literal["rotate-half", "interleaved"]
#: rotary scaling kind -> (the parameters it needs, the ones it may have); every one is computed
#: as transformers' ``modeling_rope_utils`` computes it (see :mod:`edgeattn.rope`)
ROPE_TYPES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")),
    "longrope": (("short_factor", "attention_factor", "original_max_position_embeddings"), ()),
}  # fmt: skip
RopeValue = float | tuple[float, ...]
_CHOICES = {"norm": ("rmsnorm", "layernorm"), "activation": ("silu", "gelu_tanh", "gelu"),
            "position": ("rope", "learned"), "rope_layout": ("rotate-half", "interleaved")}  # fmt: skip


@dataclass(frozen=True)
class CausalLMConfig:
    """Every hyper-parameter of a decoder-only language model."""

    vocab_size: int = 1000
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    #: key/value heads (grouped-query attention); n_heads for plain multi-head attention
    n_kv_heads: int = 4
    #: width of one head; 0: d_model // n_heads
    head_dim: int = 0
    d_ff: int = 256
    max_len: int = 512
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norm_eps: float = 1e-6
    #: the feed-forward's activation; ``gated``: act(gate(x)) * up(x) (SwiGLU with silu)
    activation: Literal["silu", "gelu_tanh", "gelu"] = "silu"
    gated: bool = True
    #: "rope" (rotary, no table) or "learned" (GPT-2's position embedding)
    position: Literal["rope", "learned"] = "rope"
    rope_theta: float = 10000.0
    rope_layout: RopeLayout = "rotate-half"
    #: the share of each head's dimensions that rotate (Phi's partial rotary; 1.0 for the rest)
    rotary_fraction: float = 1.0
    #: how the rotary frequencies are scaled (a key of :data:`ROPE_TYPES`) and that kind's parameters
    #: (Llama 3's factor, low_freq_factor, ...; longrope's short_factor is one value a frequency)
    rope_type: str = "default"
    rope_scaling: tuple[tuple[str, RopeValue], ...] = ()
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    #: RMS norm of each head's queries and keys before the rotation (Qwen3)
    qk_norm: bool = False
    tie_embeddings: bool = True
    #: how far a sliding-window layer sees: its own token and the ``sliding_window - 1`` before it
    #: (counted in the row's real tokens); 0: no layer slides
    sliding_window: int = 0
    #: each layer's attention, ``full`` or ``sliding`` (Gemma's 5:1 and 1:1 patterns, Mistral's all
    #: sliding); empty: every layer full
    layer_types: tuple[str, ...] = ()
    #: the rotary base of the sliding layers, never scaled (Gemma 3's local base); 0: the layers' one rotation
    local_rope_theta: float = 0.0
    #: layers without rotary positions (SmolLM3's NoPE layers)
    nope_layers: tuple[int, ...] = ()
    #: a norm on each branch's output before it joins the residual stream (Gemma 2 and 3)
    sandwich_norm: bool = False
    #: the token embeddings times this (Gemma: the square root of d_model)
    embed_scale: float = 1.0
    #: the attention scores' scale; 0: 1 / sqrt(head width) (Gemma: query_pre_attn_scalar ** -0.5)
    attn_scale: float = 0.0
    #: tanh soft-capping, cap * tanh(x / cap), of the attention scores and of the logits (Gemma 2); 0: none
    attn_softcap: float = 0.0
    logit_softcap: float = 0.0
    #: a mixture of experts in place of the feed-forward (Qwen3-MoE): how many experts, how many a
    #: token is routed to (the router's softmax, its top ``experts_per_token``), each expert's
    #: width, and whether the chosen weights are normalised to sum to 1; 0 experts: every layer dense
    n_experts: int = 0
    experts_per_token: int = 0
    expert_d_ff: int = 0
    norm_topk: bool = False
    #: layers that keep the dense feed-forward (of ``d_ff``) in a mixture-of-experts model
    dense_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                raise ConfigError(f"causal config {name}={getattr(self, name)!r} is not one of {', '.join(choices)}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"causal LM config {name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if not self.head_dim and self.d_model % self.n_heads:
            raise ConfigError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}; set head_dim")
        rotary = int(self.dim * self.rotary_fraction)
        if self.position == "rope" and (rotary < 2 or rotary % 2):
            raise ConfigError(f"rotary dimensions must be even and at least 2, got {rotary}")
        if self.rope_type not in ROPE_TYPES:
            raise ConfigError(f"rope type {self.rope_type!r} is not one of {', '.join(ROPE_TYPES)}")
        needed, optional = ROPE_TYPES[self.rope_type]
        given = set(dict(self.rope_scaling))
        if not set(needed) <= given or not given <= set(needed) | set(optional):
            raise ConfigError(f"rope type {self.rope_type} takes {', '.join(needed + optional) or 'no parameters'} "
                              f"({', '.join(needed) or 'none'} required), got {', '.join(sorted(given)) or 'none'}")
        if self.layer_types and len(self.layer_types) != self.n_layers:
            raise ConfigError(f"layer_types names {len(self.layer_types)} layers; the model has {self.n_layers}")
        if set(self.layer_types) - {"full", "sliding"}:
            raise ConfigError(f"layer_types must be full or sliding, got {sorted(set(self.layer_types))}")
        if "sliding" in self.layer_types and self.sliding_window < 1:
            raise ConfigError("sliding layers need a sliding_window of at least 1 token")
        if any(not 0 <= i < self.n_layers for i in self.nope_layers):
            raise ConfigError(f"nope_layers {list(self.nope_layers)} lie outside the {self.n_layers} layers")
        if self.n_experts and not self.gated:
            raise ConfigError("a mixture of experts is of gated feed-forwards: set gated")
        if self.n_experts and not (1 <= self.experts_per_token <= self.n_experts and self.expert_d_ff >= 1):
            raise ConfigError(f"a mixture of {self.n_experts} experts needs experts_per_token between 1 and "
                              f"{self.n_experts} and a positive expert_d_ff, got {self.experts_per_token} and "
                              f"{self.expert_d_ff}")  # fmt: skip
        if any(not 0 <= i < self.n_layers for i in self.dense_layers):
            raise ConfigError(f"dense_layers {list(self.dense_layers)} lie outside the {self.n_layers} layers")
        short = dict(self.rope_scaling).get("short_factor")
        if short is not None and (not isinstance(short, tuple) or len(short) != rotary // 2):
            raise ConfigError(f"longrope short_factor must hold {rotary // 2} values (one a rotary frequency)")

    @property
    def dim(self) -> int:
        """The width of one head."""
        return self.head_dim or self.d_model // self.n_heads

    @property
    def scale(self) -> float:
        """The attention scores' scale."""
        return self.attn_scale or 1.0 / math.sqrt(self.dim)

    def window(self, layer: int) -> int:
        """How many tokens layer ``layer`` sees back to (its own included); 0: all of them."""
        return self.sliding_window if self.layer_types and self.layer_types[layer] == "sliding" else 0

    def experts(self, layer: int) -> bool:
        """Whether layer ``layer``'s feed-forward is a mixture of experts."""
        return self.n_experts > 0 and layer not in self.dense_layers

    def rope_of(self, layer: int) -> str | None:
        """Which rotation layer ``layer`` applies: ``global``, ``local`` (the sliding layers' own base)
        or None (learned positions, or a NoPE layer)."""
        if self.position != "rope" or layer in self.nope_layers:
            return None
        return "local" if self.local_rope_theta and self.window(layer) else "global"

    def local_rope(self) -> CausalLMConfig:
        """This config with the sliding layers' rotation as its one rotation (unscaled)."""
        return self.replace(rope_theta=self.local_rope_theta, rope_type="default", rope_scaling=())

    def replace(self, **changes: Any) -> CausalLMConfig:
        return dataclasses.replace(self, **changes)

    def mirrored(self) -> dict[str, Any]:
        """The ModelConfig fields a decoder-only config mirrors from this section."""
        from edgeattn.runtime.families.causal.record import FAMILY

        return {
            "architecture": FAMILY.architecture, "vocab_size": self.vocab_size, "d_model": self.d_model,
            "n_heads": self.n_heads, "d_ff": self.d_ff, "n_encoder_layers": 0, "n_decoder_layers": self.n_layers,
            "max_len": self.max_len, "d_kv": self.head_dim, "norm": self.norm, "norm_eps": self.norm_eps,
            "position": "learned" if self.position == "learned" else "none", "scale_embedding": False,
            "tie_embeddings": self.tie_embeddings,
        }  # fmt: skip

    def model_config(self, pad_id: int = 0, bos_id: int = 1, eos_id: int = 2) -> ModelConfig:
        """The config of a decoder-only model with this section: the fields it mirrors, and its special ids."""
        from edgeattn.config import ModelConfig

        return ModelConfig(**self.mirrored(), dropout=0.0, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id, section=self)

    def check(self, config: ModelConfig) -> None:
        """A ConfigError where ``config``'s shared fields disagree with this section."""
        wrong = {k: (getattr(config, k), v) for k, v in self.mirrored().items() if getattr(config, k) != v}
        if wrong:
            raise ConfigError("decoder-only config fields disagree with its causal section: "
                              + ", ".join(f"{k}={mine!r} but the section says {theirs!r}"
                                          for k, (mine, theirs) in wrong.items()))  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (rope_scaling as an object; rope_type only when not the default)."""
        data = dataclasses.asdict(self)
        data["rope_scaling"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.rope_scaling}
        if self.rope_type == "default":
            del data["rope_type"]
        return data

    @classmethod
    def from_dict(cls, data: Any) -> CausalLMConfig:
        """The section from a dictionary, refusing unknown keys by name."""
        from edgeattn.config import checked_section_data

        data = checked_section_data(cls, data, "causal")
        scaling = data.get("rope_scaling") or {}
        if not isinstance(scaling, dict | list | tuple):
            raise ConfigError(f"causal rope_scaling must be an object, got {scaling!r}")
        items = list(scaling.items() if isinstance(scaling, dict) else scaling)
        try:
            data["rope_scaling"] = tuple((str(k), tuple(float(x) for x in v) if isinstance(v, list | tuple)
                                          else float(v)) for k, v in items)  # fmt: skip
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"causal rope_scaling values must be numbers or lists of numbers: {exc}") from exc
        for key, kind in (("layer_types", str), ("nope_layers", int), ("dense_layers", int)):
            if key in data:
                if not isinstance(data[key], list | tuple):
                    raise ConfigError(f"causal {key} must be a list, got {data[key]!r}")
                data[key] = tuple(kind(v) for v in data[key])
        if "rope_type" not in data and items:  # written before rope types were named: Llama 3's scaling
            data["rope_type"] = "llama3"
        try:
            return cls(**data)
        except TypeError as exc:
            raise ConfigError(f"invalid causal config: {exc}") from exc

    def parameter_count(self) -> int:
        """Weight matrices and tables (norms and biases left out)."""
        d, h = self.d_model, self.dim
        attention = d * h * (2 * self.n_heads + 2 * self.n_kv_heads)
        ff = (3 if self.gated else 2) * d * self.d_ff
        experts = self.n_experts * 3 * d * self.expert_d_ff + d * self.n_experts  # and the router
        tables = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        tables += self.max_len * d if self.position == "learned" else 0
        return sum(attention + (experts if self.experts(i) else ff) for i in range(self.n_layers)) + tables
