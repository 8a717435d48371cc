"""A Whisper folder exported with ``edgeattn export --from-hf`` transcribes as transformers'
``generate`` does on the same audio: the same tokens, segments and times, one window or several
(long-form audio), given or detected language, transcribe and translate; from files, bytes and
samples; printed by ``edgeattn run`` as text, srt, vtt or json."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner

from edgeattn.cli import cli
from edgeattn.errors import EdgeattnError
from edgeattn.runtime import load
from edgeattn.runtime.exported_model import InputError
from edgeattn.runtime.families.speech.formats import clock, render
from edgeattn.runtime.families.speech.runtime import Transcript, WhisperRuntime
from tests.helpers.speech_folders import (
    GENERATION,
    RATE,
    WINDOW_SECONDS,
    audio,
    speech_folder,
)

transformers = pytest.importorskip("transformers")
soundfile = pytest.importorskip("soundfile")
pytest.importorskip("soxr")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("whisper-runtime")
    folder = speech_folder(root / "folder")
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(root / "export")])
    assert result.exit_code == 0, result.output
    return folder, root / "export", result.output


def test_export_verifies_and_keeps_the_settings(exported):
    folder, export, output = exported
    assert "tokens identical" in output and "FAIL" not in output and "against transformers" in output
    model = load(export)
    assert isinstance(model, WhisperRuntime) and model.family.name == "speech"
    assert model.config.section.n_mels == 80 and model.config.section.frames == 200
    assert set(model.graphs) == {"audio_encoder", "cross_kv", "decoder", "decoder_fixed"}
    assert model.log_mel.window_frames == 200 and model.decoding.no_timestamps == GENERATION["no_timestamps_token_id"]
    settings = json.loads((export / "settings.json").read_text())
    assert settings["decoding"]["lang_to_id"] == GENERATION["lang_to_id"]


def _theirs(folder, samples, language, task, timestamps, **search):
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(folder)
    reference = transformers.WhisperForConditionalGeneration.from_pretrained(folder).eval()
    long_form = samples.size > WINDOW_SECONDS * RATE
    extra = {"truncation": False, "padding": "longest", "return_attention_mask": True} if long_form else {}
    features = extractor(samples, sampling_rate=RATE, return_tensors="pt", **extra).input_features
    with torch.no_grad():
        out = reference.generate(features, language=language, task=task, return_timestamps=timestamps or long_form,
                                 return_segments=True, max_new_tokens=30, **search)  # fmt: skip
        detected = reference.detect_language(features[:, :, :200])
    segments = [(round(float(s["start"]), 3), round(float(s["end"]), 3), s["tokens"].tolist())
                for s in out["segments"][0]]  # fmt: skip
    return segments, int(detected[0])


@pytest.mark.parametrize("seconds,language,task,timestamps", [
    (1.5, "fr", "transcribe", True), (1.5, None, "transcribe", False), (5.3, "de", "translate", True),
    (7.9, None, "transcribe", True)])  # fmt: skip
def test_transcripts_equal_transformers_generate(exported, seconds, language, task, timestamps):
    folder, export, _ = exported
    samples = audio(seconds, seed=int(seconds * 10))
    theirs, detected = _theirs(folder, samples, language, task, timestamps)
    heard = load(export).transcribe(samples, language=language, task=task, timestamps=timestamps,
                                    max_new_tokens=30)  # fmt: skip
    ours = [(s.start, s.end, list(s.tokens)) for s in heard.segments]
    if timestamps or seconds > WINDOW_SECONDS:
        assert ours == theirs
    else:  # one segment, the audio's length (transformers: the window's)
        assert [o[2] for o in ours] == [t[2] for t in theirs] and ours[0][:2] == (0.0, seconds)
    names = {v: k.strip("<|>") for k, v in GENERATION["lang_to_id"].items()}
    assert heard.language == (language or names[detected]) and heard.duration == pytest.approx(seconds)
    words = [f"w{t}" for s in ours for t in s[2] if t < GENERATION["eos_token_id"]]
    assert heard.text == " ".join(words) and len(words) > 0


@pytest.mark.parametrize("seconds,language,timestamps,beams", [
    (1.5, "fr", True, 3), (1.5, "fr", False, 4), (7.9, None, True, 3), (5.3, "de", True, 2)])  # fmt: skip
def test_beams_equal_transformers_generate(exported, seconds, language, timestamps, beams):
    folder, export, _ = exported
    samples = audio(seconds, seed=int(seconds * 10) + 1)
    theirs, _ = _theirs(folder, samples, language, "transcribe", timestamps, num_beams=beams)
    heard = load(export).transcribe(samples, language=language, timestamps=timestamps, max_new_tokens=30,
                                    num_beams=beams)  # fmt: skip
    ours = [(s.start, s.end, list(s.tokens)) for s in heard.segments]
    if timestamps or seconds > WINDOW_SECONDS:
        assert ours == theirs
    else:
        assert [o[2] for o in ours] == [t[2] for t in theirs]


def test_silent_windows_are_skipped_as_transformers_skips_them(exported):
    folder, export, _ = exported
    samples = audio(5.3, seed=77)
    model = load(export)
    reference = transformers.WhisperForConditionalGeneration.from_pretrained(folder).eval()
    features = transformers.WhisperFeatureExtractor.from_pretrained(folder)(samples[: WINDOW_SECONDS * RATE],
                                                                          sampling_rate=RATE, return_tensors="pt")
    with torch.no_grad():
        after_start = reference(input_features=features.input_features,
                                decoder_input_ids=torch.tensor([[GENERATION["decoder_start_token_id"]]])).logits
    want = float(after_start[0, -1].softmax(-1)[GENERATION["no_timestamps_token_id"] - 1])
    kept = model.transcribe(samples, language="de", max_new_tokens=30, logprob_threshold=100.0,
                            no_speech_threshold=1.0)  # fmt: skip
    assert kept.segments and kept.segments[0].no_speech_prob == pytest.approx(want, rel=1e-3, abs=1e-7)
    for threshold in (0.0, 1.0):  # every window silent (its log-probability is under 100), none
        search = {"logprob_threshold": 100.0, "no_speech_threshold": threshold}
        theirs, _ = _theirs(folder, samples, "de", "transcribe", True, temperature=0.0, **search)
        heard = model.transcribe(samples, language="de", max_new_tokens=30, **search)
        assert [(s.start, s.end, list(s.tokens)) for s in heard.segments] == theirs
        assert bool(theirs) == (threshold == 1.0)


def test_the_fallback_samples_a_failed_window_at_the_next_temperature(exported):
    from edgeattn.runtime.families.speech.decoding import SearchOptions, WhisperSettingsError, token_compression_ratio

    _, export, _ = exported
    model = load(export)
    samples = audio(1.5, seed=15)
    common = {"language": "fr", "timestamps": True, "max_new_tokens": 20}

    def heard(**search):
        return [(s.tokens, s.temperature) for s in model.transcribe(samples, **common, **search).segments]

    greedy = heard()
    assert {t for _, t in greedy} == {0.0}
    assert heard(temperature=(0.0, 0.7), compression_ratio_threshold=1e9) == greedy  # nothing fails: greedy
    failed = heard(temperature=(0.0, 0.7), compression_ratio_threshold=0.0, seed=7)  # everything fails
    assert {t for _, t in failed} == {0.7} and [x for x, _ in failed] != [x for x, _ in greedy]
    assert heard(temperature=(0.0, 0.7), compression_ratio_threshold=0.0, seed=7) == failed  # a seed repeats
    assert heard(temperature=(0.0, 0.7), logprob_threshold=0.0, seed=7) == failed  # a mean log-probability < 0
    # sampling at a vanishing temperature, or from the one likeliest token, is greedy
    assert [x for x, _ in heard(temperature=1e-4, seed=1)] == [x for x, _ in greedy]
    assert [x for x, _ in heard(temperature=1.0, top_k=1, seed=1)] == [x for x, _ in greedy]
    tokens = [50258, 7, 7, 7, 7, 7, 7, 7, 7, 7, 900, 50257]
    ratio = transformers.WhisperForConditionalGeneration._retrieve_compression_ratio(torch.tensor(tokens), 51865)
    assert token_compression_ratio(tokens, 51865) == pytest.approx(ratio)
    for bad, message in [({"num_beams": 0}, "num_beams"), ({"temperature": -1}, "temperature"),
                         ({"temperature": ()}, "temperature"), ({"no_speech_threshold": 0.6}, "needs logprob"),
                         ({"top_k": -2}, "top_k")]:  # fmt: skip
        with pytest.raises(WhisperSettingsError, match=message):
            SearchOptions(**bad)
    with pytest.raises(InputError, match="no option beam_size"):
        model.transcribe(samples, beam_size=5)


def test_run_takes_beams_and_the_fallback(exported, tmp_path):
    _, export, _ = exported
    soundfile.write(tmp_path / "talk.wav", audio(1.5, seed=31), RATE)
    runner = CliRunner()

    def run(*options: str):
        return runner.invoke(cli, ["run", str(export), str(tmp_path / "talk.wav"), "--language", "fr",
                                   "--max-new-tokens", "12", "--format", "json", *options])  # fmt: skip

    model = load(export)
    beams = run("--strategy", "beam", "--beams", "3")
    assert beams.exit_code == 0, beams.output
    want = model.transcribe(tmp_path / "talk.wav", language="fr", max_new_tokens=12, num_beams=3)
    assert json.loads(beams.output)["text"] == want.text
    fallback = run("--fallback", "0,0.5", "--compression-ratio-threshold", "0", "--seed", "3")
    assert fallback.exit_code == 0, fallback.output
    assert {s["temperature"] for s in json.loads(fallback.output)["segments"]} == {0.5}
    bad = run("--fallback", "0,hot")
    assert bad.exit_code == 2 and "not temperatures separated by commas" in bad.output
    lonely = run("--no-speech-threshold", "0.6")
    assert lonely.exit_code == 1 and "needs logprob_threshold" in lonely.output and "Traceback" not in lonely.output


def test_audio_from_files_bytes_and_samples(exported, tmp_path):
    _, export, _ = exported
    model = load(export)
    samples = audio(1.2, seed=5)
    soundfile.write(tmp_path / "clip.wav", samples, RATE, subtype="FLOAT")
    want = model.transcribe(samples, language="fr", max_new_tokens=8)
    assert model.transcribe(tmp_path / "clip.wav", language="fr", max_new_tokens=8) == want
    assert model.transcribe((tmp_path / "clip.wav").read_bytes(), language="fr", max_new_tokens=8) == want
    stereo = np.stack([samples, samples], axis=1)  # channels averaged
    assert model.transcribe(stereo, language="fr", max_new_tokens=8).segments == want.segments
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, RATE, format="FLAC")
    assert len(model.transcribe(buffer.getvalue(), language="fr", max_new_tokens=8).segments) == 1
    with pytest.raises(EdgeattnError, match="not audio"):
        model.transcribe(b"not sound at all", language="fr")
    with pytest.raises(InputError, match="rate only with samples"):
        model.transcribe(tmp_path / "clip.wav", rate=8000)
    with pytest.raises(EdgeattnError, match="no language 'xx'"):
        model.transcribe(samples, language="xx")
    with pytest.raises(InputError, match="at most 64 tokens"):
        model.transcribe(samples, language="fr", max_new_tokens=100)
    with pytest.raises(InputError, match="features are"):
        model.decode(np.zeros((1, 80, 201), np.float32), [[1]], 2)


def test_the_plain_decoder_answers_as_the_cache_written_in_place(exported, tmp_path):
    folder, export, _ = exported
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(tmp_path / "plain"),
                                      "--graphs", "decoder", "--no-verify"])  # fmt: skip
    assert result.exit_code == 0, result.output
    plain = load(tmp_path / "plain")
    assert "decoder_fixed" not in plain.graphs
    samples = audio(3.1, seed=9)
    options = {"language": "de", "timestamps": True, "max_new_tokens": 12}
    def heard(model):
        return [(s.start, s.end, s.text, s.tokens) for s in model.transcribe(samples, **options).segments]

    assert heard(plain) == heard(load(export))


def test_run_prints_text_srt_vtt_and_json(exported, tmp_path):
    _, export, _ = exported
    soundfile.write(tmp_path / "talk.wav", audio(3.3, seed=11), RATE)
    runner = CliRunner()

    def run(*options: str) -> str:
        result = runner.invoke(cli, ["run", str(export), str(tmp_path / "talk.wav"), "--language", "de",
                                     "--max-new-tokens", "10", *options])  # fmt: skip
        assert result.exit_code == 0, result.output
        return result.output

    transcript = Transcript(**{**json.loads(run("--format", "json")), "segments": []})
    assert run().strip() == transcript.text
    srt = run("--format", "srt").split("\n\n")
    assert srt[0].startswith("1\n00:00:0") and " --> " in srt[0]
    assert run("--format", "vtt").startswith("WEBVTT\n\n00:00:")
    lines = run("--timestamps").splitlines()
    assert all(line.startswith("[00:00:") for line in lines)
    assert run("--timestamps", "--stream") == run("--timestamps")
    missing = runner.invoke(cli, ["run", str(export), str(tmp_path / "none.wav")])
    assert missing.exit_code != 0 and "none.wav is not a file" in missing.output


def test_formats_and_refusals(exported):
    folder, _, _ = exported
    assert clock(3725.0456) == "01:02:05,046" and clock(0.5, ".") == "00:00:00.500"
    heard = Transcript(" hello", [], "en", 1.0)
    assert render(heard, "txt") == "hello\n" and json.loads(render(heard, "json"))["language"] == "en"
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", "never", "--task", "generate"])
    assert result.exit_code != 0 and "its task is transcribe" in result.output and not Path("never").exists()


def test_the_speech_gate_passes_int8_and_refuses_another_model(exported, tmp_path):
    from edgeattn.exporters.gate import HeldOut, evaluate
    from edgeattn.families.speech.hf import import_whisper

    folder, export, _ = exported
    clips = tmp_path / "heldout"
    clips.mkdir()
    for i, seconds in enumerate((1.1, 2.9)):  # one window, and two
        soundfile.write(clips / f"{i}.wav", audio(seconds, seed=40 + i), RATE)
    out = tmp_path / "int8"
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(out), "--precision", "int8",
                                      "--heldout", str(clips), "--no-verify"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "precision int8: ok (held out: folder heldout (3 inputs))" in result.output
    assert "tokens_kept" in result.output and "audio_encoder" in result.output
    heard = load(out, precision="int8").transcribe(audio(1.5, seed=2), language="fr", max_new_tokens=8)
    assert len(heard.segments) == 1 and heard.text
    # the audio encoder's self-attention is MultiHeadAttention over separate projections (flash
    # attention on the CPU, no (heads, T, T) scores), which the block-wise quantiser reaches
    encoder = onnx.load(str(out / "audio_encoder.int8.onnx"), load_external_data=False)
    ops = [n.op_type for n in encoder.graph.node]
    layers = load(out).config.n_encoder_layers
    assert ops.count("MultiHeadAttention") == layers and "Attention" not in ops and "MatMulNBits" in ops
    # a Reshape of a weight both decoders share is a view over its bytes, not a copy ONNX Runtime makes
    for graph in ("decoder", "decoder_fixed"):
        decoder = onnx.load(str(out / f"{graph}.int8.onnx"), load_external_data=False)
        regions = {t.name: {e.key: e.value for e in t.external_data} for t in decoder.graph.initializer}
        shared = [n for n in decoder.graph.node if n.op_type == "Reshape" and regions.get(n.input[0], {})
                  .get("location", "").endswith(".int8.data")]  # fmt: skip
        assert shared == [] and "GatherBlockQuantized" in [n.op_type for n in decoder.graph.node]
    model = import_whisper(folder)
    rows = 4
    heldout = HeldOut(np.full((rows, 1), model.config.bos_id), np.ones((rows, 1), np.int64))
    same = evaluate(model, load(export), "int8", heldout)
    assert same.passed and same.metrics["generation"]["tokens_kept"] == 1.0
    assert "random log-mel features" in same.heldout and "give --heldout with audio" in same.table()
    other = speech_folder(tmp_path / "other", seed=8)  # the same shapes, other weights: a graph that lost the model
    CliRunner().invoke(cli, ["export", "--from-hf", str(other), "-o", str(tmp_path / "other-export"), "--no-verify"])
    wrong = evaluate(model, load(tmp_path / "other-export"), "int8", heldout)
    assert not wrong.passed and wrong.metrics["generation"]["tokens_kept"] < 0.5


def test_int4_is_fitted_by_gptq_on_the_held_out_speech(exported, tmp_path, monkeypatch):
    """Every 4-bit product of the decoders is fitted on the held-out windows (its weight found among
    the model's products by value, the alignment heads' queries as rows of theirs), once for both
    decoder graphs; their output layer, the audio encoder and the cross keys/values stay 8-bit;
    without held-out audio the levels are rounded to nearest and the record says why."""
    from edgeattn.families.speech import fit

    fitted_runs: list[int] = []
    real_fit = fit._fit
    monkeypatch.setattr(fit, "_fit", lambda model, data, products, *rest: fitted_runs.append(len(products))
                        or real_fit(model, data, products, *rest))  # fmt: skip
    folder, _, _ = exported
    clips = tmp_path / "heldout"
    clips.mkdir()
    for i, seconds in enumerate((1.3, 2.6)):
        soundfile.write(clips / f"{i}.wav", audio(seconds, seed=60 + i), RATE)
    out = tmp_path / "int4"
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(out), "--precision", "int4",
                                      "--heldout", str(clips), "--no-verify", "--allow-degraded"])  # fmt: skip
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    for graph, entry in manifest["graphs"].items():
        record = entry["precisions"]["int4"]["quantization"]
        model = onnx.load(str(out / entry["precisions"]["int4"]["file"]), load_external_data=False)
        four = [n for n in model.graph.node if n.op_type == "MatMulNBits"
                and any(a.name == "bits" and a.i == 4 for a in n.attribute)]  # fmt: skip
        if not graph.startswith("decoder"):
            assert record["bits"] == 8 and not four, (graph, record)
            continue
        assert four and record["method"] == "gptq" and record["fitted_products"] == len(four), (graph, record)
        assert "heldout" in record["fitted_on"] and "the gate measures too" in record["fitted_on"]
        assert record["output_layer_bits"] == 8 and record["accuracy_level"] == 4
    rounded = tmp_path / "int4-rtn"
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(folder), "-o", str(rounded), "--precision", "int4",
                                      "--no-verify", "--allow-degraded"])  # fmt: skip
    assert result.exit_code == 0, result.output
    entry = json.loads((rounded / "manifest.json").read_text())["graphs"]["decoder"]["precisions"]["int4"]
    record = entry["quantization"]
    assert record["method"] == "rtn" and "give --heldout" in record["not_fitted_because"]
    assert len(fitted_runs) == 1 and fitted_runs[0] > 0  # decoder_fixed's products were decoder's, fitted once


@pytest.mark.parametrize("seconds,language,search", [
    (1.5, "fr", {}), (7.9, "de", {}), (5.3, "de", {"num_beams": 3})])  # fmt: skip
def test_word_times_follow_transformers_token_timestamps(exported, seconds, language, search):
    """Each token's start is transformers' token timestamp of the token before it (the same
    alignment path: the alignment heads' weights, filtered, through dynamic time warping), one
    window or several, greedy or beams; each word spans its tokens."""
    from tests.helpers.whisper_times import their_token_starts

    folder, export, _ = exported
    samples = audio(seconds, seed=int(seconds * 10))
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(folder)
    reference = transformers.WhisperForConditionalGeneration.from_pretrained(folder, attn_implementation="eager")
    extra = {"truncation": False, "padding": "longest"} if seconds > WINDOW_SECONDS else {}
    inputs = extractor(samples, sampling_rate=RATE, return_tensors="pt", return_attention_mask=True, **extra)
    with torch.no_grad():
        out = reference.eval().generate(inputs.input_features, attention_mask=inputs.attention_mask,
                                        language=language, return_timestamps=True, return_segments=True,
                                        return_token_timestamps=True, max_new_tokens=30, **search)  # fmt: skip
    heard = load(export).transcribe(samples, language=language, max_new_tokens=30, word_timestamps=True, **search)
    ours = [(list(s.tokens), list(s.token_times)) for s in heard.segments]
    assert ours == their_token_starts(out, heard.segments)
    assert any(t > 0 for _, times in ours for t in times)
    for segment in heard.segments:
        text = [i for i, t in enumerate(segment.tokens) if t < GENERATION["eos_token_id"]]
        assert [w.word for w in segment.words] == ["".join(f"w{segment.tokens[i]}" for i in text)] if text else []
        if text:  # one word (the test tokenizer writes no spaces): from its first token's start to the next's
            word, starts = segment.words[0], segment.token_times
            assert word.start == starts[text[0]] and word.end >= word.start


def test_word_probabilities_are_transformers_text_token_probabilities(exported):
    """A word's probability is the mean of its tokens' probabilities among the text tokens, each
    under the logits it was generated from: transformers' logits over the same window, teacher-forced."""
    folder, export, _ = exported
    samples = audio(1.5, seed=15)
    model = load(export)
    heard = model.transcribe(samples, language="fr", max_new_tokens=30, word_timestamps=True)
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(folder)
    reference = transformers.WhisperForConditionalGeneration.from_pretrained(folder).eval()
    features = extractor(samples, sampling_rate=RATE, return_tensors="pt").input_features
    prompt = model.decoding.prompt("fr", "transcribe", timestamps=True)
    generated = [t for s in heard.segments for t in s.tokens]
    with torch.no_grad():
        logits = reference(features, decoder_input_ids=torch.tensor([prompt + generated])).logits[0].double()
    eos = GENERATION["eos_token_id"]
    probs = torch.softmax(logits[len(prompt) - 1 :, :eos], dim=-1)
    at, checked = 0, 0
    for segment in heard.segments:
        text = [at + i for i, t in enumerate(segment.tokens) if t < eos]
        at += len(segment.tokens)
        for word in segment.words or ():  # the test tokenizer writes no spaces: one word a segment
            want = float(np.mean([probs[k, generated[k]].item() for k in text]))
            assert word.probability == pytest.approx(want, abs=1e-5)
            checked += 1
    assert checked and all(0 < w.probability <= 1 for s in heard.segments for w in s.words or ())


def test_run_prints_word_times_and_an_export_without_alignment_heads_says_so(exported, tmp_path):
    from dataclasses import replace

    from edgeattn.runtime.families.speech.specs import ALIGNMENT

    _, export, _ = exported
    path = tmp_path / "clip.wav"
    soundfile.write(path, audio(1.5, seed=15), RATE)
    model = load(export)
    heard = model.transcribe(path, language="fr", word_timestamps=True)
    lines = CliRunner().invoke(cli, ["run", str(export), str(path), "--language", "fr", "--word-timestamps"])
    assert lines.exit_code == 0, lines.output
    words = [w for s in heard.segments for w in s.words]
    assert lines.output.splitlines() == [f"[{clock(w.start, '.')} --> {clock(w.end, '.')}]  {w.word.strip()}"
                                         for w in words]  # fmt: skip
    printed = CliRunner().invoke(cli, ["run", str(export), str(path), "--language", "fr", "--word-timestamps",
                                       "--format", "json"])  # fmt: skip
    said = json.loads(printed.output)["segments"]
    assert [w for s in said for w in s["words"]] == [{"word": w.word, "start": w.start, "end": w.end,
                                                     "probability": w.probability} for w in words]
    assert model.transcribe(path, language="fr").segments[0].words is None
    decoder = model.specs["decoder"]
    model.specs["decoder"] = replace(decoder, outputs=tuple(o for o in decoder.outputs if o.name != ALIGNMENT))
    with pytest.raises(InputError, match="no alignment_heads"):
        model.transcribe(path, language="fr", word_timestamps=True)


@pytest.mark.parametrize("seconds,language,condition", [
    (1.5, "fr", {}), (7.9, "de", {}), (7.9, "de", {"condition_on_prev_tokens": True}),
    (7.9, "de", {"condition_on_prev_tokens": True, "prompt_condition_type": "all-segments"}),
    (5.3, "de", {"condition_on_prev_tokens": True, "num_beams": 2})])  # fmt: skip
def test_a_prompt_and_the_text_heard_so_far_condition_windows_as_transformers(exported, seconds, language, condition):
    """A prompt before a window (one, or the long-form path's first: this random model's timestamps
    run past its 2 s windows, so it decodes one), alone or as the text heard so far, gives
    transformers' segments with its ``prompt_ids`` and ``condition_on_prev_tokens`` (later windows
    decoded after the text heard: tests/real/test_whisper_tiny_en.py)."""
    folder, export, _ = exported
    samples = audio(seconds, seed=int(seconds * 10) + 3)
    prev_sot = GENERATION["suppress_tokens"][-2]  # transformers' <|startofprev|> where the config names none
    prompt_ids = torch.tensor([prev_sot, 5, 17, 300])
    theirs, _ = _theirs(folder, samples, language, "transcribe", True, prompt_ids=prompt_ids, **condition)
    model = load(export)
    heard = model.transcribe(samples, language=language, timestamps=True, max_new_tokens=30, prompt="w5 w17 w300",
                             **condition)  # fmt: skip
    assert [(s.start, s.end, list(s.tokens)) for s in heard.segments] == theirs
    plain = model.transcribe(samples, language=language, timestamps=True, max_new_tokens=30)
    assert [s.tokens for s in plain.segments] != [s.tokens for s in heard.segments]  # the prompt was heard


def test_run_takes_a_prompt_and_prompts_are_refused_where_they_cannot_work(exported, tmp_path):
    _, export, _ = exported
    model = load(export)
    path = tmp_path / "clip.wav"
    soundfile.write(path, audio(1.5, seed=16), RATE)
    printed = CliRunner().invoke(cli, ["run", str(export), str(path), "--language", "fr", "--prompt", "w5 w17 w300",
                                       "--condition-on-previous-text"])  # fmt: skip
    assert printed.exit_code == 0, printed.output
    after = model.transcribe(path, language="fr", prompt="w5 w17 w300", condition_on_prev_tokens=True)
    assert printed.output.strip() == after.text.strip()
    with pytest.raises(InputError, match="set condition_on_prev_tokens too"):
        model.transcribe(audio(0.5, seed=1), language="fr", prompt="w5", prompt_condition_type="all-segments")
    with pytest.raises(InputError, match="one of first-segment, all-segments"):
        model.transcribe(audio(0.5, seed=1), language="fr", prompt="w5", prompt_condition_type="every")
    with pytest.raises(InputError, match="no special tokens"):
        model.transcribe(audio(0.5, seed=1), language="fr", prompt="w5 <|s50300|>")


def test_a_triton_repository_transcribes_where_edgeattn_is_not_installed(exported, tmp_path):
    """``edgeattn triton`` on a speech export: the end-to-end model carries the export (its
    features and decoding settings) and, importing only its vendor folder, answers each audio file
    of a request as the runtime transcribes it; graph models over BLS are refused."""
    from edgeattn.errors import ConfigError
    from edgeattn.serving.repository import RepositoryOptions, write_repository
    from tests.helpers.without_edgeattn import run_vendored

    _, export, _ = exported
    clips = [audio(1.5, seed=41), audio(5.3, seed=42)]
    files = []
    for i, clip in enumerate(clips):
        buffer = io.BytesIO()
        soundfile.write(buffer, clip, RATE, format="WAV")
        files.append(buffer.getvalue())
        (tmp_path / f"{i}.wav").write_bytes(files[-1])
    repo = write_repository(export, tmp_path / "repo", RepositoryOptions())
    assert repo.task == "transcribe" and set(repo.models) == {repo.name}
    config = (repo.path / repo.name / "config.pbtxt").read_text()
    assert 'name: "audio"' in config and 'name: "segments"' in config and '"in-process"' in config
    assert "`audio`" in (repo.path / "README.md").read_text()
    code = (
        "import json, runpy\n"
        "import numpy as np\n"
        "assert 'TritonPythonModel' in runpy.run_path(str(version / 'model.py'))\n"
        "from edgeattn.serving.tasks import answer\n"
        "from edgeattn.serving.triton_backend import served_model\n"
        "model, settings = served_model(version, 'in-process', 8)\n"
        "files = [(version.parent.parent.parent / f'{i}.wav').read_bytes() for i in (0, 1)]\n"
        "asked = [{'audio': np.array([[f] for f in files], dtype=object), 'language': np.array([[b'de']], object),\n"
        "          'timestamps': np.array([[True]]), 'word_timestamps': np.array([[True]])},\n"
        "         {'language': np.ones(1)}]\n"
        "found = answer(model, settings['task'], asked)\n"
        "assert 'no' in str(found[1]) and 'audio' in str(found[1])\n"
        "print(json.dumps({k: [v.decode() for v in found[0][k][:, 0]] for k in ('text', 'segments', 'language')}))\n"
        "assert not [m for m in sys.modules if m.startswith(('torch', 'transformers')) and sys.modules[m]]\n"
    )
    got = json.loads(run_vendored(repo.path / repo.name / "1", code).strip())
    model = load(export)
    want = [model.transcribe(c, language="de", timestamps=True, word_timestamps=True) for c in clips]
    assert got["text"] == [w.text.strip() for w in want] and got["language"] == ["de", "de"]
    segments = [json.loads(s) for s in got["segments"]]
    assert [[(s["start"], s["end"], s["tokens"]) for s in one] for one in segments] == [
        [(s.start, s.end, list(s.tokens)) for s in w.segments] for w in want]  # fmt: skip
    assert all("words" in s for one in segments for s in one)
    with pytest.raises(ConfigError, match="drop --graphs bls"):
        write_repository(export, tmp_path / "bls", RepositoryOptions(graphs="bls"))


@pytest.mark.slow
def test_a_real_triton_server_transcribes_as_the_runtime(exported, tmp_path):
    """``edgeattn serve``'s server on a speech export: an audio file's bytes in over HTTP, the
    runtime's transcript and segments out; a request without audio is answered with its error."""
    pytest.importorskip("pytriton")
    http = pytest.importorskip("tritonclient.http")
    from edgeattn.serving.repository import RepositoryOptions, write_repository
    from edgeattn.serving.triton_server import TritonServer

    _, export, _ = exported
    clip = audio(1.5, seed=43)
    buffer = io.BytesIO()
    soundfile.write(buffer, clip, RATE, format="WAV")
    repo = write_repository(export, tmp_path / "repo", RepositoryOptions())
    want = load(export).transcribe(clip, language="fr", timestamps=True)

    def tensor(name: str, value: object, kind: str) -> object:
        found = http.InferInput(name, [1, 1], kind)
        found.set_data_from_numpy(np.array([[value]], dtype=object if kind == "BYTES" else bool))
        return found

    with TritonServer(repo.path, [repo.name], log_file=tmp_path / "server.log") as server:
        client = http.InferenceServerClient(server.http_url)
        out = client.infer(repo.name, [tensor("audio", buffer.getvalue(), "BYTES"), tensor("language", b"fr", "BYTES"),
                                       tensor("timestamps", True, "BOOL")])  # fmt: skip
        assert out.as_numpy("text")[0, 0].decode() == want.text.strip()
        segments = json.loads(out.as_numpy("segments")[0, 0].decode())
        assert [(s["start"], s["end"], s["tokens"]) for s in segments] == [(s.start, s.end, list(s.tokens))
                                                                           for s in want.segments]  # fmt: skip
        with pytest.raises(Exception, match="audio"):
            client.infer(repo.name, [tensor("language", b"fr", "BYTES")])


@pytest.mark.parametrize("options", [
    {"language": "fr", "timestamps": True}, {"language": None}, {"language": "de", "num_beams": 3},
    {"language": "fr", "word_timestamps": True, "prompt": "w5 w17"},
    {"language": "fr", "prompt": "w5 w17", "condition_on_prev_tokens": True}])  # fmt: skip
def test_a_batch_of_clips_is_heard_as_each_alone_and_as_transformers_batch(exported, options, monkeypatch):
    """Clips of several lengths (two over a window: heard window by window beside the others, each
    seeking on its own) transcribed together give each clip's transcript alone; batched greedy
    equals transformers' batched ``generate``."""
    folder, export, _ = exported
    clips = [audio(seconds, seed=60 + i) for i, seconds in enumerate((1.5, 5.3, 0.6, 1.9, 4.2, 1.1))]
    model = load(export)
    searched = model._search_windows
    rows: list[int] = []

    def counted(features, *args, **kwargs):
        rows.append(features.shape[0])
        return searched(features, *args, **kwargs)

    monkeypatch.setattr(model, "_search_windows", counted)
    together = model.transcribe_batch(clips, max_new_tokens=30, batch_size=3, **options)
    batched = list(rows)
    alone = [model.transcribe(c, max_new_tokens=30, **options) for c in clips]
    # every window heard once, never more than batch_size at a time, and windows searched together
    # (a clip that decodes timestamps apart from one that does not)
    assert sum(batched) == len(rows) - len(batched) and max(batched) <= 3 and len(batched) < sum(batched)
    assert [t.as_dict() for t in together] == [t.as_dict() for t in alone]
    if set(options) == {"language"}:  # greedy, no timestamps: transformers' batch of the short clips
        short = [c for c in clips if c.size <= WINDOW_SECONDS * RATE]
        extractor = transformers.WhisperFeatureExtractor.from_pretrained(folder)
        reference = transformers.WhisperForConditionalGeneration.from_pretrained(folder).eval()
        features = extractor(short, sampling_rate=RATE, return_tensors="pt").input_features
        with torch.no_grad():
            out = reference.generate(features, return_timestamps=False, max_new_tokens=30)
        eos = GENERATION["eos_token_id"]
        theirs = [[t for t in row.tolist() if t != eos] for row in out]  # the generated tokens (prompt left out)
        ours = [list(t.segments[0].tokens) for t in together if t.duration <= WINDOW_SECONDS]
        assert ours == theirs


def test_served_requests_are_answered_each_with_its_own_error(exported):
    from edgeattn.serving.tasks import answer, task_inputs, task_of

    _, export, _ = exported
    model = load(export)
    buffer = io.BytesIO()
    soundfile.write(buffer, audio(1.2, seed=44), RATE, format="WAV")
    assert task_of(model.config) == "transcribe" and task_inputs("transcribe")[0].name == "audio"
    found = answer(model, "transcribe", [{"audio": np.array([["clip.wav"]], object)},
                                         {"audio": np.array([[buffer.getvalue()]], object),
                                          "language": np.array([[b"fr"]], object)},
                                         {"audio": np.array([[b"not audio"]], object)}])  # fmt: skip
    assert isinstance(found[0], EdgeattnError) and "file's bytes" in str(found[0])
    assert found[1]["text"][0, 0].decode() == model.transcribe(buffer.getvalue(), language="fr").text.strip()
    assert isinstance(found[2], EdgeattnError)
    with pytest.raises(EdgeattnError, match="serves transcribe"):
        task_of(model.config, "generate")


@pytest.mark.slow
def test_a_speech_bundle_hears_in_node_and_wasm_as_the_python_runtime(exported, node_modules, tmp_path):  # noqa: F811
    """The node bundle (and the web one's files) of a speech export: edgeattn.mjs opens the family's
    own speech.mjs, whose log-mel features come within 1e-4 of the Python runtime's and whose
    segments, times and text (one window, and the long-form path) equal it on onnxruntime-node and
    onnxruntime-web's wasm; the mobile bundle's ORT files answer as the export and carry its settings."""
    from edgeattn.exporters.web import check_and_record, package_web

    _, export, _ = exported
    bundle = package_web(export, tmp_path / "node", "node")
    assert [f["graph"] for f in bundle.files] == ["audio_encoder", "cross_kv", "decoder_fixed"]
    described = json.loads((tmp_path / "node" / "bundle.json").read_text())
    assert described["task"] == "transcribe" and described["module"] == "speech.mjs"
    assert described["features"]["n_mels"] == 80 and described["mel_filters"]["shape"] == [80, 201]
    assert (tmp_path / "node" / "speech.mjs").is_file() and (tmp_path / "node" / "settings.json").is_file()
    checks = check_and_record(tmp_path / "node", export, node_modules)
    assert [c.runtime for c in checks] == ["onnxruntime-node", "onnxruntime-web"]
    for c in checks:
        assert c.passed and c.labels_equal and c.agreement == 1.0 and c.max_abs <= 1e-4, c
    recorded = json.loads((tmp_path / "node" / "bundle.json").read_text())["parity"]
    assert recorded["inputs"] == "the family's own" and len(recorded["checks"]) == 2
    web = package_web(export, tmp_path / "web", "web")  # the page takes an audio file for a speech bundle
    assert {f["graph"] for f in web.files} == {"audio_encoder", "cross_kv", "decoder_fixed"}
    assert (tmp_path / "web" / "speech.mjs").is_file() and (tmp_path / "web" / "index.html").is_file()
    from edgeattn.exporters.mobile import package_mobile

    phone = package_mobile(export, tmp_path / "mobile")  # ORT files proven against the export, and the settings
    assert {f.graph for f in phone.files} == {"audio_encoder", "cross_kv", "decoder", "decoder_fixed"}
    assert all(f.passed for f in phone.files)
    assert json.loads((tmp_path / "mobile" / "bundle.json").read_text())["settings"] == "settings.json"
    assert (tmp_path / "mobile" / "settings.json").read_bytes() == (export / "settings.json").read_bytes()


#: the speech module's search options under Node.js, each beside the Python runtime's (over the
#: bundle's own graphs): a prompt, conditioning on the text heard, beams, the temperature fallback
#: (a threshold never met: greedy; one always failed: the last temperature, sampled, seeded) and silence
SEARCH_RUN = """
import * as ort from "onnxruntime-node";
import {{ load }} from {module};
import {{ tokenCompressionRatio }} from {speech};
import {{ readFile }} from "node:fs/promises";
const model = await load({base}, ort, {{ precision: "fp32" }});
const read = async (path) => new Float32Array((await readFile(path)).buffer.slice(0));
const [short, long] = [await read({short}), await read({long})];
const heard = async (samples, options) => {{
  const out = [];
  for await (const s of model.segments(samples, options)) out.push(s);
  return out;
}};
const cases = {cases};
const out = {{ cases: [] }};
for (const [which, options] of cases) out.cases.push(await heard(which === "long" ? long : short, options));
out.again = await heard(long, cases[{sampled}][1]);
out.ratios = await Promise.all({token_lists}.map((t) => tokenCompressionRatio(t, model.bundle.model.vocab_size)));
try {{ await heard(short, {{ temperature: -1 }}); }} catch (e) {{ out.bad = e.message; }}
console.log(JSON.stringify(out));
"""


@pytest.mark.slow
def test_the_speech_module_searches_as_the_python_runtime(exported, node_modules, tmp_path):  # noqa: F811
    """The ES module's prompts, conditioning on the text heard, beam search, temperature fallback and
    no-speech skipping give the Python runtime's segments (sampling: seeded, at the temperature the
    fallback ends on), and its token compression ratio (zlib's deflate) is Python's."""
    import subprocess
    import tempfile

    from edgeattn.exporters.web import bundle_runtime, package_web
    from edgeattn.runtime.families.speech.decoding import token_compression_ratio

    _, export, _ = exported
    package_web(export, tmp_path / "node", "node")
    model = bundle_runtime(export, tmp_path / "node", "fp32")
    short, long = audio(1.7, seed=80), audio(5.3, seed=81)
    cases = [  # (clip, JavaScript options, Python options)
        ("short", {"language": "fr", "prompt": "w5 w17"}, {"language": "fr", "prompt": "w5 w17"}),
        ("long", {"language": "fr", "prompt": "w5 w17", "conditionOnPrevTokens": True,
                  "promptConditionType": "all-segments", "maxNewTokens": 4},
         {"language": "fr", "prompt": "w5 w17", "condition_on_prev_tokens": True,
          "prompt_condition_type": "all-segments", "max_new_tokens": 4}),
        ("long", {"language": "de", "numBeams": 3, "maxNewTokens": 5}, {"language": "de", "num_beams": 3,
                                                                         "max_new_tokens": 5}),
        ("short", {"numBeams": 2, "lengthPenalty": 0.5}, {"num_beams": 2, "length_penalty": 0.5}),
        ("long", {"temperature": [0, 0.6], "compressionRatioThreshold": 1000, "logprobThreshold": -1000},
         {"temperature": (0, 0.6), "compression_ratio_threshold": 1000, "logprob_threshold": -1000}),
        ("short", {"noSpeechThreshold": 0, "logprobThreshold": 0}, {"no_speech_threshold": 0, "logprob_threshold": 0}),
        ("long", {"language": "fr", "temperature": [0, 0.6], "compressionRatioThreshold": 0, "seed": 4}, None),
    ]  # fmt: skip
    sampled = len(cases) - 1
    token_lists = [[5, 7, 5, 7, 5, 7, 5, 7], list(range(40)), [1] * 60]
    with tempfile.TemporaryDirectory(dir=node_modules.parent) as work:  # where "onnxruntime-node" resolves
        paths = {}
        for name, clip in (("short", short), ("long", long)):
            paths[name] = Path(work) / f"{name}.f32"
            paths[name].write_bytes(clip.astype("<f4").tobytes())
        script = Path(work) / "run.mjs"
        script.write_text(SEARCH_RUN.format(
            module=json.dumps((tmp_path / "node" / "edgeattn.mjs").as_uri()),
            speech=json.dumps((tmp_path / "node" / "speech.mjs").as_uri()), base=json.dumps(str(tmp_path / "node")),
            short=json.dumps(str(paths["short"])), long=json.dumps(str(paths["long"])),
            cases=json.dumps([(clip, js) for clip, js, _ in cases]), sampled=sampled,
            token_lists=json.dumps(token_lists)))  # fmt: skip
        done = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=300, cwd=work)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for (clip, _, options), theirs in zip(cases, got["cases"], strict=True):
        if options is None:
            continue
        want = list(model.segments(long if clip == "long" else short, timestamps=True, **options))
        assert [(s["start"], s["end"], s["text"], s["tokens"], s["temperature"]) for s in theirs] == [
            (s.start, s.end, s.text, list(s.tokens), s.temperature) for s in want], (clip, options)  # fmt: skip
        assert all(abs(s["avgLogprob"] - w.avg_logprob) <= 1e-4 for s, w in zip(theirs, want, strict=True))
    assert got["cases"][-2] == [] and len(got["cases"][2]) >= 1  # all silence; beams heard something
    fell_back = got["cases"][sampled]
    assert fell_back and all(s["temperature"] == 0.6 for s in fell_back)  # every window failed at 0
    assert got["again"] == fell_back  # a seed repeats
    assert got["ratios"] == pytest.approx([token_compression_ratio(t, model.config.vocab_size) for t in token_lists])
    assert "temperature is a number or a list of them" in got["bad"]


def test_no_window_state_outlives_its_window(exported):
    """Each window's decoder state (its cross keys and values) is freed when the window is done,
    not when Python's cycle collector next runs: long audio's memory does not grow window by window."""
    import gc

    from edgeattn.runtime.cross_decoding import OnnxStepper

    model = load(exported[1])
    gc.collect()
    gc.disable()
    try:
        heard = model.transcribe(audio(3.5 * WINDOW_SECONDS, 5), max_new_tokens=3)  # long-form: window after window
        alive = [o for o in gc.get_objects() if isinstance(o, OnnxStepper)]
    finally:
        gc.enable()
    assert len({s.seek for s in heard.segments}) > 1 and alive == []


def test_a_graph_int4_keeps_at_8_bits_is_searched_as_int8_is():
    from edgeattn.runtime.families import get_family
    from edgeattn.runtime.precisions import get_precision

    speech, causal = get_family("speech"), get_family("causal")
    int4, int8 = get_precision("int4"), get_precision("int8")
    assert speech.role("audio_encoder").searches(int4) and speech.role("cross_kv").searches(int4)
    assert not speech.role("decoder").searches(int4) and speech.role("decoder").searches(int8)
    assert not any(role.searches(int4) for role in causal.roles)
