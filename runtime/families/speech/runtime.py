"""The speech family's runtime: audio in, its transcript (or English translation) out, as segments
with times, over the exported encoder, cross_kv and decoder graphs.

Audio no longer than a window is one window; longer audio is decoded window after window, each
starting where the last one's final complete segment ended (transformers' sequential long-form
algorithm). Torch-free: numpy, onnxruntime, and ``soundfile`` / ``soxr`` to read files.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.cross_decoding import (
    CROSS_INPUT,
    CROSS_KV,
    DECODER,
    DECODER_FIXED,
    ENCODER_OUTPUT,
    SOURCE_MASK,
    OnnxStepper,
    SlotStepper,
    empty_cache,
)
from edgeattn.runtime.exported_model import ExportedModel, InputError
from edgeattn.runtime.families.speech.alignment import Word, group_words, text_token_probabilities, token_times
from edgeattn.runtime.families.speech.decoding import SearchOptions, WhisperDecoding, WhisperRules, greedy, search
from edgeattn.runtime.families.speech.log_mel import LogMel
from edgeattn.runtime.families.speech.specs import ALIGNMENT, AUDIO_ENCODER, FEATURES
from edgeattn.runtime.generate import GenerationConfig, beam_search
from edgeattn.runtime.jsonfile import read_json_object
from edgeattn.runtime.manifest import check_file
from edgeattn.runtime.slot_cache import LOGITS

#: seconds a timestamp token counts (``<|0.02|>`` follows ``<|0.00|>``)
TIME_PRECISION = 0.02
#: feature frames an audio position spans (the encoder's second convolution's stride)
INPUT_STRIDE = 2


@dataclass(frozen=True)
class Segment:
    """A stretch of the transcript: from ``start`` to ``end`` seconds, its text and tokens."""

    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    #: the feature frame its window starts at
    seek: int = 0
    #: its window's mean log-probability a token (the end token counted; beams: the best beam's
    #: length-normalised score) and its text's gzip compression ratio (Whisper's signs of a
    #: failed window: low, and high from repetition)
    avg_logprob: float | None = None
    compression_ratio: float | None = None
    #: the temperature its window was decoded at (above the first: the fallback), and the
    #: probability of no speech after the start token (measured with a no-speech threshold)
    temperature: float = 0.0
    no_speech_prob: float | None = None
    #: its words with their times, and when each of its tokens starts (asked for with ``word_timestamps``)
    words: tuple[Word, ...] | None = None
    token_times: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Window:
    """One window's search: its generated tokens (no prompt, no end token), their language (None
    for an English-only model), mean log-probability, the temperature kept, the no-speech
    probability, whether it was found silent (skipped), and, when asked, each token's time from
    the window's start with the time of the token after the last (one more than the tokens)."""

    tokens: list[int]
    language: str | None
    logprob: float
    temperature: float = 0.0
    no_speech: float | None = None
    silent: bool = False
    times: np.ndarray | None = None
    #: each token's probability among the text tokens (with ``times``; NaN for a timestamp)
    probs: np.ndarray | None = None


#: how a prompt conditions long-form audio (transformers' ``prompt_condition_type``)
CONDITION_TYPES = ("first-segment", "all-segments")


@dataclass(frozen=True)
class Context:
    """What windows are decoded after: the prompt's tokens (``<|startofprev|>`` first; empty for
    none), whether each window follows the text heard before it, and where the prompt goes."""

    ids: list[int] = field(default_factory=list)
    condition: bool = False
    kind: str = "first-segment"


@dataclass(frozen=True)
class Transcript:
    """What :meth:`WhisperRuntime.transcribe` hears: the text, its segments, the language (given
    or detected; None for an English-only model) and the audio's length in seconds."""

    text: str
    segments: list[Segment]
    language: str | None
    duration: float

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "language": self.language, "duration": self.duration,
                "segments": [{**asdict(s), "tokens": list(s.tokens)} for s in self.segments]}  # fmt: skip


def split_segments(tokens: list[int], timestamp_begin: int, offset: float, frames: int,
                   frame_seconds: float) -> tuple[list[tuple[float, float, list[int]]], int]:  # fmt: skip
    """A window's generated tokens (no prompt, no end token) as segments ``(start, end, tokens)``
    in seconds from ``offset``, and the feature frames to move on by: to the end of the window's
    ``frames`` when the tokens end on a single timestamp (or hold no pair), else to the last
    complete segment's end. As transformers' ``_retrieve_segment``."""
    stamps = [t >= timestamp_begin for t in tokens]
    single_ending = stamps[-2:] == [False, True]
    pairs = [i + 1 for i in range(len(tokens) - 1) if stamps[i] and stamps[i + 1]]
    if not pairs:
        times = [t for t in tokens if t >= timestamp_begin]
        last = frames * frame_seconds / TIME_PRECISION
        if times and times[-1] != timestamp_begin:
            last = times[-1] - timestamp_begin
        return [(offset, offset + last * TIME_PRECISION, list(tokens))], frames
    slices = list(pairs)
    if single_ending:
        slices.append(len(tokens))
    else:
        slices[-1] += 1
    segments, previous = [], 0
    for i, cut in enumerate(slices):
        piece = tokens[previous:cut]
        end_at = -1 if i < len(slices) - 1 or single_ending else -2
        segments.append((offset + (piece[0] - timestamp_begin) * TIME_PRECISION,
                         offset + (piece[end_at] - timestamp_begin) * TIME_PRECISION, piece))  # fmt: skip
        previous = cut
    if single_ending:
        return segments, frames
    return segments, (tokens[previous - 2] - timestamp_begin) * INPUT_STRIDE


class Heard:
    """One audio heard window after window: its features, where the next window starts (``seek``,
    in feature frames), the language (given, or detected from the first window), the segments
    heard so far and whether the next window is decoded after their text. A clip no longer than a
    window is one window padded to full length."""

    def __init__(self, model: WhisperRuntime, samples: np.ndarray, language: str | None, timestamps: bool,
                 words: bool, context: Context) -> None:  # fmt: skip
        mel = model.log_mel
        self.model, self.words, self.context, self.language = model, words, context, language
        long_form = samples.size > mel.window_samples
        self.features = mel(samples, pad_to_window=not long_form)  # (n_mels, frames)
        # word times: the first word has a row (the first timestamp's)
        self.stamped = timestamps or long_form or words
        self.duration = samples.size / mel.rate
        self.total = self.features.shape[1] if long_form else mel.window_frames
        #: the frames holding audio (transformers' mask)
        self.heard = self.total if long_form else -(-samples.size // mel.hop)
        #: the language the first window was heard in (detected, or None on an English-only model)
        self.first_language: str | None = None
        self.windows = 0
        #: each segment's tokens heard so far (a first-segment prompt counts as one)
        self.said: list[list[int]] = [context.ids[1:]] if context.ids and context.kind == "first-segment" else []
        #: whether the next window is decoded after them (not after one sampled at 0.5 or above)
        self.conditioned = context.condition
        self.seek = 0
        self.segments: list[Segment] = []

    @property
    def done(self) -> bool:
        return self.seek >= self.total

    def window(self) -> tuple[np.ndarray, int | None, list[int]]:
        """The next window's features (n_mels, window frames; zeros after the audio), the audio
        positions it holds (for word times) and the tokens its start sequence follows."""
        window = self.model.log_mel.window_frames
        frames = min(window, self.total - self.seek)
        piece = np.zeros((self.features.shape[0], window), dtype=np.float32)
        piece[:, :frames] = self.features[:, self.seek : self.seek + frames]
        positions = (self.heard - self.seek) // INPUT_STRIDE if self.words else None
        return piece, positions, self.model._prefix(self.context, self.said, self.conditioned)

    def take(self, found: Window) -> list[Segment]:
        """The segments of the window just searched; moves on past them."""
        frames = min(self.model.log_mel.window_frames, self.total - self.seek)
        self.conditioned = self.context.condition and found.temperature < 0.5
        if not self.windows:
            self.first_language = found.language
        self.windows += 1
        self.language = self.language or found.language  # detected once, from the first window (as transformers)
        if found.silent:  # no speech: on to the next window
            self.seek += frames
            segments = []
        else:
            segments, advance = self.model._window_segments(found, self.seek, frames, self.stamped, self.duration,
                                                            self.language)  # fmt: skip
            self.said.extend(list(segment.tokens) for segment in segments)
            self.segments.extend(segments)
            self.seek += max(advance, 1)
        if self.done:
            self.features = self.features[:, :0]  # heard: its features are not kept
        return segments

    def transcript(self) -> Transcript:
        eos = self.model.decoding.eos
        text = self.model._text([t for s in self.segments for t in s.tokens if t < eos])
        return Transcript(text, self.segments, self.first_language, self.duration)


class WhisperRuntime(ExportedModel):
    """A speech export (Whisper): :meth:`transcribe` audio files or samples."""

    # --------------------------------------------------------------- settings
    @cached_property
    def settings(self) -> dict[str, Any]:
        """The export's features and decoding settings (``settings.json``)."""
        entry = None if self.manifest is None else self.manifest.settings
        if entry is None or self.export_dir is None:
            raise EdgeattnError("this speech model has no settings.json (its features and decoding settings); "
                                "re-export it with edgeattn export --from-hf")  # fmt: skip
        return read_json_object(check_file(self.export_dir, entry), EdgeattnError)

    @cached_property
    def log_mel(self) -> LogMel:
        return LogMel.from_dict(self.settings.get("features") or {}, "settings.json's features")

    @cached_property
    def decoding(self) -> WhisperDecoding:
        return WhisperDecoding.from_dict(self.settings.get("decoding") or {}, "settings.json's decoding")

    # --------------------------------------------------------------- decoding
    def source_state(self, features: np.ndarray, mask: np.ndarray | None = None) -> tuple[dict[str, np.ndarray],
                                                                                           np.ndarray]:  # fmt: skip
        """Windows' features (B, n_mels, frames) as every decoder layer's cross-attention keys and
        values, and the mask of the audio positions (all attended to)."""
        hidden = self.run(AUDIO_ENCODER, {FEATURES: features})[ENCODER_OUTPUT]
        positions = np.ones(hidden.shape[:2], dtype=np.int64)
        return self.run(CROSS_KV, {CROSS_INPUT: hidden}), positions

    def stepper(self, features: np.ndarray, capacity: int, repeat: int = 1) -> OnnxStepper:
        """A decoding state over windows' features, each row ``repeat`` times (beams): the encoder
        and cross projections run here, once; a cache of ``capacity`` slots written in place where
        the export has that decoder."""
        return self._stepper(self.source_state(features), repeat, capacity)

    def _stepper(self, source: tuple[dict[str, np.ndarray], np.ndarray], repeat: int, capacity: int) -> OnnxStepper:
        if DECODER_FIXED in self.sessions:
            return SlotStepper(self, None, None, repeat, capacity, source=source)  # type: ignore[arg-type]
        return OnnxStepper(self, None, None, repeat, source=source)  # type: ignore[arg-type]

    def decode(self, features: Any, prompts: list[list[int]], max_new_tokens: int, rules: Any = None,
               eos: int | None = None) -> list[list[int]]:  # fmt: skip
        """Greedy tokens for windows' features (B, n_mels, frames) after ``prompts`` (one length),
        prompt included, each row ending at ``eos`` (kept) or after ``max_new_tokens``; ``rules``
        edit each step's scores (:class:`~edgeattn.runtime.families.speech.decoding.WhisperRules`)."""
        features = self._features(features)
        if len(prompts) != features.shape[0]:
            raise InputError(f"{len(prompts)} prompts for {features.shape[0]} windows")
        self._check_length(len(prompts[0]), max_new_tokens)
        state = self.stepper(features, len(prompts[0]) + max_new_tokens)
        return greedy(state.step, prompts, rules, max_new_tokens, eos)

    def _features(self, features: Any) -> np.ndarray:
        speech = self.config.section
        assert speech is not None
        array = np.asarray(features, dtype=np.float32)
        if array.ndim != 3 or array.shape[1] != speech.n_mels or not 0 < array.shape[2] <= speech.frames:
            raise InputError(f"features are (windows, {speech.n_mels}, up to {speech.frames} frames), "
                             f"not {array.shape}")  # fmt: skip
        return np.ascontiguousarray(array)

    def _check_length(self, prompt: int, new: int) -> None:
        if new < 1 or prompt + new > self.config.max_len:
            raise InputError(f"a window holds at most {self.config.max_len} tokens: a prompt of {prompt} leaves "
                             f"{self.config.max_len - prompt} new ones, not {new}")  # fmt: skip

    # ------------------------------------------------------------------ audio
    def samples(self, audio: Any, rate: int | None = None) -> np.ndarray:
        """Mono float32 samples at the model's rate from a file path, its bytes, or samples
        (at ``rate``, default the model's)."""
        from edgeattn.runtime.families.speech.audio import as_mono, read_audio

        to = self.log_mel.rate
        if isinstance(audio, str | Path | bytes):
            if rate is not None:
                raise InputError("a file says its own sampling rate; give rate only with samples")
            return read_audio(audio, to)
        return as_mono(np.asarray(audio), rate or to, to, "the samples")

    def segments(self, audio: Any, *, language: str | None = None, task: str = "transcribe",
                 timestamps: bool = True, max_new_tokens: int | None = None, rate: int | None = None,
                 word_timestamps: bool = False, prompt: str | None = None, condition_on_prev_tokens: bool = False,
                 prompt_condition_type: str = "first-segment", **search: Any) -> Iterator[Segment]:  # fmt: skip
        """The transcript's segments as each window is decoded (see :meth:`transcribe`)."""
        options = search_options(search)
        self._check_words(word_timestamps)
        context = self._context(prompt, condition_on_prev_tokens, prompt_condition_type)
        heard = Heard(self, self.samples(audio, rate), language, timestamps, word_timestamps, context)
        for _, segments in self._hear([heard], task, max_new_tokens, options):
            yield from segments

    def transcribe(self, audio: Any, *, language: str | None = None, task: str = "transcribe",
                   timestamps: bool = False, max_new_tokens: int | None = None, rate: int | None = None,
                   word_timestamps: bool = False, prompt: str | None = None, condition_on_prev_tokens: bool = False,
                   prompt_condition_type: str = "first-segment", **search: Any) -> Transcript:  # fmt: skip
        """The transcript of ``audio`` (a path, a file's bytes, or mono samples at ``rate``) by
        the export's decoding settings, in ``language`` (a code; detected from the first window
        when None on a multilingual model), ``task`` ``transcribe`` or ``translate`` (into
        English). One window (``timestamps``: segments split by the model's timestamp tokens;
        else one segment), or longer audio window after window (timestamps always decoded, each
        window starting where the last one's final complete segment ends). Greedy unless
        ``search`` says otherwise: ``num_beams``, ``length_penalty``, ``temperature`` (one, or
        several for the fallback), ``compression_ratio_threshold``, ``logprob_threshold``,
        ``no_speech_threshold``, ``top_k``, ``seed``, as
        :class:`~edgeattn.runtime.families.speech.decoding.SearchOptions` and transformers take them.
        ``word_timestamps``: each segment's words with their times, from the alignment heads
        (:mod:`~edgeattn.runtime.families.speech.alignment`), where the export has them; it decodes
        timestamp tokens too (segments split by them), so that the first word has a row of its own.
        ``prompt``: text the windows are decoded after (earlier words, names, spelling; as
        transformers' ``prompt_ids``: every window's, or with ``condition_on_prev_tokens`` the first
        one's, the others decoded after the text heard so far; ``prompt_condition_type``
        ``"all-segments"``: the prompt before that text in every window)."""
        options = search_options(search)
        self._check_words(word_timestamps)
        context = self._context(prompt, condition_on_prev_tokens, prompt_condition_type)
        heard = Heard(self, self.samples(audio, rate), language, timestamps, word_timestamps, context)
        for _ in self._hear([heard], task, max_new_tokens, options):
            pass
        return heard.transcript()

    def transcribe_batch(self, audios: Sequence[Any], *, language: str | None = None, task: str = "transcribe",
                         timestamps: bool = False, max_new_tokens: int | None = None, rate: int | None = None,
                         word_timestamps: bool = False, prompt: str | None = None,
                         condition_on_prev_tokens: bool = False, prompt_condition_type: str = "first-segment",
                         batch_size: int = 8, **search: Any) -> list[Transcript]:  # fmt: skip
        """:meth:`transcribe` of several audios (paths, bytes or samples), ``batch_size`` heard at a
        time and window by window: each round decodes the next window of every audio in hand
        together (their features, encoder, cross keys/values and decoder steps batched; rows whose
        language or earlier text differ in separate batches; the rows the fallback retries retried
        together), a finished audio's place taken by the next. Each audio seeks on its own windows'
        timestamps, so greedy transcripts are those of one audio at a time."""
        if batch_size < 1:
            raise InputError(f"batch_size is at least 1, not {batch_size}")
        options = search_options(search)
        self._check_words(word_timestamps)
        context = self._context(prompt, condition_on_prev_tokens, prompt_condition_type)
        samples = [self.samples(a, rate) for a in audios]  # every file read (and refused) before any is heard
        made: list[Heard] = []

        def admitted() -> Iterator[Heard]:  # features computed as each audio joins the batch
            for x in samples:
                made.append(Heard(self, x, language, timestamps, word_timestamps, context))
                yield made[-1]

        for _ in self._hear(admitted(), task, max_new_tokens, options, batch_size):
            pass
        return [heard.transcript() for heard in made]

    def _hear(self, audios: Iterable[Heard], task: str, max_new_tokens: int | None, options: SearchOptions,
              batch_size: int = 1) -> Iterator[tuple[Heard, list[Segment]]]:  # fmt: skip
        """Hear ``audios`` to the end, ``batch_size`` at a time in rounds of one window each (those
        that share a language, start sequence and timestamp mode searched together); yields each
        window's audio and segments as they are found."""
        rng = np.random.default_rng(options.seed)
        waiting, hearing = iter(audios), []
        while True:
            hearing += itertools.islice(waiting, batch_size - len(hearing))
            if not hearing:
                return
            batches: dict[tuple[Any, ...], list[tuple[Heard, np.ndarray, int | None]]] = {}
            for heard in hearing:
                piece, positions, prefix = heard.window()
                key = (heard.language, tuple(prefix), heard.stamped, heard.words)
                batches.setdefault(key, []).append((heard, piece, positions))
            for (language, prefix, stamped, words), rows in batches.items():
                features = np.stack([piece for _, piece, _ in rows])
                positions = [int(p) for _, _, p in rows] if words else None  # type: ignore[arg-type]
                found = self._search_windows(features, language, task, stamped, max_new_tokens, options, rng,
                                             positions, list(prefix))  # fmt: skip
                for (heard, _, _), window in zip(rows, found, strict=True):
                    yield heard, heard.take(window)
            hearing = [heard for heard in hearing if not heard.done]

    def _text(self, tokens: list[int]) -> str:
        if self.tokenizer is None:
            raise EdgeattnError("this speech export has no tokenizer.json to turn its tokens into text")
        return str(self.tokenizer.decode(tokens))

    @property
    def has_word_timestamps(self) -> bool:
        """Whether the export's decoder returns the alignment heads' weights (its folder listed
        them)."""
        return ALIGNMENT in self.specs[DECODER].output_names

    def _check_words(self, asked: bool) -> None:
        if asked and not self.has_word_timestamps:
            raise InputError("this export's decoder does not return alignment heads' weights, which word timestamps "
                             "are found by: its folder's generation_config.json lists no alignment_heads, or it was "
                             "exported before edgeattn returned them (export it again)")  # fmt: skip

    def _context(self, prompt: str | None, condition: bool, kind: str) -> Context:
        """The prompt's tokens (after ``<|startofprev|>``) and how windows are conditioned, checked."""
        if kind not in CONDITION_TYPES:
            raise InputError(f"prompt_condition_type is one of {', '.join(CONDITION_TYPES)}, not {kind!r}")
        if kind == "all-segments" and not condition:
            raise InputError("prompt_condition_type 'all-segments' conditions each window on the text heard so far: "
                             "set condition_on_prev_tokens too")  # fmt: skip
        if (condition or (prompt is not None and prompt.strip())) and self.decoding.prev_sot is None:
            raise InputError("this model's generation config names no <|startofprev|> token to start a prompt or "
                             "the text heard with")  # fmt: skip
        ids: list[int] = []
        if prompt is not None and prompt.strip():
            if self.tokenizer is None:
                raise EdgeattnError("this speech export has no tokenizer.json to read a prompt with")
            assert self.decoding.prev_sot is not None
            ids = list(self.tokenizer.encode(" " + prompt.strip(), special_tokens=False))
            if any(t >= self.decoding.eos for t in ids):
                raise InputError("a prompt is plain text: it holds no special tokens (<|...|>)")
            ids = [self.decoding.prev_sot, *ids[-self._context_tokens :]]
        return Context(ids, condition, kind)

    @property
    def _context_tokens(self) -> int:
        """The most earlier tokens a window is decoded after (half its sequence, as transformers)."""
        return self.config.max_len // 2 - 1

    def _prefix(self, context: Context, heard: list[list[int]], conditioned: bool) -> list[int]:
        """What a window's start sequence follows: the prompt, or (conditioned) ``<|startofprev|>``
        (the prompt, for all-segments) and the last tokens of the segments heard so far, each
        closing pair of timestamps counted once (transformers' ``_prepare_decoder_input_ids``)."""
        if conditioned and heard:
            begin = self.decoding.timestamp_begin or self.config.vocab_size
            prev_sot = self.decoding.prev_sot
            assert prev_sot is not None, "_context refuses conditioning without <|startofprev|>"
            before = context.ids if context.ids and context.kind == "all-segments" else [prev_sot]
            tokens = [t for part in heard for t in (part[:-1] if len(part) > 2 and part[-2] >= begin else part)]
            return [*before, *tokens[-self._context_tokens :]]
        return list(context.ids)

    def _window_segments(self, found: Window, seek: int, frames: int, stamped: bool, duration: float,
                         language: str | None) -> tuple[list[Segment], int]:  # fmt: skip
        """A decoded window's segments (split at its timestamps where ``stamped``, else the audio's
        length) with their words where it has its tokens' times, and the frames to move on by."""
        decoding, mel = self.decoding, self.log_mel
        frame_seconds = mel.hop / mel.rate
        tokens = found.tokens
        text_bytes = self._text([t for t in tokens if t < decoding.eos]).encode()
        ratio = len(text_bytes) / len(zlib.compress(text_bytes)) if text_bytes else 0.0
        offset = seek * frame_seconds
        if stamped:
            assert decoding.timestamp_begin is not None
            pieces, advance = split_segments(tokens, decoding.timestamp_begin, offset, frames, frame_seconds)
        else:  # one window: the audio's length
            pieces, advance = [(offset, duration, tokens)], frames
        segments, at = [], 0  # at: the segment's first token in the window's
        for start, end, part in pieces:
            text = self._text([t for t in part if t < decoding.eos])
            said = stamps = None
            if found.times is not None:
                times = found.times[at : at + len(part) + 1]
                probs = None if found.probs is None else found.probs[at : at + len(part)]
                said = tuple(group_words(part, times, self.tokenizer, decoding.eos, language, offset, probs))
                stamps = tuple(round(offset + float(t), 3) for t in times[:-1])
            at += len(part)
            segments.append(Segment(round(float(start), 3), round(float(end), 3), text, tuple(part), seek,
                                    round(found.logprob, 6), round(ratio, 6), found.temperature, found.no_speech,
                                    said, stamps))  # fmt: skip
        return segments, advance

    def _search_windows(self, features: np.ndarray, language: str | None, task: str, timestamps: bool,
                        new: int | None, options: SearchOptions, rng: np.random.Generator,
                        positions: list[int] | None = None, prefix: list[int] | None = None,
                        ) -> list[Window]:  # fmt: skip
        """Windows (B, n_mels, frames) searched together as ``options`` say: each row tries each
        temperature in turn until its tokens pass the thresholds (or the last), the rows still
        failing decoded together at the next; the language detected per row where none is given;
        with ``positions`` (each row's audio positions holding audio), its tokens' times too; the
        start sequences after ``prefix`` (a prompt, earlier text)."""
        decoding = self.decoding
        detect = decoding.multilingual and language is None
        prefix = prefix or []
        base = prefix + decoding.prompt(0 if detect else language, task, timestamps)
        limit = min(self.config.max_len, decoding.max_length) - len(base)
        new = limit if new is None else new
        self._check_length(len(base), new)
        source = self.source_state(self._features(features))
        rows = source[1].shape[0]
        prompts = [list(base) for _ in range(rows)]
        no_speech: list[float | None] = [None] * rows
        silence = options.no_speech_threshold is not None
        if detect or (silence and not prefix):  # the scores after the start token alone
            first = self._stepper(source, 1, 1).step(np.full((rows, 1), decoding.start))
            if detect:  # from the start token alone, as transformers
                for prompt, found in zip(prompts, decoding.detect_language(first), strict=True):
                    prompt[len(prefix) + 1] = int(found)
        if silence:  # after the start token where the window has it
            if prefix:
                first = self._stepper(source, 1, len(prefix) + 1).step(np.array([[*prefix, decoding.start]] * rows))
            no_speech = [float(p) for p in _softmax(first)[:, decoding.no_speech]]
        rules = WhisperRules(decoding, len(base), timestamps)
        temperatures = options.temperatures
        chosen: list[tuple[list[int], float, float]] = [([], 0.0, 0.0)] * rows
        pending = list(range(rows))
        for attempt, temperature in enumerate(temperatures):
            part = _rows(source, pending)
            asked = [prompts[i] for i in pending]
            if temperature == 0 and options.num_beams > 1:
                found = self._beams(part, asked, rules, new, options)
            else:
                sums: list[float] = []
                state = self._stepper(part, 1, len(base) + new)
                out = search(state.step, asked, rules, new, logprobs=sums, temperature=temperature,
                             top_k=options.top_k, rng=rng)  # fmt: skip
                found = [(row[len(base) :], total / max(1, len(row) - len(base)))
                         for row, total in zip(out, sums, strict=True)]  # fmt: skip
            failing = []
            for i, (sequence, logprob) in zip(pending, found, strict=True):
                chosen[i] = (sequence, logprob, float(temperature))
                if attempt < len(temperatures) - 1 and options.failed(sequence, logprob, self.config.vocab_size):
                    failing.append(i)
            pending = failing
            if not pending:
                break
        names = {v: k.strip("<|>") for k, v in decoding.languages.items()}
        windows = []
        for i, (sequence, logprob, temperature) in enumerate(chosen):
            silent = options.silent(logprob, no_speech[i])
            times = probs = None
            if positions is not None and not silent:
                times, probs = self._token_times(_rows(source, [i]), prompts[i], sequence, positions[i])
            if sequence and sequence[-1] == decoding.eos:
                sequence = sequence[:-1]  # its start is the last token's end
            elif times is not None:  # no end token: the last token ends where it starts (no row says more)
                times = np.concatenate([times, times[-1:]])
            spoken = names.get(prompts[i][len(prefix) + 1]) if decoding.multilingual else None
            windows.append(Window(sequence, spoken, logprob, temperature, no_speech[i], silent, times, probs))
        return windows

    def _token_times(self, source: tuple[dict[str, np.ndarray], np.ndarray], prompt: list[int],
                     generated: list[int], positions: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """When each generated token starts in the window (seconds), and its probability among the
        text tokens: the prompt and every generated token but the last fed to the decoder at once,
        the alignment heads' weights over the generated tokens' rows aligned
        (:func:`~edgeattn.runtime.families.speech.alignment.token_times`), the logits of the rows that
        generated them read."""
        speech = self.config.section
        assert speech is not None
        cross, mask = source
        fed = np.array([prompt + generated[:-1]], dtype=np.int64)
        feeds = {"input_ids": fed, SOURCE_MASK: mask, **cross, **empty_cache(self.config, 1)}
        out = self.run(DECODER, feeds)
        weights = out[ALIGNMENT][0, :, len(prompt) :]  # (heads, generated - 1, positions)
        probs = text_token_probabilities(out[LOGITS][0, len(prompt) - 1 :], generated, self.decoding.eos)
        return token_times(weights, positions, speech.median_filter_width), probs

    def _beams(self, source: tuple[dict[str, np.ndarray], np.ndarray], prompts: list[list[int]],
               rules: WhisperRules, new: int, options: SearchOptions) -> list[tuple[list[int], float]]:  # fmt: skip
        """Each window's best beam (its end token kept) and its length-normalised log-probability."""
        cfg = GenerationConfig(max_new_tokens=new, strategy="beam", num_beams=options.num_beams,
                               length_penalty=options.length_penalty)  # fmt: skip
        width = len(prompts[0])
        out = beam_search(lambda n: self._stepper(source, n, width + new), len(prompts), self.decoding.start,
                          self.decoding.eos, -1, cfg, prompts=np.array(prompts), processor=rules)  # fmt: skip
        return [([t for t in row.tolist() if t >= 0], float(score)) for row, score in zip(out.tokens, out.scores,
                                                                                        strict=True)]  # fmt: skip


def search_options(given: dict[str, Any]) -> SearchOptions:
    """:class:`SearchOptions` from keyword arguments, an unknown one named."""
    known = set(SearchOptions.__dataclass_fields__)
    unknown = sorted(set(given) - known)
    if unknown:
        raise InputError(
            f"transcribe() has no option {', '.join(unknown)} (its search options: {', '.join(sorted(known))})"
        )
    return SearchOptions(**given)


def _rows(source: tuple[dict[str, np.ndarray], np.ndarray], rows: list[int]) -> tuple[dict[str, np.ndarray],
                                                                                     np.ndarray]:  # fmt: skip
    """The decoding source (cross keys/values, audio positions) of some of its rows."""
    cross, mask = source
    if len(rows) == mask.shape[0]:
        return source
    return {k: v[rows] for k, v in cross.items()}, mask[rows]


def _softmax(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores - scores.max(-1, keepdims=True), dtype=np.float64)
    return shifted / shifted.sum(-1, keepdims=True)
