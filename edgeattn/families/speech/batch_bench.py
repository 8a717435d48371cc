"""Several long audios heard together against one at a time, and word probabilities beside
faster-whisper's, on the real Whisper tiny.en (``tests/real/build_whisper_tiny_en.py``'s folder).

Batched: ``transcribe_batch`` decodes the next window of every audio in hand together; one at a
time: ``transcribe`` of each in turn. Both in this process, in interleaved rounds (the fastest of
each kept, the first round's allocations counted in neither's best), over espeak-ng reading the
standard library's documentation (``--clips`` clips of ``--seconds`` each); the texts must be equal.
Word probabilities: each word's probability against faster-whisper float32's on the first clip,
over the words both hear alike (faster-whisper reads them from a second run without the timestamps).

Usage: ``python -m edgeattn.families.speech.batch_bench --export EXPORT [--precision int8] [--threads 2]
[--json benchmarks/results/whisper-batch.json]``, EXPORT an export of that folder.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: the checkout this runs from (the tests' real texts and builders; benchmarks/results)
ROOT = Path(__file__).resolve().parents[3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", type=Path, required=True)
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=70.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "whisper-batch.json")
    args = parser.parse_args()
    os.environ["EDGEATTN_THREADS"] = str(args.threads)
    sys.path.insert(0, str(ROOT / "tests" / "real"))

    import texts
    from build_whisper_tiny_en import package_model

    from edgeattn.families.speech import peers as bench  # its espeak-ng reader and sampling rate

    RATE, _speech = bench.RATE, bench._speech  # noqa: N806

    from edgeattn.benchmark.machine import machine_info
    from edgeattn.runtime import load

    words = " ".join(texts.split("evaluation", 200_000)).split()
    clips, at = [], 0
    with tempfile.TemporaryDirectory(prefix="edgeattn-whisper-batch-") as scratch:
        for k in range(args.clips):  # consecutive passages, each just under the clip's length
            count = int(args.seconds * 2.2)
            while True:
                samples = _speech(" ".join(words[at : at + count]), Path(scratch) / f"clip{k}")
                if samples.size <= args.seconds * RATE:
                    break
                count = int(count * args.seconds * RATE / samples.size * 0.97)
            clips.append(samples)
            at += count
    model = load(args.export, precision=args.precision)
    model.transcribe(clips[0][: 5 * RATE])  # the sessions built and warmed
    alone_s, together_s, same = [], [], True
    for _ in range(args.rounds):
        start = time.perf_counter()
        alone = [model.transcribe(c) for c in clips]
        alone_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        together = model.transcribe_batch(clips, batch_size=len(clips))
        together_s.append(time.perf_counter() - start)
        same = same and [t.text for t in alone] == [t.text for t in together]
    audio_s = sum(c.size for c in clips) / RATE
    print(f"{len(clips)} clips, {audio_s:.0f} s of audio, {args.precision}, {args.threads} threads: one at a time "
          f"{min(alone_s):.2f} s, batched {min(together_s):.2f} s ({min(alone_s) / min(together_s):.2f}x), "
          f"same text: {same}")  # fmt: skip

    from faster_whisper import WhisperModel

    clip = clips[0][: 24 * RATE]
    peer = WhisperModel(str(package_model()), device="cpu", compute_type="float32", cpu_threads=args.threads)
    segments, _ = peer.transcribe(clip, beam_size=1, word_timestamps=True, language="en",
                                  condition_on_previous_text=False)  # fmt: skip
    theirs = [(w.word.strip(), w.probability) for s in segments for w in s.words]
    ours = [(w.word.strip(), w.probability) for s in model.transcribe(clip, word_timestamps=True).segments
            for w in s.words or ()]  # fmt: skip
    alike = [abs(p - q) for (a, p), (b, q) in zip(theirs, ours, strict=False) if a == b]
    print(f"word probabilities on 24 s ({args.precision}): {len(alike)} words alike of {len(ours)}, "
          f"|ours - faster-whisper float32| mean {np.mean(alike):.3f}, max {np.max(alike):.3f}")  # fmt: skip
    result = {"benchmark": "whisper batch", "machine": machine_info(), "export": str(args.export),
              "precision": args.precision, "threads": args.threads, "clips": len(clips), "audio_s": round(audio_s, 1),
              "one_at_a_time_s": [round(s, 3) for s in alone_s], "batched_s": [round(s, 3) for s in together_s],
              "speedup": round(min(alone_s) / min(together_s), 3), "same_text": same,
              "word_probability": {"words_alike": len(alike), "words": len(ours),
                                   "mean_abs_diff": round(float(np.mean(alike)), 4),
                                   "max_abs_diff": round(float(np.max(alike)), 4)}}  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
