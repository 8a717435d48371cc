"""Image encoders on the CPU: images per second of an edgeattn vision export at each precision it
holds, beside transformers eager and Optimum's ONNX export (fp32 and its dynamic int8) in ONNX
Runtime, on the same folder and the same images, batch 1 and 8; preprocessing timed apart.

    python benchmarks/vision_speed.py --folder DINOV2_FOLDER --export EXPORT --images PHOTOS
                                      [--threads 2] [--batches 1,8] [--repeats 5] [--json FILE]

Every engine gets the same pixel values (the export's preprocessing, equal to transformers'); each
row's cosines are its pooled embeddings' least cosine to transformers' float32 over the images at
each batch size (dynamic int8 scales its activations over a whole batch; an
engine that returns only hidden states, as Optimum's feature extraction does, is compared by its
class token, marked so).
Medians of ``--repeats`` rounds of the whole image set, after a warm-up round; each round times
every engine in turn.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgeattn.benchmark.machine import machine_info

log = logging.getLogger(__name__)


def images_per_s(runs: dict[str, Callable[[np.ndarray], np.ndarray]], pixels: np.ndarray, batch: int,
                 repeats: int) -> dict[str, tuple[float, np.ndarray]]:  # fmt: skip
    """Each engine's (images a second, pooled embeddings) over ``pixels`` in batches of ``batch``: a
    warm-up round, then ``repeats`` rounds, each timing every engine in turn (a shared machine's drift
    falls on all of them alike), the median round."""
    def once(run: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        return np.concatenate([run(pixels[i:i + batch]) for i in range(0, len(pixels), batch)])

    outs = {name: once(run) for name, run in runs.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            once(run)
            times[name].append(time.perf_counter() - start)
    return {name: (len(pixels) / statistics.median(times[name]), outs[name]) for name in runs}


def least_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)).min())


def optimum_sessions(folder: Path, scratch: Path, threads: int) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """Optimum's ONNX export of ``folder`` and its dynamic int8 (AVX-512 VNNI, per channel) in ONNX Runtime."""
    import onnxruntime as ort
    from optimum.exporters.onnx import main_export
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    main_export(str(folder), output=scratch / "optimum", task="feature-extraction", no_post_process=True)
    quantizer = ORTQuantizer.from_pretrained(scratch / "optimum", file_name="model.onnx")
    quantizer.quantize(AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=True),
                       save_dir=scratch / "optimum-int8")  # fmt: skip
    runs = {}
    for name, path in (("Optimum fp32", scratch / "optimum" / "model.onnx"),
                       ("Optimum int8 (dynamic)", scratch / "optimum-int8" / "model_quantized.onnx")):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        outputs = [o.name for o in session.get_outputs()]
        if "pooler_output" in outputs:
            runs[name] = lambda x, s=session: s.run(["pooler_output"], {"pixel_values": x})[0]
        else:  # its feature extraction returns the hidden states: compared by their class token
            runs[f"{name} [class token]"] = lambda x, s=session: s.run(["last_hidden_state"],
                                                                      {"pixel_values": x})[0][:, 0]  # fmt: skip
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--export", type=Path, required=True)
    parser.add_argument("--images", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import torch
    import transformers
    from transformers.image_utils import load_image

    from edgeattn.families.vision.heldout import image_files
    from edgeattn.runtime import load
    from edgeattn.runtime.manifest import read_manifest

    torch.set_num_threads(args.threads)
    files = image_files(args.images)
    base = load(args.export, threads=args.threads)
    processor = transformers.AutoImageProcessor.from_pretrained(args.folder, use_fast=False)
    pixels = base.pixel_values(files)
    ours, theirs = [], []
    for _ in range(args.repeats):  # rounds interleaved, after a first one (imports, Pillow's plugins)
        start = time.perf_counter()
        base.pixel_values(files)
        ours.append((time.perf_counter() - start) / len(files))
        start = time.perf_counter()
        processor(images=[load_image(str(f)) for f in files], return_tensors="np")
        theirs.append((time.perf_counter() - start) / len(files))
    ours_pre, theirs_pre = statistics.median(ours), statistics.median(theirs)
    reference = transformers.AutoModel.from_pretrained(args.folder).eval()

    def eager(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return reference(pixel_values=torch.from_numpy(x)).pooler_output.numpy()

    def eager_class_token(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return reference(pixel_values=torch.from_numpy(x)).last_hidden_state[:, 0].numpy()

    runs: dict[str, Callable[[np.ndarray], np.ndarray]] = {"transformers eager fp32": eager}
    with tempfile.TemporaryDirectory(prefix="edgeattn-vision-bench-") as scratch:
        runs.update(optimum_sessions(args.folder, Path(scratch), args.threads))
        manifest = read_manifest(args.export)
        precisions = ["fp32", *sorted({p for g in manifest.graphs.values() for p in g.precisions})]
        for precision in precisions:
            model = load(args.export, precision=precision, threads=args.threads)
            runs[f"edgeattn {precision}"] = lambda x, m=model: m.encode(x)["pooler_output"]
        batches = [int(b) for b in args.batches.split(",")]
        want, want_class_token = eager(pixels), eager_class_token(pixels)
        rows = [{"engine": name} for name in runs]
        for batch in batches:
            measured = images_per_s(runs, pixels, batch, args.repeats)
            for row in rows:
                name = row["engine"]
                rate, got = measured[name]
                row[f"batch {batch} images/s"] = rate
                cosine = least_cosine(got, want_class_token if name.endswith("[class token]") else want)
                row[f"batch {batch} cosine_min"] = cosine  # dynamic int8 scales activations over a batch
                row["cosine_min"] = min(row.get("cosine_min", 1.0), cosine)
            log.info("batch %d done", batch)
    by_name = {r["engine"]: r for r in rows}
    lines = [f"{len(files)} images at {pixels.shape[2]}x{pixels.shape[3]}, {args.threads} threads; preprocessing: "
             f"edgeattn {ours_pre * 1e3:.1f} ms an image, transformers {theirs_pre * 1e3:.1f} ms",
             "| engine | " + " | ".join(f"batch {b} images/s" for b in batches)
             + " | least cosine to transformers (" + ", ".join(f"batch {b}" for b in batches) + ") |",
             "|---|" + "---|" * (len(batches) + 1)]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['engine']} | " + " | ".join(f"{r[f'batch {b} images/s']:.1f}" for b in batches)
                     + " | " + ", ".join(f"{r[f'batch {b} cosine_min']:.5f}" for b in batches) + " |")  # fmt: skip
    optimum_int8 = next((n for n in by_name if n.startswith("Optimum int8")), None)
    if "edgeattn int8" in by_name and optimum_int8 is not None:
        for b in batches:
            key = f"batch {b} images/s"
            ratio = by_name["edgeattn int8"][key] / by_name[optimum_int8][key]
            lines.append(f"edgeattn int8 / Optimum int8 at batch {b}: {ratio:.2f}x")
    print("\n".join(lines))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"benchmark": "vision_speed", "machine": machine_info(),
                                         "folder": str(args.folder), "images": len(files),
                                         "size": list(pixels.shape[2:]), "threads": args.threads,
                                         "preprocessing_ms": {"edgeattn": ours_pre * 1e3,
                                                              "transformers": theirs_pre * 1e3},
                                         "rows": rows}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
