"""A speech export's web and node bundle: what ``bundle.json`` says of it (its own ES module,
``speech.mjs``; its feature and decoding settings as the Python runtime reads them; its mel filters;
its graphs' feed names and cache), and its check under Node.js: the ES module's log-mel features,
segments, times and text against the Python runtime's over the bundle's own graph files."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.runtime.cross_decoding import cross_contract
from edgeattn.runtime.families.speech.decoding import WhisperDecoding
from edgeattn.runtime.families.speech.log_mel import LogMel
from edgeattn.runtime.families.speech.specs import AUDIO_ENCODER, FEATURES
from edgeattn.runtime.manifest import Manifest, sha256_file
from edgeattn.runtime.precisions import get_precision

#: the family's ES module (``runtime/families/speech/speech.mjs``), copied beside ``edgeattn.mjs``
MODULE = "speech.mjs"
#: the mel filter bank (n_mels x (n_fft / 2 + 1)), little-endian float32
MEL_FILTERS = "mel_filters.f32"
#: the task a speech bundle answers
TASK = "transcribe"
#: the features a bundle's log-mel must come within of the Python runtime's (the issue's bar
#: against transformers' extractor)
FEATURES_ABSOLUTE = 1e-4
#: the share of the Python runtime's tokens a reduced precision's bundle must keep (its kernels are
#: onnxruntime 1.30's, the Python runtime's 1.32's: a near tie can go the other way)
REDUCED_AGREEMENT = 0.9


def describe_speech(manifest: Manifest, folder: Path) -> dict[str, Any]:
    """A speech bundle's fields: its module, settings (read from the export's ``settings.json``,
    copied into ``folder``), mel filters (written into ``folder``), sizes, cache and feed names."""
    from edgeattn.exporters.web import SETTINGS

    config = manifest.config
    settings = json.loads((folder / SETTINGS).read_text())
    mel = LogMel.from_dict(settings.get("features") or {}, "settings.json's features")
    decoding = WhisperDecoding.from_dict(settings.get("decoding") or {}, "settings.json's decoding")
    filters = np.ascontiguousarray(mel.filters, dtype="<f4")
    (folder / MEL_FILTERS).write_bytes(filters.tobytes())
    layers = config.n_decoder_layers
    return {"task": TASK, "module": MODULE,
            "features": asdict(mel), "decoding": asdict(decoding),
            "mel_filters": {"file": MEL_FILTERS, "shape": list(filters.shape),
                            "sha256": sha256_file(folder / MEL_FILTERS)},
            "model": {"max_len": config.max_len, "vocab_size": config.vocab_size, "n_heads": config.n_heads,
                      "head_dim": config.head_dim, "n_decoder_layers": layers},
            "contract": cross_contract(AUDIO_ENCODER, {"features": FEATURES}, layers)}  # fmt: skip


def check_clips(window_seconds: float, rate: int) -> dict[str, np.ndarray]:
    """Two clips a speech bundle is checked on when no audio is given: three quarters of a window,
    and 1.3 windows (the long-form path): voiced tones whose pitch and loudness move, under noise."""
    rng = np.random.default_rng(7)
    clips = {}
    for share in (0.75, 1.3):
        t = np.arange(int(share * window_seconds * rate)) / rate
        pitch = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)
        phase = 2 * np.pi * np.cumsum(pitch) / rate
        voiced = sum(np.sin(k * phase) / k for k in range(1, 6)) * (0.5 + 0.5 * np.sin(2 * np.pi * 2.3 * t)) ** 2
        clips[f"{share} window(s)"] = (0.2 * voiced + 0.01 * rng.standard_normal(t.size)).astype(np.float32)
    return clips


#: new tokens a window of the check's plain transcript takes: few enough that a window holds no
#: complete segment, so that long audio moves on window after window whatever the model says
CHECK_WINDOW_TOKENS = 3
#: the script a speech bundle is checked with under Node.js: each clip's features (written beside
#: the result, once), and at each precision its segments with timestamps and a plain transcript
RUNNER = """const clips = {clips};
const out = {{}};
for (const precision of {precisions}) {{
  const model = await load({base}, ort, {{ precision }});
  out[precision] = [];
  for (const [k, clip] of clips.entries()) {{
    const samples = new Float32Array((await readFile(clip)).buffer.slice(0));
    if (precision === {precisions}[0]) {{
      const {{ data, frames }} = model.logMel(samples, samples.length <= model.windowSamples);
      await writeFile(`${{clip}}.features`, new Uint8Array(data.buffer));
      out.frames = [...(out.frames ?? []), frames];
    }}
    const segments = [];
    for await (const s of model.segments(samples, {{ timestamps: true }})) segments.push(s);
    const heard = await model.transcribe(samples, {{ maxNewTokens: {window_tokens} }});
    out[precision].push({{ segments, text: heard.text, language: heard.language }});
  }}
}}
await writeFile({result}, JSON.stringify(out));
"""


def check_speech_bundle(bundle_dir: Path, export_dir: Path, node_modules: Path, runtime: str, node: str = "node",
                        timeout: float = 600.0, audio: dict[str, np.ndarray] | None = None) -> list[Any]:  # fmt: skip
    """Run a speech bundle under Node.js on ``runtime`` over ``audio`` (name -> mono samples at the
    model's rate; default :func:`check_clips`): its log-mel features within ``FEATURES_ABSOLUTE`` of
    the Python runtime's; its segments (timestamps on: tokens, times, text) and a plain transcript
    of ``CHECK_WINDOW_TOKENS`` a window (long audio: every window) the Python runtime's over the
    bundle's own graph files, greedy (a reduced precision: at least ``REDUCED_AGREEMENT`` of the
    tokens)."""
    from edgeattn.exporters.web import MODULE as MAIN
    from edgeattn.exporters.web import NODE_PRELUDE, BundleCheck, bundle_runtime, compare_outputs, run_check_script

    described = json.loads((bundle_dir / "bundle.json").read_text())
    precisions = list(dict.fromkeys(f["precision"] for f in described["files"]))
    features = described["features"]
    clips = audio or check_clips(features["chunk_seconds"], features["rate"])
    with tempfile.TemporaryDirectory(dir=node_modules.parent) as work_name:
        work = Path(work_name)
        paths = []
        for k, samples in enumerate(clips.values()):
            paths.append(work / f"clip{k}.f32")
            paths[-1].write_bytes(np.asarray(samples, dtype="<f4").tobytes())
        result = work / "result.json"
        script = (NODE_PRELUDE + RUNNER).format(package=runtime, module=(bundle_dir / MAIN).as_uri(),
                               clips=json.dumps([str(p) for p in paths]), precisions=json.dumps(precisions),
                               base=json.dumps(str(bundle_dir) + "/"), result=json.dumps(str(result)),
                               window_tokens=CHECK_WINDOW_TOKENS)  # fmt: skip
        got = run_check_script(script, work, node, timeout, runtime)
        computed = [np.frombuffer(Path(f"{p}.features").read_bytes(), dtype="<f4") for p in paths]
    checks = []
    for precision in precisions:
        model = bundle_runtime(export_dir, bundle_dir, precision)
        worst, diff, same, kept, total = 1.0, 0.0, True, 0, 0
        for (samples, have_features, frames, row) in zip(clips.values(), computed, got["frames"], got[precision],
                                                         strict=True):  # fmt: skip
            samples = np.asarray(samples, dtype=np.float32)
            want = model.log_mel(samples, pad_to_window=samples.size <= model.log_mel.window_samples)
            have = have_features.reshape(want.shape[0], int(frames))
            if have.shape != want.shape:
                diff = float("inf")
                continue
            clip_diff, clip_cosine = compare_outputs(want, have)
            diff, worst = max(diff, clip_diff), min(worst, clip_cosine)
            segments = list(model.segments(samples, timestamps=True))
            heard = model.transcribe(samples, max_new_tokens=CHECK_WINDOW_TOKENS)
            mine = [t for s in segments for t in s.tokens]
            theirs = [t for s in row["segments"] for t in s["tokens"]]
            common = next((k for k, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
                          min(len(mine), len(theirs)))  # fmt: skip
            kept += common
            total += max(len(mine), len(theirs))
            same = same and [(s.start, s.end, s.text, list(s.tokens)) for s in segments] == [
                (s["start"], s["end"], s["text"], s["tokens"]) for s in row["segments"]] and (
                heard.text == row["text"] and heard.language == row["language"])  # fmt: skip
        agreement = kept / total if total else 1.0
        exact = get_precision(precision).float32_parity
        answers_ok = same if exact else agreement >= REDUCED_AGREEMENT
        checks.append(BundleCheck(runtime, precision, agreement == 1.0, diff, worst, same,
                                  diff <= FEATURES_ABSOLUTE and answers_ok, agreement))  # fmt: skip
    return checks
