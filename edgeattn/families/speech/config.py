"""The speech family's own section of a model config (torch-free): what Whisper has besides the
transformer's sizes, its mel bins and the audio positions of one window."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeattn.errors import ConfigError

if TYPE_CHECKING:
    from edgeattn.config import ModelConfig


@dataclass(frozen=True)
class SpeechConfig:
    """The log-mel bins the encoder reads and its audio positions (frames / 2: the second
    convolution's stride); 1,500 positions are Whisper's 30 s window. The alignment heads (the
    folder's ``generation_config.json``) are the (decoder layer, head) pairs whose cross-attention
    follows the audio in time: the decoder graph returns their weights, for word timestamps."""

    n_mels: int = 80
    audio_positions: int = 1500
    alignment_heads: tuple[tuple[int, int], ...] = ()
    #: the width of the median filter that smooths the alignment heads' weights over time (odd)
    median_filter_width: int = 7

    def __post_init__(self) -> None:
        for name in ("n_mels", "audio_positions", "median_filter_width"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"speech config {name} must be a positive integer, got {value!r}")
        if self.median_filter_width % 2 != 1:
            raise ConfigError(f"speech config median_filter_width must be odd, got {self.median_filter_width}")
        heads = self.alignment_heads
        if not isinstance(heads, list | tuple) or not all(
            isinstance(h, list | tuple) and len(h) == 2 and all(isinstance(i, int) and not isinstance(i, bool)
                                                                and i >= 0 for i in h) for h in heads
        ):  # fmt: skip
            raise ConfigError(f"speech config alignment_heads is a list of [decoder layer, head] pairs, got {heads!r}")
        object.__setattr__(self, "alignment_heads", tuple((int(a), int(b)) for a, b in heads))

    def check(self, config: ModelConfig) -> None:
        """A ConfigError where ``config`` cannot hold this section: no encoder layers, or an alignment
        head outside its decoder."""
        if config.n_encoder_layers < 1:
            raise ConfigError("config n_encoder_layers must be at least 1")
        for layer, head in self.alignment_heads:
            if layer >= config.n_decoder_layers or head >= config.n_heads:
                raise ConfigError(f"alignment head ({layer}, {head}) is outside the decoder's "
                                  f"{config.n_decoder_layers} layers of {config.n_heads} heads")  # fmt: skip

    @property
    def frames(self) -> int:
        """The feature frames of one window."""
        return 2 * self.audio_positions

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> SpeechConfig:
        """The section from a dictionary, refusing unknown keys by name."""
        from edgeattn.config import checked_section_data

        return cls(**checked_section_data(cls, data, "speech"))
