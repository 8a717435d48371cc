"""The model configuration: one dataclass that drives every module (torch-free).

A config is serialisable to and from JSON, validated on construction, and named presets
give the sizes the project's goals are stated in.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edgeattn.errors import ConfigError
from edgeattn.families.causal.config import CausalLMConfig
from edgeattn.families.speech.config import SpeechConfig

Architecture = Literal["encoder-decoder", "encoder", "decoder-only", "speech-to-text"]
PositionKind = Literal["sinusoidal", "learned", "relative", "t5", "none"]
Activation = Literal["relu", "gelu", "gelu_tanh", "gated-gelu", "gated-gelu_tanh"]
NormKind = Literal["layernorm", "rmsnorm"]
HeadKind = Literal["none", "sequence", "token"]
#: how a sequence-classification head pools the tokens (an embedding export's pooling is
#: ``edgeattn.runtime.manifest.EmbeddingPooling``)
HeadPooling = Literal["mean", "first"]
Pooler = Literal["none", "tanh", "relu"]

_CHOICES: dict[str, tuple[str, ...]] = {
    "architecture": ("encoder-decoder", "encoder", "decoder-only", "speech-to-text"),
    "position": ("sinusoidal", "learned", "relative", "t5", "none"),
    "activation": ("relu", "gelu", "gelu_tanh", "gated-gelu", "gated-gelu_tanh"),
    "norm": ("layernorm", "rmsnorm"),
    "head": ("none", "sequence", "token"),
    "pooling": ("mean", "first"),
    "pooler": ("none", "tanh", "relu"),
}


#: Largest model a config may describe: 8e9 parameters (32 GB of float32 weights).
MAX_PARAMETERS = 8_000_000_000
#: Longest sequence a config may allow.
MAX_LEN = 1 << 20


@dataclass(frozen=True)
class ModelConfig:
    """Every hyper-parameter of an edgeattn transformer.

    ``architecture`` picks an encoder-decoder (with a language-model head) or an encoder alone
    (optionally with a classification ``head``). ``position`` picks how order enters the model:
    ``sinusoidal`` and ``learned`` add absolute position vectors to the embeddings, ``relative``
    adds clipped relative-position representations to the attention scores (Shaw et al. 2018),
    ``t5`` adds a bucketed relative bias per head.

    ``gated-*`` activations multiply the activated projection by a second, linear one (T5 v1.1);
    ``gelu_tanh`` is GELU's tanh approximation.

    ``decoder-only`` (GPT-2, the Llama family) keeps its own knobs in the ``causal`` section
    (:class:`~edgeattn.families.causal.config.CausalLMConfig`); the fields every model has (sizes, layer
    count as ``n_decoder_layers``, special token ids) mirror it, the others are not used.
    Build one with :meth:`decoder_only`.

    ``speech-to-text`` (Whisper) is an encoder-decoder over log-mel features; its ``speech``
    section (:class:`~edgeattn.families.speech.config.SpeechConfig`) holds the mel bins and audio positions.
    """

    architecture: Architecture = "encoder-decoder"
    vocab_size: int = 1000
    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 256
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    max_len: int = 512
    dropout: float = 0.1
    activation: Activation = "relu"
    norm: NormKind = "layernorm"
    norm_eps: float = 1e-5
    norm_first: bool = False
    position: PositionKind = "sinusoidal"
    relative_clip: int = 16
    relative_buckets: int = 32
    relative_max_distance: int = 128
    attention_topk: float | None = None
    attention_scaled: bool = True
    #: width of one attention head; 0: d_model // n_heads (T5 checkpoints may have
    #: n_heads * d_kv != d_model, flan-t5-small: 6 heads of 64 over d_model 512)
    d_kv: int = 0
    #: one T5 relative-bias table per stack, computed in the first layer and used by every layer
    #: (T5's layout); False: a table per layer
    relative_shared: bool = False
    bias: bool = True
    scale_embedding: bool = True
    embedding_norm: bool = False
    tie_embeddings: bool = True
    #: multiply the decoder output by d_model ** -0.5 before the language-model head (T5 with a
    #: tied output layer)
    scale_decoder_output: bool = False
    head: HeadKind = "none"
    num_labels: int = 2
    pooling: HeadPooling = "mean"
    #: a dense layer and this activation between the pooled vector and a sequence classifier
    #: (BERT's pooler and RoBERTa's classification head: tanh; DistilBERT's pre-classifier: relu)
    pooler: Pooler = "none"
    #: rows of a token-type (segment) embedding added to every token (BERT: 2); 0: none, and the
    #: encoder graph takes no ``token_type_ids``
    token_types: int = 0
    #: learned positions of real tokens start at this row and count only non-pad tokens, pad tokens
    #: take row ``position_offset - 1`` (RoBERTa: its padding index + 1); 0: positions 0, 1, 2, ...
    position_offset: int = 0
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    #: the decoder-only family's own section (architecture="decoder-only" only)
    causal: CausalLMConfig | None = None
    #: the speech family's own section (architecture="speech-to-text" only)
    speech: SpeechConfig | None = None

    @classmethod
    def decoder_only(cls, section: CausalLMConfig, pad_id: int = 0, bos_id: int = 1, eos_id: int = 2) -> ModelConfig:
        """The config of a decoder-only model: ``section`` and the fields it mirrors."""
        return cls(**_mirrored(section), dropout=0.0, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id, causal=section)

    def __post_init__(self) -> None:
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ConfigError(f"config {name}={value!r} is not one of {', '.join(choices)}")
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"config {name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("n_encoder_layers", "n_decoder_layers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ConfigError(f"config {name} must be a non-negative integer, got {getattr(self, name)!r}")
        if not isinstance(self.d_kv, int) or self.d_kv < 0:
            raise ConfigError(f"config d_kv must be 0 (d_model // n_heads) or a positive integer, got {self.d_kv!r}")
        if not self.d_kv and self.d_model % self.n_heads:
            raise ConfigError(f"config d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if self.position == "sinusoidal" and self.d_model % 2:
            raise ConfigError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if self.architecture == "decoder-only":
            self._check_causal()
        elif self.causal is not None:
            raise ConfigError("the causal section is for architecture='decoder-only' only")
        elif self.n_encoder_layers < 1:
            raise ConfigError("config n_encoder_layers must be at least 1")
        if (self.architecture == "speech-to-text") != isinstance(self.speech, SpeechConfig):
            raise ConfigError("a speech-to-text config needs its speech section, and only it has one")
        for layer, head in () if self.speech is None else self.speech.alignment_heads:
            if layer >= self.n_decoder_layers or head >= self.n_heads:
                raise ConfigError(f"alignment head ({layer}, {head}) is outside the decoder's {self.n_decoder_layers} "
                                  f"layers of {self.n_heads} heads")  # fmt: skip
        if self.has_decoder:
            if self.n_decoder_layers < 1:
                raise ConfigError("an encoder-decoder config needs n_decoder_layers >= 1")
            if self.head != "none":
                raise ConfigError("classification heads are for architecture='encoder' only")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"config dropout must be in [0, 1), got {self.dropout}")
        if self.norm_eps <= 0:
            raise ConfigError(f"config norm_eps must be positive, got {self.norm_eps}")
        if self.attention_topk is not None and not 0.0 < self.attention_topk <= 1.0:
            raise ConfigError(
                f"config attention_topk is a fraction of the key length in (0, 1], got {self.attention_topk}"
            )
        if self.relative_clip < 1 or self.relative_buckets < 2 or self.relative_max_distance < 2:
            raise ConfigError("config relative_clip >= 1, relative_buckets >= 2, relative_max_distance >= 2")
        if self.head != "none" and self.num_labels < 1:
            raise ConfigError(f"config num_labels must be positive, got {self.num_labels}")
        if self.token_types < 0 or self.position_offset < 0:
            raise ConfigError("config token_types and position_offset must be non-negative")
        if (self.token_types or self.position_offset or self.pooler != "none") and self.architecture != "encoder":
            raise ConfigError("token_types, position_offset and pooler are for architecture='encoder' only")
        if self.relative_shared and self.position != "t5":
            raise ConfigError("relative_shared is for T5 relative positions (position='t5')")
        if self.scale_decoder_output and self.architecture != "encoder-decoder":
            raise ConfigError("scale_decoder_output is for architecture='encoder-decoder' only")
        if self.position_offset and self.position != "learned":
            raise ConfigError("position_offset needs learned positions (position='learned')")
        for name in ("pad_id", "bos_id", "eos_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ConfigError(
                    f"config {name}={getattr(self, name)} is outside the vocabulary (size {self.vocab_size})"
                )

        if self.max_len > MAX_LEN:
            raise ConfigError(f"config max_len={self.max_len} is over edgeattn's limit of {MAX_LEN} positions")
        params = self.parameter_count()
        if params > MAX_PARAMETERS:
            raise ConfigError(
                f"config would need about {params:.2e} parameters ({4 * params / 1e9:.3g} GB of float32 weights, "
                f"estimated before anything is allocated); edgeattn takes models up to {MAX_PARAMETERS:.0e} "
                f"parameters ({4 * MAX_PARAMETERS / 1e9:.0f} GB)"
            )

    def _check_causal(self) -> None:
        if not isinstance(self.causal, CausalLMConfig):
            raise ConfigError("a decoder-only config needs its causal section (ModelConfig.decoder_only builds one)")
        if self.head != "none":
            raise ConfigError("classification heads are for architecture='encoder' only")
        wrong = {k: (getattr(self, k), v) for k, v in _mirrored(self.causal).items() if getattr(self, k) != v}
        if wrong:
            raise ConfigError("decoder-only config fields disagree with its causal section: "
                              + ", ".join(f"{k}={mine!r} but the section says {theirs!r}"
                                          for k, (mine, theirs) in wrong.items()))  # fmt: skip

    def parameter_count(self) -> int:
        """The model's parameter count from the config alone (weight matrices and tables; biases and
        norms, a few per cent, left out): what the sizes would allocate."""
        if self.causal is not None:
            return self.causal.parameter_count()
        d, f, inner = self.d_model, self.d_ff, self.n_heads * self.head_dim
        ff = (3 if self.gated else 2) * d * f
        layers = self.n_encoder_layers * (4 * d * inner + ff)
        if self.has_decoder:
            layers += self.n_decoder_layers * (8 * d * inner + ff)
        tables = self.vocab_size * d * (1 if self.tie_embeddings or not self.has_decoder else 2)
        tables += (self.max_len + self.position_offset) * d if self.position == "learned" else 0
        return layers + tables + self.token_types * d

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_kv or self.d_model // self.n_heads

    @property
    def gated(self) -> bool:
        """True for a gated feed-forward (two input projections)."""
        return self.activation.startswith("gated-")

    @property
    def is_seq2seq(self) -> bool:
        """True for the (text) encoder-decoder architecture."""
        return self.architecture == "encoder-decoder"

    @property
    def has_decoder(self) -> bool:
        """True for an encoder with a decoder over it: text (encoder-decoder) or speech-to-text."""
        return self.architecture in ("encoder-decoder", "speech-to-text")

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary of every field; the knobs added for imported encoders only where
        a model uses them, so that a config without them reads the same as before they existed
        (and an older edgeattn, which refuses unknown keys, still reads it)."""
        data = dataclasses.asdict(self)
        data["causal"] = None if self.causal is None else self.causal.to_dict()
        data["speech"] = None if self.speech is None else self.speech.to_dict()
        for name in _OMITTED_AT_DEFAULT:
            if data[name] == _DEFAULTS[name]:
                del data[name]
        return data

    def to_json(self) -> str:
        """The config as a JSON string (sorted keys, stable across runs)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Build a config from a dictionary, refusing unknown keys by name."""
        if not isinstance(data, dict):
            raise ConfigError(f"a config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
        if data.get("causal") is not None:
            data = {**data, "causal": CausalLMConfig.from_dict(data["causal"])}
        if data.get("speech") is not None:
            data = {**data, "speech": SpeechConfig.from_dict(data["speech"])}
        try:
            return cls(**data)
        except TypeError as exc:
            raise ConfigError(f"invalid config: {exc}") from exc

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        """Parse a config from a JSON string."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config is not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        """Read a config from a JSON file."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from exc
        try:
            return cls.from_json(text)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from exc

    def save(self, path: str | Path) -> None:
        """Write the config as indented JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")


PRESETS: dict[str, ModelConfig] = {
    # The demo: sorts digit strings; trained weights ship with the package (edgeattn train-demo).
    "demo": ModelConfig(
        vocab_size=13,
        d_model=64,
        n_heads=4,
        d_ff=256,
        n_encoder_layers=2,
        n_decoder_layers=2,
        max_len=64,
        dropout=0.0,
        pad_id=0,
        bos_id=1,
        eos_id=2,
    ),
    "tiny": ModelConfig(
        vocab_size=50,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=2,
        max_len=256,
        dropout=0.0,
    ),
    # The CPU reference size the project's speed goals are stated in.
    "reference": ModelConfig(
        vocab_size=32000,
        d_model=512,
        n_heads=8,
        d_ff=2048,
        n_encoder_layers=6,
        n_decoder_layers=6,
        max_len=1024,
        dropout=0.1,
    ),
    "bert-base": ModelConfig(
        architecture="encoder",
        vocab_size=30522,
        d_model=768,
        n_heads=12,
        d_ff=3072,
        n_encoder_layers=12,
        n_decoder_layers=0,
        max_len=1024,
        activation="gelu",
        position="learned",
        embedding_norm=True,
        norm_eps=1e-12,
        scale_embedding=False,
        dropout=0.1,
    ),
}


#: Fields written only when set (see :meth:`ModelConfig.to_dict`).
_OMITTED_AT_DEFAULT = ("pooler", "token_types", "position_offset", "d_kv", "relative_shared", "scale_decoder_output",
                       "causal", "speech")  # fmt: skip
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}


def get_preset(name: str) -> ModelConfig:
    """The named preset, or a ConfigError listing the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}") from None


def _mirrored(section: CausalLMConfig) -> dict[str, Any]:
    """The ModelConfig fields a decoder-only config mirrors from its causal section."""
    return {
        "architecture": "decoder-only", "vocab_size": section.vocab_size, "d_model": section.d_model,
        "n_heads": section.n_heads, "d_ff": section.d_ff, "n_encoder_layers": 0, "n_decoder_layers": section.n_layers,
        "max_len": section.max_len, "d_kv": section.head_dim, "norm": section.norm, "norm_eps": section.norm_eps,
        "position": "learned" if section.position == "learned" else "none", "scale_embedding": False,
        "tie_embeddings": section.tie_embeddings,
    }  # fmt: skip
