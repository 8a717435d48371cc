"""A vision export's web and node bundle: what ``bundle.json`` says of it (its ES modules,
``vision.mjs`` and ``images.mjs``; its preprocessing as the Python runtime reads it; its graphs,
labels and zero-shot scale), and its check under Node.js: the ES module's decoding and pixel values
(equal to the last bit), embeddings, labels and zero-shot scores against the Python runtime's over
the bundle's own graph files."""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.runtime.families.vision.images import max_pixels, open_image, preprocessing_of
from edgeattn.runtime.families.vision.specs import TEXT_ENCODER, VISION_ENCODER, has_text
from edgeattn.runtime.manifest import Manifest
from edgeattn.runtime.precisions import get_precision
from edgeattn.runtime.text import label_names

#: the family's ES module (``runtime/families/vision/vision.mjs``), copied beside ``edgeattn.mjs``
MODULE = "vision.mjs"
#: labels a bundle with a text tower is checked on when none are given
CHECK_LABELS = ["a cat", "a dog", "a red car", "the sea"]
#: zero-shot probabilities of the bundle against the Python runtime's (both sum in float32 and float64
#: in different orders), and at a reduced precision, whose wasm kernels round otherwise (CLIP's scale of
#: 100 turns an embedding's cosine of 0.99993 into scores 0.01 apart)
SCORES_ABSOLUTE, REDUCED_SCORES_ABSOLUTE = 1e-4, 0.02
#: a reduced precision's embeddings against the Python runtime's: the least cosine (wasm quantises a
#: dynamic int8 graph's activations with its own rounding, layer after layer: docs/vision.md)
REDUCED_COSINE = 0.998


def pillow_major() -> int:
    """Pillow's major version, which decides the order of its resize's two passes (13 on: the vertical
    first where the height shrinks by more than twice what the width does)."""
    import PIL

    return int(PIL.__version__.split(".")[0])


def describe_vision(manifest: Manifest, folder: Path) -> dict[str, Any]:
    """A vision bundle's fields: its module, preprocessing (the export's ``settings.json``, copied into
    ``folder``, with the Pillow whose resize it reproduces), image limit, graphs, labels and scores."""
    from edgeattn.exporters.web import SETTINGS

    config = manifest.config
    vision = config.section
    settings = json.loads((folder / SETTINGS).read_text()) if (folder / SETTINGS).is_file() else None
    preprocessing = {**preprocessing_of(settings, vision.image_size).to_dict(), "pillow": pillow_major()}
    text = vision.text
    classifier = vision.classifier != "none"
    return {"task": manifest.task or ("image-classification" if classifier else "image-feature-extraction"),
            "module": MODULE, "preprocessing": preprocessing, "max_pixels": max_pixels(),
            "graphs": {"vision": VISION_ENCODER, "text": TEXT_ENCODER if has_text(config) else None},
            "labels": label_names(manifest.labels, config.num_labels) if classifier else None,
            "model": {"channels": vision.channels, "patch_size": vision.patch_size, "classifier": vision.classifier,
                      "projection": vision.projection, "logit_scale": vision.logit_scale,
                      "logit_bias": vision.logit_bias, "scores": vision.scores,
                      "text": None if text is None else {"pool": text.pool, "max_len": text.max_len,
                                                         "pad_id": text.pad_id}}}  # fmt: skip


def check_images() -> dict[str, bytes | np.ndarray]:
    """Images a vision bundle is checked on when none are given: PNG files of every kind the ES module
    decodes (RGB, RGBA, grey, a palette, 16-bit grey, an EXIF-rotated one), smaller and larger than
    the model's size and of other shapes, and an array of decoded pixels."""
    from PIL import Image

    rng = np.random.default_rng(5)

    def photo(height: int, width: int) -> np.ndarray:
        y, x = np.mgrid[0:height, 0:width]
        smooth = np.stack([127 + 120 * np.sin(x / 9 + c) * np.cos(y / 13 - c) for c in range(3)], axis=-1)
        return np.clip(smooth + rng.normal(0, 18, smooth.shape), 0, 255).astype(np.uint8)

    def png(image: Any, **options: Any) -> bytes:
        out = io.BytesIO()
        image.save(out, "PNG", **options)
        return out.getvalue()

    rotated = Image.fromarray(photo(40, 90))
    exif = rotated.getexif()
    exif[0x0112] = 6
    palette = Image.fromarray(photo(70, 52)).quantize(12)
    grey16 = (photo(33, 47)[..., 0].astype(np.uint16) * 3)
    return {"rgb 61x45": png(Image.fromarray(photo(45, 61))),
            "rgba 300x200": png(Image.fromarray(np.dstack([photo(200, 300), photo(200, 300)[..., :1]]))),
            "grey 97x130": png(Image.fromarray(photo(130, 97)[..., 1])),
            "palette 52x70": png(palette, bits=4),
            "grey 16-bit 47x33": png(Image.fromarray(grey16)),
            "exif-rotated 90x40": png(rotated, exif=exif),
            "pixels 23x71": photo(71, 23)}  # fmt: skip


#: the script a vision bundle is checked with under Node.js: each image's pixel values (written beside
#: the result, once), and at each precision its embeddings, labels and zero-shot scores
RUNNER = """const images = {images};
const labels = {labels};
const out = {{}};
async function input(item) {{
  const bytes = new Uint8Array(await readFile(item.file));
  return item.pixels ? {{ data: bytes, width: item.pixels[1], height: item.pixels[0] }} : bytes;
}}
const inputs = [];
for (const item of images) inputs.push(await input(item));
for (const precision of {precisions}) {{
  const model = await load({base}, ort, {{ precision }});
  if (precision === {precisions}[0]) {{
    out.pixels = [];
    for (const [k, image] of inputs.entries()) {{
      const {{ data, dims }} = await model.pixelValues([image]);
      await writeFile(`${{images[k].file}}.pixels`, new Uint8Array(data.buffer));
      out.pixels.push(dims);
    }}
    if (labels.length) out.ids = Array.from(model.tokenizeTexts(labels).ids, Number);
  }}
  const row = {{ embed: [] }};
  for (const image of inputs) row.embed.push(Array.from((await model.embed([image]))[0]));
  if (model.vision.classifier !== "none") row.classify = await model.classify(inputs);
  if (labels.length) row.zero_shot = await model.zeroShot(inputs, labels);
  out[precision] = row;
}}
await writeFile({result}, JSON.stringify(out));
"""


def same_scores(mine: list[Any], theirs: list[dict[str, Any]], bound: float) -> bool:
    """Zero-shot answers alike: every score within ``bound``, the same best label unless the Python
    runtime's best two are within ``2 * bound`` (a near tie may go either way)."""
    for m, t in zip(mine, theirs, strict=True):
        if any(abs(m.scores[k] - t["scores"][k]) > bound for k in m.scores):
            return False
        top = sorted(m.scores.values())[-2:]
        if m.label != t["label"] and (len(top) < 2 or top[1] - top[0] > 2 * bound):
            return False
    return True


def check_vision_bundle(bundle_dir: Path, export_dir: Path, node_modules: Path, runtime: str, node: str = "node",
                        timeout: float = 600.0, images: dict[str, Any] | None = None) -> list[Any]:  # fmt: skip
    """Run a vision bundle under Node.js on ``runtime`` over ``images`` (name -> a path, PNG bytes or
    an (H, W, 3) uint8 array; default :func:`check_images`): its pixel values equal to the Python
    runtime's to the last bit; its embeddings within the float32 bar (a reduced precision: cosine
    ``REDUCED_COSINE``) of the Python runtime's over the bundle's own graph files; the same labels (a classifier)
    and zero-shot labels with scores within ``SCORES_ABSOLUTE`` (CLIP, SigLIP)."""
    from edgeattn.exporters.web import (
        FP32_ABSOLUTE,
        FP32_RELATIVE,
        NODE_PRELUDE,
        BundleCheck,
        bundle_runtime,
        compare_outputs,
        run_check_script,
    )
    from edgeattn.exporters.web import MODULE as MAIN

    described = json.loads((bundle_dir / "bundle.json").read_text())
    precisions = list(dict.fromkeys(f["precision"] for f in described["files"]))
    chosen = images or check_images()
    labels = CHECK_LABELS if described["graphs"]["text"] else []
    with tempfile.TemporaryDirectory(dir=node_modules.parent) as work_name:
        work = Path(work_name)
        items, decoded = [], []
        for k, image in enumerate(chosen.values()):
            if isinstance(image, np.ndarray):
                path = work / f"image{k}.rgb"
                path.write_bytes(np.ascontiguousarray(image, dtype=np.uint8).tobytes())
                items.append({"file": str(path), "pixels": list(image.shape[:2])})
            else:
                path = work / f"image{k}"
                path.write_bytes(Path(image).read_bytes() if isinstance(image, str | Path) else bytes(image))
                items.append({"file": str(path)})
            decoded.append(open_image(image))
        result = work / "result.json"
        script = (NODE_PRELUDE + RUNNER).format(package=runtime, module=(bundle_dir / MAIN).as_uri(),
                               images=json.dumps(items), labels=json.dumps(labels), precisions=json.dumps(precisions),
                               base=json.dumps(str(bundle_dir) + "/"), result=json.dumps(str(result)))  # fmt: skip
        got = run_check_script(script, work, node, timeout, runtime)
        computed = [np.frombuffer(Path(f"{item['file']}.pixels").read_bytes(), dtype="<f4") for item in items]
    checks = []
    for precision in precisions:
        model = bundle_runtime(export_dir, bundle_dir, precision)
        pixels_equal = True  # and the labels' token ids
        for image, have, dims in zip(decoded, computed, got["pixels"], strict=True):
            want = model.preprocessing.pixels(image)
            pixels_equal = pixels_equal and list(want.shape) == list(dims[1:]) and np.array_equal(
                want.reshape(-1), have)  # fmt: skip
        tokens_equal = pixels_equal
        if labels:
            ids, _ = model.text_tokens(labels)
            tokens_equal = tokens_equal and ids.reshape(-1).tolist() == [int(i) for i in got["ids"]]
        want_embed = np.concatenate([model.embed([image]) for image in decoded])
        have_embed = np.asarray(got[precision]["embed"], dtype=np.float32)
        diff, cosine = compare_outputs(want_embed, have_embed)
        if get_precision(precision).float32_parity:
            close = diff <= FP32_ABSOLUTE + FP32_RELATIVE * float(np.abs(want_embed).max())
        else:
            close = cosine >= REDUCED_COSINE
        answers = True
        if "classify" in got[precision]:
            answers = [c.label for c in model.classify(decoded)] == [c["label"] for c in got[precision]["classify"]]
        if labels:
            bound = SCORES_ABSOLUTE if get_precision(precision).float32_parity else REDUCED_SCORES_ABSOLUTE
            answers = answers and same_scores(model.zero_shot(decoded, labels), got[precision]["zero_shot"], bound)
        checks.append(BundleCheck(runtime, precision, tokens_equal, diff, cosine, answers,
                                  tokens_equal and close and answers))  # fmt: skip
    return checks
