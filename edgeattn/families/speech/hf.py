"""``WhisperForConditionalGeneration`` folders (tiny to large-v3 and turbo, English-only and
multilingual, 80 or 128 mel bins; config.json as transformers 4.x or 5.x writes it) as an
edgeattn :class:`WhisperModel`.

Facts the mapping encodes: every norm is a LayerNorm (eps 1e-5) before its block, with a final
norm closing each stack; attention is scaled by 1/√head_dim and its key projection has no bias
(edgeattn's is held at zero); the feed-forward is fc1 -> GELU (erf) -> fc2; the encoder's
position table is fixed sinusoids stored in the checkpoint, the decoder's is learned; the output
layer is the token embedding; encoder and decoder may have different depths (turbo: 32 and 4)
but edgeattn holds one head count and one feed-forward width for both.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from edgeattn.config import ModelConfig
from edgeattn.errors import CheckpointError, ConfigError, EdgeattnError
from edgeattn.families.speech.config import SpeechConfig
from edgeattn.families.speech.model import WhisperModel
from edgeattn.runtime.families.speech.decoding import GENERATION_CONFIG, WhisperDecoding
from edgeattn.runtime.families.speech.log_mel import PREPROCESSOR_CONFIG, LogMel
from edgeattn.runtime.jsonfile import read_json_object
from edgeattn.weight_file import parameters_on_meta
from edgeattn.weights import load_state

log = logging.getLogger(__name__)

ARCHITECTURE = "WhisperForConditionalGeneration"
#: what a Whisper export does (the speech family's task)
TASK = "transcribe"
#: the generation config keys the runtime decodes by (``edgeattn.runtime.families.speech.decoding``)
DECODING_KEYS = ("decoder_start_token_id", "eos_token_id", "no_timestamps_token_id", "suppress_tokens",
                 "begin_suppress_tokens", "lang_to_id", "task_to_id", "is_multilingual",
                 "max_initial_timestamp_index", "max_length", "alignment_heads", "prev_sot_token_id")
#: Hugging Face sub-module -> edgeattn's, inside a layer
_LAYER = {"self_attn": "self_attn", "encoder_attn": "cross_attn", "fc1": "ff.linear1", "fc2": "ff.linear2"}
#: the norms of each stack's layers, in order
_NORMS = {"encoder": {"self_attn_layer_norm": "norm1", "final_layer_norm": "norm2"},
          "decoder": {"self_attn_layer_norm": "norm1", "encoder_attn_layer_norm": "norm2",
                      "final_layer_norm": "norm3"}}  # fmt: skip


def map_config(hf: dict[str, Any], path: object) -> ModelConfig:
    """The edgeattn config of a Whisper config.json; ConfigError naming what edgeattn cannot build."""

    def need(key: str) -> Any:
        if key not in hf:
            raise ConfigError(f"{path} lacks {key!r}")
        return hf[key]

    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if need(a) != need(b):
            raise ConfigError(f"{path}: {a} {hf[a]} differs from {b} {hf[b]}; edgeattn's Whisper holds one value")
    activation = hf.get("activation_function", "gelu")
    if activation != "gelu":
        raise ConfigError(f"{path}: activation_function {activation!r}; Whisper's is 'gelu'")
    if hf.get("scale_embedding"):
        raise ConfigError(f"{path}: scale_embedding true is not Whisper's layout")
    if hf.get("tie_word_embeddings") is False:
        raise ConfigError(f"{path}: an output layer untied from the token embedding is not Whisper's layout")
    eos = hf.get("eos_token_id", 50257)
    eos = eos[0] if isinstance(eos, list) and eos else eos
    start = hf.get("decoder_start_token_id", hf.get("bos_token_id", 50258))
    try:
        speech = SpeechConfig(n_mels=int(hf.get("num_mel_bins", 80)),
                              audio_positions=int(hf.get("max_source_positions", 1500)))
        config = ModelConfig(
            architecture="speech-to-text", vocab_size=int(need("vocab_size")), d_model=int(need("d_model")),
            n_heads=int(hf["encoder_attention_heads"]), d_ff=int(hf["encoder_ffn_dim"]),
            n_encoder_layers=int(need("encoder_layers")), n_decoder_layers=int(need("decoder_layers")),
            max_len=int(hf.get("max_target_positions", 448)), dropout=0.0, activation="gelu", norm="layernorm",
            norm_eps=1e-5, norm_first=True, position="learned", attention_scaled=True, bias=True,
            scale_embedding=False, tie_embeddings=True, pad_id=int(hf.get("pad_token_id") or eos),
            bos_id=int(start), eos_id=int(eos), section=speech,
        )  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path} does not describe a Whisper edgeattn can build: {exc}") from exc
    if config.d_model % config.n_heads:
        raise ConfigError(f"{path}: d_model {config.d_model} is not a multiple of {config.n_heads} heads")
    return config


def map_key(key: str) -> str | None:
    """The edgeattn name of a Whisper tensor, or None when it has none."""
    key = key.removeprefix("model.")
    fixed = {"encoder.conv1.weight": "encoder.conv1.weight", "encoder.conv1.bias": "encoder.conv1.bias",
             "encoder.conv2.weight": "encoder.conv2.weight", "encoder.conv2.bias": "encoder.conv2.bias",
             "encoder.embed_positions.weight": "encoder.positions",
             "decoder.embed_tokens.weight": "embed.weight",
             "decoder.embed_positions.weight": "decoder.position.weight",
             "proj_out.weight": "lm_head.weight"}  # fmt: skip
    if key in fixed:
        return fixed[key]
    stack_norm = re.fullmatch(r"(encoder|decoder)\.layer_norm\.(weight|bias)", key)
    if stack_norm:
        return f"{stack_norm.group(1)}.final_norm.{stack_norm.group(2)}"
    m = re.fullmatch(r"(encoder|decoder)\.layers\.(\d+)\.(\w+)\.(?:(\w+)\.)?(weight|bias)", key)
    if not m:
        return None
    stack, index, block, inner, kind = m.groups()
    prefix = f"{stack}.layers.{index}"
    if inner is None and block in _NORMS[stack]:
        return f"{prefix}.{_NORMS[stack][block]}.{kind}"
    if inner is None and block in ("fc1", "fc2"):
        return f"{prefix}.{_LAYER[block]}.{kind}"
    if block in ("self_attn", "encoder_attn") and inner in ("q_proj", "k_proj", "v_proj", "out_proj"):
        if block == "encoder_attn" and stack == "encoder":
            return None
        return f"{prefix}.{_LAYER[block]}.{inner}.{kind}"
    return None


def map_tensors(tensors: dict[str, torch.Tensor], model: WhisperModel, source: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under edgeattn's names; the key projections' biases (Whisper has
    none) zero; CheckpointError for a tensor that maps nowhere."""
    mapped: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        name = map_key(key)
        if name is None:
            raise CheckpointError(f"{source}: tensor {key} has no place in edgeattn's Whisper")
        if name == "lm_head.weight":
            continue  # the token embedding, tied
        mapped[name] = tensor  # cast to float32 as it is copied into its parameter
    for name, parameter in model.state_dict().items():
        if name.endswith("k_proj.bias") and name not in mapped:
            mapped[name] = torch.zeros(parameter.shape, dtype=parameter.dtype)  # (parameters are on meta here)
    return mapped


def with_alignment(config: ModelConfig, hf: dict[str, Any], folder: Path) -> ModelConfig:
    """``config`` with the alignment heads ``generation_config.json`` lists (the decoder graph
    then returns their weights, for word timestamps) and config.json's median filter width."""
    path = folder / GENERATION_CONFIG
    heads = read_json_object(path, ConfigError).get("alignment_heads") if path.is_file() else None
    speech = config.section
    assert speech is not None
    try:
        speech = replace(speech, alignment_heads=tuple(heads or ()),
                         median_filter_width=int(hf.get("median_filter_width", 7)))  # fmt: skip
        return replace(config, section=speech)
    except (TypeError, ValueError, ConfigError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def import_whisper(folder: str | Path) -> WhisperModel:
    """The Whisper model of a local Hugging Face folder, every tensor placed and checked."""
    from edgeattn.hf import read_json, read_tensors

    folder = Path(folder)
    hf = read_json(folder / "config.json")
    architecture = (hf.get("architectures") or [ARCHITECTURE])[0]
    if architecture != ARCHITECTURE or hf.get("model_type", "whisper") != "whisper":
        raise ConfigError(f"{folder / 'config.json'} describes {architecture}, not {ARCHITECTURE}")
    config = with_alignment(map_config(hf, folder / "config.json"), hf, folder)
    with parameters_on_meta():  # storage given by load_state, in a file the system can page
        model = WhisperModel(config)
    source = str(folder)
    load_state(model, map_tensors(read_tensors(folder), model, source), source, model.tied_aliases())
    log.info("imported %s (%d encoder, %d decoder layers, %d mel bins) from %s", architecture,
             config.n_encoder_layers, config.n_decoder_layers, config.section.n_mels, folder)  # fmt: skip
    return model.eval()


def settings_of(folder: Path) -> dict[str, Any]:
    """What the runtime reads of a Whisper folder besides its weights: the log-mel settings
    (``preprocessor_config.json``) and the decoding settings (``generation_config.json``), checked."""
    for name in (PREPROCESSOR_CONFIG, GENERATION_CONFIG):
        if not (folder / name).is_file():
            raise ConfigError(f"{folder} has no {name}; a Whisper folder needs it to hear and decode (transformers "
                              f"writes it with the model's processor and generation config)")  # fmt: skip
    try:
        features = LogMel.from_folder(folder).as_dict()
        generation = read_json_object(folder / GENERATION_CONFIG, ConfigError)
        decoding = {k: generation[k] for k in DECODING_KEYS if k in generation}
        WhisperDecoding.from_dict(decoding, str(folder / GENERATION_CONFIG))
    except EdgeattnError as exc:
        raise ConfigError(str(exc)) from exc
    return {"features": features, "decoding": decoding}


def importers() -> list[Any]:
    """The speech family's architecture (its record's ``importers``)."""
    from edgeattn.hf import Importer

    return [Importer(ARCHITECTURE, "speech", "whisper", TASK, import_folder, reference_outputs, ("whisper",))]


def import_folder(folder: Path, hf: dict[str, Any], importer: Any, task: str) -> Any:
    """A Whisper folder as the :class:`~edgeattn.hf.HFModel` an export takes: the model, its
    tokenizer and its features and decoding settings."""
    from edgeattn.hf import HFModel, tokenizer_of

    if task not in ("", TASK):
        raise ConfigError(f"{ARCHITECTURE} has no {task} head; its task is {TASK}")
    settings = settings_of(folder)
    model = import_whisper(folder)
    log_mel, speech = LogMel.from_dict(settings["features"]), model.config.section
    if (log_mel.n_mels, log_mel.window_frames) != (speech.n_mels, speech.frames):
        raise ConfigError(f"{folder}: {PREPROCESSOR_CONFIG} makes windows of {log_mel.n_mels} mel bins and "
                          f"{log_mel.window_frames} frames; the model takes {speech.n_mels} and {speech.frames}")
    return HFModel(model, ARCHITECTURE, TASK, None, None, folder, tokenizer_of(folder), settings=settings)


def reference_outputs(model: WhisperModel, reference: Any, ids: torch.Tensor, mask: torch.Tensor
                      ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """Encoder states and teacher-forced logits of a window of seeded features, the sample text's
    tokens as targets, beside transformers'."""
    speech = model.config.section
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(ids.shape[0], speech.n_mels, speech.frames, generator=generator)
    targets = torch.cat([torch.full_like(ids[:, :1], model.config.bos_id), ids[:, :15]], dim=1)
    targets = targets.clamp(max=model.config.vocab_size - 1)
    outputs: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {"encoder states": ([], []), "logits": ([], [])}
    for row in range(len(ids)):  # a window at a time: a 30 s window's attention scores are 180 MB a layer
        window, target = features[row : row + 1], targets[row : row + 1]
        theirs = reference(input_features=window, decoder_input_ids=target)
        for name, ours, their in (("encoder states", model.encode(window), theirs.encoder_last_hidden_state),
                                  ("logits", model(window, target), theirs.logits)):  # fmt: skip
            outputs[name][0].append(ours)
            outputs[name][1].append(their)
        del theirs
    return {name: (torch.cat(ours), torch.cat(theirs)) for name, (ours, theirs) in outputs.items()}
