"""A Hugging Face Whisper folder as whisper.cpp's ggml model file, for :mod:`edgeattn.families.speech.peers`: float16
(whisper.cpp's own conversion, ``models/convert-h5-to-ggml.py``, writes the same) or q8_0 (what
whisper.cpp's ``quantize`` tool makes of that file: every 2-D weight in blocks of 32 int8 values
with a float16 scale, the convolution biases and positional embeddings left alone). Written here
from the file format because the Python binding (pywhispercpp) ships no converter or quantiser.

Usage: ``python -m edgeattn.families.speech.ggml_peers FOLDER OUT.bin [--q8]``
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import numpy as np

#: ggml's file magic, its tensor types and whisper.cpp's file types (q8_0 files carry the
#: quantisation format's version, 2, times 1000 in the type)
MAGIC, F32, F16, Q8_0 = 0x67676D6C, 0, 1, 8
FTYPE_F16, FTYPE_Q8_0, QNT_VERSION = 1, 7, 2
#: Hugging Face's names of a layer's parts -> whisper.cpp's
PARTS = {"self_attn.k_proj": "attn.key", "self_attn.q_proj": "attn.query", "self_attn.v_proj": "attn.value",
         "self_attn.out_proj": "attn.out", "self_attn_layer_norm": "attn_ln", "encoder_attn.q_proj": "cross_attn.query",
         "encoder_attn.k_proj": "cross_attn.key", "encoder_attn.v_proj": "cross_attn.value",
         "encoder_attn.out_proj": "cross_attn.out", "encoder_attn_layer_norm": "cross_attn_ln", "fc1": "mlp.0",
         "fc2": "mlp.2", "final_layer_norm": "mlp_ln"}  # fmt: skip
NAMES = {"encoder.layer_norm.bias": "encoder.ln_post.bias", "encoder.layer_norm.weight": "encoder.ln_post.weight",
         "encoder.embed_positions.weight": "encoder.positional_embedding",
         "decoder.layer_norm.bias": "decoder.ln.bias", "decoder.layer_norm.weight": "decoder.ln.weight",
         "decoder.embed_positions.weight": "decoder.positional_embedding",
         "decoder.embed_tokens.weight": "decoder.token_embedding.weight"}  # fmt: skip
#: kept in float32 (and never quantised)
KEEP = {"encoder.conv1.bias", "encoder.conv2.bias", "encoder.positional_embedding", "decoder.positional_embedding"}


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def ggml_name(name: str) -> str | None:
    """whisper.cpp's name of a Hugging Face tensor (None: not written, the output layer tied to the embedding)."""
    if name == "proj_out.weight":
        return None
    parts = name.split(".")[1:]  # without "model."
    if parts[1] == "layers":
        mapped = "attn.key" if parts[0] == "encoder" and parts[3:-1] == ["self_attn", "k_proj"] else None
        mapped = mapped or PARTS[".".join(parts[3:-1])]
        return ".".join([parts[0], "blocks", parts[2], mapped, parts[-1]])
    joined = ".".join(parts)
    return NAMES.get(joined, joined)


def q8_0(data: np.ndarray) -> bytes:
    """Rows of float32 as ggml's q8_0 blocks: a float16 scale (the block's largest magnitude over
    127) and 32 rounded int8 values."""
    blocks = data.astype(np.float32).reshape(-1, 32)
    scale = np.abs(blocks).max(axis=1) / 127.0
    inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
    q = np.round(blocks * inverse[:, None]).astype(np.int8)
    out = np.empty(len(blocks), dtype=[("d", "<f2"), ("qs", "i1", 32)])
    out["d"], out["qs"] = scale.astype(np.float16), q
    return out.tobytes()


def convert(folder: Path, out: Path, quantize: bool = False) -> Path:
    from safetensors.numpy import load_file

    from edgeattn.runtime.families.speech.log_mel import LogMel

    config = json.loads((folder / "config.json").read_text())
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    specials = {t["content"] for t in tokenizer.get("added_tokens", [])}
    vocab = sorted(((t, i) for t, i in tokenizer["model"]["vocab"].items() if t not in specials), key=lambda x: x[1])
    filters = LogMel.from_folder(folder).filters
    tensors = load_file(str(folder / "model.safetensors"))
    decode = _byte_decoder()
    with out.open("wb") as f:
        ftype = FTYPE_Q8_0 + 1000 * QNT_VERSION if quantize else FTYPE_F16
        f.write(struct.pack("12i", MAGIC, config["vocab_size"], config["max_source_positions"], config["d_model"],
                            config["encoder_attention_heads"], config["encoder_layers"], config["max_target_positions"],
                            config["d_model"], config["decoder_attention_heads"], config["decoder_layers"],
                            config["num_mel_bins"], ftype))  # fmt: skip
        f.write(struct.pack("2i", *filters.shape))
        f.write(filters.astype("<f4").tobytes())
        f.write(struct.pack("i", len(vocab)))
        for token, _ in vocab:
            text = bytes(decode[c] for c in token)
            f.write(struct.pack("i", len(text)) + text)
        for name, data in tensors.items():
            mapped = ggml_name(name)
            if mapped is None:
                continue
            data = np.asarray(data, dtype=np.float32)
            if mapped in ("encoder.conv1.bias", "encoder.conv2.bias"):
                data = data.reshape(-1, 1)
            kind = F32 if data.ndim < 2 or mapped in KEEP else F16
            if quantize and kind == F16 and data.ndim == 2 and data.shape[-1] % 32 == 0:
                kind = Q8_0
            encoded = mapped.encode()
            f.write(struct.pack("3i", data.ndim, len(encoded), kind))
            f.write(struct.pack(f"{data.ndim}i", *reversed(data.shape)))
            f.write(encoded)
            f.write(q8_0(data) if kind == Q8_0 else data.astype("<f2" if kind == F16 else "<f4").tobytes())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--q8", action="store_true", help="q8_0 weights (else float16)")
    args = parser.parse_args()
    print(convert(args.folder, args.out, args.q8))


if __name__ == "__main__":
    main()
