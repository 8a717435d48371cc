"""The model configuration: one dataclass that drives every module (torch-free).

A config is serialisable to and from JSON, validated on construction, and named presets
give the sizes the project's goals are stated in.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from edgeattn.errors import ConfigError

if TYPE_CHECKING:
    from edgeattn.runtime.records import Family

#: a model family's architecture (``Family.architecture``; the registry lists them)
Architecture = str
PositionKind = Literal["sinusoidal", "learned", "relative", "t5", "none"]
Activation = Literal["relu", "gelu", "gelu_tanh", "quick_gelu", "gated-gelu", "gated-gelu_tanh"]
NormKind = Literal["layernorm", "rmsnorm"]
HeadKind = Literal["none", "sequence", "token"]
#: how a sequence-classification head pools the tokens (an embedding export's pooling is
#: ``edgeattn.runtime.manifest.EmbeddingPooling``)
HeadPooling = Literal["mean", "first"]
Pooler = Literal["none", "tanh", "relu"]

_CHOICES: dict[str, tuple[str, ...]] = {
    "position": ("sinusoidal", "learned", "relative", "t5", "none"),
    "activation": ("relu", "gelu", "gelu_tanh", "quick_gelu", "gated-gelu", "gated-gelu_tanh"),
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
    ``gelu_tanh`` is GELU's tanh approximation; ``quick_gelu`` is x·sigmoid(1.702x) (CLIP).

    ``architecture`` names the model's family (:mod:`edgeattn.runtime.families`). A family with
    knobs of its own keeps them in its ``section``, a dataclass it defines (its record's
    ``config_section``), written under the family's name; the fields every model has (sizes, layer
    counts, special token ids) stay here, and a family's section may check them (a decoder-only
    model's section mirrors its sizes here: ``CausalLMConfig.model_config`` builds one). Fields only
    one family's models set (its record's ``config_fields``) keep their defaults in the others'.
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
    #: the family's own section (its record's ``config_section``), or None for a family without one
    section: Any = None

    @property
    def family(self) -> Family:
        """The record of the model's family."""
        from edgeattn.runtime.families import family_of

        return family_of(self)

    def __post_init__(self) -> None:
        from edgeattn.runtime.families import FAMILIES

        architectures = [f.architecture for f in FAMILIES.values()]
        if self.architecture not in architectures:
            raise ConfigError(f"config architecture={self.architecture!r} is not one of {', '.join(architectures)}")
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
        family = self.family
        section = family.section_class()
        if section is None and self.section is not None:
            raise ConfigError(f"an architecture={self.architecture!r} config has no section of its own")
        if section is not None and not isinstance(self.section, section):
            raise ConfigError(f"an architecture={self.architecture!r} config needs its {family.name} section "
                              f"({section.__name__})")  # fmt: skip
        for other in FAMILIES.values():
            kept = [n for n in other.config_fields if other is not family and getattr(self, n) != _DEFAULTS[n]]
            if kept:
                raise ConfigError(f"{', '.join(kept)}: for architecture={other.architecture!r} only")
        if self.section is not None:
            self.section.check(self)
        elif self.n_encoder_layers < 1:
            raise ConfigError("config n_encoder_layers must be at least 1")
        if self.has_decoder and self.n_decoder_layers < 1:
            raise ConfigError("an encoder-decoder config needs n_decoder_layers >= 1")
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
        if self.relative_shared and self.position != "t5":
            raise ConfigError("relative_shared is for T5 relative positions (position='t5')")
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

    def parameter_count(self) -> int:
        """The model's parameter count from the config alone (weight matrices and tables; biases and
        norms, a few per cent, left out): what the sizes would allocate."""
        if hasattr(self.section, "parameter_count"):
            return int(self.section.parameter_count())
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
    def has_decoder(self) -> bool:
        """True for an encoder with a decoder over it (its family's ``encoder_decoder``)."""
        return self.family.encoder_decoder

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary of every field; the knobs added for imported encoders only where
        a model uses them, so that a config without them reads the same as before they existed
        (and an older edgeattn, which refuses unknown keys, still reads it)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "section"}
        if self.section is not None:
            data[self.family.name] = self.section.to_dict()
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
        from edgeattn.runtime.families import FAMILIES

        sections = {f.name: f for f in FAMILIES.values() if f.config_section is not None}
        known = {f.name for f in dataclasses.fields(cls)} - {"section"}
        unknown = sorted(set(data) - known - set(sections))
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
        given = {name: data[name] for name in sections if data.get(name) is not None}
        if len(given) > 1:
            raise ConfigError(f"a config has one family's section, not {', '.join(given)}")
        data = {k: v for k, v in data.items() if k not in sections}
        for name, value in given.items():
            data["section"] = sections[name].section_class().from_dict(value)
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


_PRESET_FIELDS: dict[str, dict[str, Any]] = {
    # The demo: sorts digit strings; trained weights ship with the package (edgeattn train-demo).
    "demo": dict(
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
    "tiny": dict(
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
    "reference": dict(
        vocab_size=32000,
        d_model=512,
        n_heads=8,
        d_ff=2048,
        n_encoder_layers=6,
        n_decoder_layers=6,
        max_len=1024,
        dropout=0.1,
    ),
    "bert-base": dict(
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


class _Presets(Mapping[str, ModelConfig]):
    """The presets by name, each built the first time it is asked for (a config asks the family
    registry to validate it, which cannot be done while this module is first imported)."""

    def __init__(self, fields: dict[str, dict[str, Any]]) -> None:
        self._fields = fields
        self._built: dict[str, ModelConfig] = {}

    def __getitem__(self, name: str) -> ModelConfig:
        if name not in self._built:
            self._built[name] = ModelConfig(**self._fields[name])
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


#: The built-in presets by name.
PRESETS: Mapping[str, ModelConfig] = _Presets(_PRESET_FIELDS)


#: Fields written only when set (see :meth:`ModelConfig.to_dict`).
_OMITTED_AT_DEFAULT = ("pooler", "token_types", "position_offset", "d_kv", "relative_shared", "scale_decoder_output")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}


def checked_section_data(cls: type, data: Any, family: str) -> dict[str, Any]:
    """``data`` for family ``family``'s config section ``cls`` (a dataclass): a ConfigError where it
    is no JSON object or names a key the section does not have."""
    if not isinstance(data, dict):
        raise ConfigError(f"the {family} config section must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ConfigError(f"unknown {family} config keys: {', '.join(unknown)}")
    return dict(data)


def get_preset(name: str) -> ModelConfig:
    """The named preset, or a ConfigError listing the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}") from None
