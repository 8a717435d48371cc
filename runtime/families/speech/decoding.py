"""Whisper's decoding rules, torch-free, as transformers' ``WhisperForConditionalGeneration.generate``
applies them to a 30 s window: the prompt (start, language, task, no-timestamps), language
detection from the first step, suppressed tokens (always, and at the first step), and the
timestamp rules (a first token that is a timestamp no later than ``max_initial_timestamp_index``,
timestamps in pairs and never decreasing, a timestamp forced when their probabilities together
outweigh every text token).

The settings come from the folder's ``generation_config.json``; the rules act on one step's
scores (B, vocab) given each row's tokens so far, so any decoder (PyTorch, ONNX Runtime) can be
driven by :func:`search` (greedy or sampled) or the shared beam search. How a window is searched
(beams, the temperatures of the fallback and its thresholds) is a :class:`SearchOptions`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.jsonfile import read_json_object

GENERATION_CONFIG = "generation_config.json"
TASKS = ("transcribe", "translate")


class WhisperSettingsError(EdgeattnError):
    """A generation config Whisper cannot decode by, or a language or task it does not have."""


def _prev_sot(named: Any, suppressed: Any) -> int | None:
    if isinstance(named, int):
        return named
    if isinstance(suppressed, list) and len(suppressed) >= 2 and isinstance(suppressed[-2], int):
        return suppressed[-2]
    return None


def _ids(value: Any, where: str, name: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        raise WhisperSettingsError(f"{where}: {name} is a list of token ids")
    return tuple(value)


@dataclass(frozen=True)
class WhisperDecoding:
    """What ``generation_config.json`` says of decoding a Whisper model."""

    start: int
    eos: int
    #: ``<|notimestamps|>``; the timestamps follow it (0.00, 0.02, ... 30.00 s)
    no_timestamps: int | None = None
    suppress: tuple[int, ...] = ()
    #: suppressed at the first generated position only (a space, the end token)
    begin_suppress: tuple[int, ...] = ()
    #: language token (``<|fr|>``) -> id; empty for English-only models
    languages: dict[str, int] = field(default_factory=dict)
    tasks: dict[str, int] = field(default_factory=dict)
    multilingual: bool = False
    max_initial_timestamp_index: int | None = None
    #: the most tokens a window's sequence holds, prompt included
    max_length: int = 448
    #: (layer, head) pairs of cross-attention that align text with audio, for word timestamps
    alignment_heads: tuple[tuple[int, int], ...] = ()
    #: ``<|startofprev|>``: what a prompt (earlier text that conditions a window) starts with
    #: (transformers' fallback where the config names none: the second last suppressed token)
    prev_sot: int | None = None

    @classmethod
    def from_folder(cls, folder: str | Path) -> WhisperDecoding:
        path = Path(folder) / GENERATION_CONFIG
        return cls.from_dict(read_json_object(path, WhisperSettingsError), str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "the generation config") -> WhisperDecoding:
        def need(name: str) -> int:
            value = data.get(name)
            if not isinstance(value, int):
                raise WhisperSettingsError(f"{where} lacks {name} (a token id)")
            return value

        eos = data.get("eos_token_id")
        eos = eos[0] if isinstance(eos, list) and eos else eos
        languages, tasks = data.get("lang_to_id") or {}, data.get("task_to_id") or {}
        if not isinstance(languages, dict) or not isinstance(tasks, dict):
            raise WhisperSettingsError(f"{where}: lang_to_id and task_to_id map names to token ids")
        heads = data.get("alignment_heads") or []
        if not isinstance(heads, list) or not all(isinstance(h, list) and len(h) == 2 for h in heads):
            raise WhisperSettingsError(f"{where}: alignment_heads is a list of [layer, head] pairs")
        initial = data.get("max_initial_timestamp_index")
        return cls(
            start=need("decoder_start_token_id"), eos=int(eos) if isinstance(eos, int) else need("eos_token_id"),
            no_timestamps=data.get("no_timestamps_token_id"),
            suppress=_ids(data.get("suppress_tokens"), where, "suppress_tokens"),
            begin_suppress=_ids(data.get("begin_suppress_tokens"), where, "begin_suppress_tokens"),
            languages={str(k): int(v) for k, v in languages.items()}, tasks={str(k): int(v) for k, v in tasks.items()},
            multilingual=bool(data.get("is_multilingual", bool(languages))),
            max_initial_timestamp_index=None if initial is None else int(initial),
            max_length=int(data.get("max_length") or 448), alignment_heads=tuple((int(a), int(b)) for a, b in heads),
            prev_sot=_prev_sot(data.get("prev_sot_token_id"), data.get("suppress_tokens")),
        )  # fmt: skip

    @property
    def no_speech(self) -> int:
        """The token whose probability after the start token says the window holds no speech."""
        if self.no_timestamps is None:
            raise WhisperSettingsError("this model's generation config has no no-timestamps token, so no "
                                       "no-speech token: it cannot take a no-speech threshold")  # fmt: skip
        return self.no_timestamps - 1

    @property
    def timestamp_begin(self) -> int | None:
        return None if self.no_timestamps is None else self.no_timestamps + 1

    def language_id(self, language: str) -> int:
        """The token of ``language``: a code (``fr``), a token (``<|fr|>``)."""
        token = language if language.startswith("<|") else f"<|{language.lower()}|>"
        if token not in self.languages:
            known = ", ".join(sorted(t.strip("<|>") for t in self.languages)) or "none: it is English-only"
            raise WhisperSettingsError(f"this model has no language {language!r} (its languages: {known})")
        return self.languages[token]

    def prompt(self, language: str | int | None, task: str = "transcribe", timestamps: bool = False) -> list[int]:
        """A window's first tokens: start, the language (a code, or a detected token id) and the
        task (multilingual models), and no-timestamps unless ``timestamps``."""
        tokens = [self.start]
        if self.multilingual:
            if task not in TASKS or task not in self.tasks:
                raise WhisperSettingsError(f"the task is one of {', '.join(t for t in TASKS if t in self.tasks)}, "
                                           f"not {task!r}")  # fmt: skip
            if language is None:
                raise WhisperSettingsError("a multilingual model's prompt needs its language (given, or detected)")
            tokens += [language if isinstance(language, int) else self.language_id(language), self.tasks[task]]
        elif language not in (None, "en") or task != "transcribe":
            raise WhisperSettingsError("this model is English-only: it transcribes English, nothing else")
        if timestamps and self.no_timestamps is None:
            raise WhisperSettingsError("this model's generation config has no timestamp tokens")
        if not timestamps and self.no_timestamps is not None:
            tokens.append(self.no_timestamps)
        return tokens

    def detect_language(self, first_scores: np.ndarray) -> np.ndarray:
        """Each row's language token from the scores after the start token alone (B, vocab)."""
        ids = np.array(sorted(self.languages.values()))
        if not ids.size:
            raise WhisperSettingsError("this model is English-only: it has no languages to detect")
        return ids[np.asarray(first_scores)[:, ids].argmax(-1)]


@dataclass
class WhisperRules:
    """The rules on each step's scores for rows whose prompts are ``begin`` tokens long."""

    decoding: WhisperDecoding
    begin: int
    timestamps: bool = False

    def __call__(self, tokens: Sequence[Sequence[int]], scores: np.ndarray) -> np.ndarray:
        """``scores`` (B, vocab) with what the rules forbid at -inf, for rows whose whole
        sequences (prompt included) are ``tokens``."""
        d = self.decoding
        scores = np.array(scores, dtype=np.result_type(scores, np.float32))
        if len(tokens[0]) == self.begin and d.begin_suppress:
            scores[:, list(d.begin_suppress)] = -np.inf
        if d.suppress:
            scores[:, list(d.suppress)] = -np.inf
        if not self.timestamps:
            return scores
        begin, eos = d.timestamp_begin, d.eos
        assert begin is not None and d.no_timestamps is not None
        scores[:, d.no_timestamps] = -np.inf
        for row, seq in enumerate(tokens):
            sampled = list(seq[self.begin :])
            last = len(sampled) >= 1 and sampled[-1] >= begin
            penultimate = len(sampled) < 2 or sampled[-2] >= begin
            if last:
                if penultimate:  # a pair closed: text next
                    scores[row, begin:] = -np.inf
                else:  # a pair opened: its closing timestamp (or the end) next
                    scores[row, :eos] = -np.inf
            stamps = [t for t in sampled if t >= begin]
            if stamps:  # never back in time, and no second <|0.00|>
                until = stamps[-1] if last and not penultimate else stamps[-1] + 1
                scores[row, begin:until] = -np.inf
        if len(tokens[0]) == self.begin:  # the first token is a timestamp, not too late
            scores[:, :begin] = -np.inf
            if d.max_initial_timestamp_index is not None:
                scores[:, begin + d.max_initial_timestamp_index + 1 :] = -np.inf
        logp = _log_softmax(scores)
        with np.errstate(divide="ignore"):
            stamp_mass = np.logaddexp.reduce(logp[:, begin:], axis=-1)
        text_best = logp[:, :begin].max(-1)
        scores[stamp_mass > text_best, :begin] = -np.inf
        return scores


def _log_softmax(scores: np.ndarray) -> np.ndarray:
    top = scores.max(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        shifted = scores - top
        return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@dataclass(frozen=True)
class SearchOptions:
    """How each window is searched, as transformers' Whisper ``generate`` takes it: greedy, or
    ``num_beams`` beams (length penalty ``length_penalty``); ``temperature`` one value (0: greedy
    or beams; above: sampled from the ``top_k`` likeliest tokens) or several, tried in turn while
    a window's tokens compress more than ``compression_ratio_threshold`` (zlib over the tokens'
    bytes, as transformers; about 1.35 marks repetition) or average a log-probability under
    ``logprob_threshold``; a window whose no-speech probability is over ``no_speech_threshold``
    and whose log-probability is under ``logprob_threshold`` is silence, and skipped. ``seed``
    makes sampling repeatable."""

    num_beams: int = 1
    length_penalty: float = 1.0
    temperature: float | tuple[float, ...] = 0.0
    compression_ratio_threshold: float | None = None
    logprob_threshold: float | None = None
    no_speech_threshold: float | None = None
    top_k: int = 50
    seed: int | None = None

    def __post_init__(self) -> None:
        from edgeattn.runtime.exported_model import MAX_BEAMS

        temps = self.temperatures
        if not temps or not all(isinstance(t, int | float) and not isinstance(t, bool) and np.isfinite(t) and t >= 0
                                for t in temps):  # fmt: skip
            raise WhisperSettingsError(f"temperature is a number or a list of them, 0 or more, "
                                       f"not {self.temperature!r}")  # fmt: skip
        beams = self.num_beams
        if isinstance(beams, bool) or not isinstance(beams, int) or not 1 <= beams <= MAX_BEAMS:
            raise WhisperSettingsError(f"num_beams is a whole number from 1 to {MAX_BEAMS}, not {self.num_beams!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise WhisperSettingsError(f"top_k is 0 (every token) or more, not {self.top_k!r}")
        for name in ("length_penalty", "compression_ratio_threshold", "logprob_threshold", "no_speech_threshold"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not np.isfinite(value)):  # fmt: skip
                raise WhisperSettingsError(f"{name} is a number, not {value!r}")
        if self.no_speech_threshold is not None and self.logprob_threshold is None:
            raise WhisperSettingsError("no_speech_threshold needs logprob_threshold: a window is silence when its "
                                       "no-speech probability is high and its log-probability low")  # fmt: skip

    @property
    def temperatures(self) -> tuple[float, ...]:
        t = self.temperature
        return tuple(t) if isinstance(t, list | tuple) else (t,)

    def failed(self, tokens: Sequence[int], logprob: float, vocab: int) -> bool:
        """Whether a window's tokens (its end token included) call for the next temperature."""
        if self.compression_ratio_threshold is not None:
            if token_compression_ratio(tokens, vocab) > self.compression_ratio_threshold:
                return True
        return self.logprob_threshold is not None and logprob < self.logprob_threshold

    def silent(self, logprob: float, no_speech: float | None) -> bool:
        """Whether a window is silence, to be skipped."""
        return (self.no_speech_threshold is not None and no_speech is not None and self.logprob_threshold is not None
                and logprob < self.logprob_threshold and no_speech > self.no_speech_threshold)  # fmt: skip


def token_compression_ratio(tokens: Sequence[int], vocab: int) -> float:
    """How much zlib shrinks the tokens written as little-endian integers of the vocabulary's
    width (transformers' measure of a repeating window)."""
    import zlib

    width = int(np.log2(vocab) / 8) + 1
    data = b"".join(int(t).to_bytes(width, "little") for t in tokens)
    return len(data) / len(zlib.compress(data)) if data else 0.0


@dataclass
class _RowsStep:
    """``step`` as the decoding core's state over ``rows`` rows, never reordered. A module-level
    class: one defined inside :func:`search` sat in a reference cycle (as every class object does)
    holding the step and through it the window's decoder state, its cross keys and values
    included, until Python's cycle collector ran: 22 MB more each window of long audio (the real
    tiny.en, 5 minutes: 586 MB peak instead of 421)."""

    step_rows: Callable[[np.ndarray], np.ndarray]
    rows: int

    def step(self, tokens: np.ndarray) -> np.ndarray:
        return self.step_rows(tokens.reshape(self.rows, -1))  # (B, T): the prompts, then one token a row

    def reorder(self, index: np.ndarray) -> None:
        raise AssertionError("greedy decoding and sampling never reorder rows")


def search(step: Callable[[np.ndarray], np.ndarray], prompts: list[list[int]],
           rules: Callable[[Sequence[Sequence[int]], np.ndarray], np.ndarray] | None, max_new_tokens: int,
           eos: int | None = None, logprobs: list[float] | None = None, temperature: float = 0.0, top_k: int = 0,
           rng: np.random.Generator | None = None) -> list[list[int]]:  # fmt: skip
    """Greedy decoding (``temperature`` 0) or sampling of rows with prompts of equal length, by the
    decoding core every family shares (:func:`edgeattn.runtime.generate.stream_tokens`):
    ``step(tokens (B, T))`` feeds the tokens new since its last call and returns the last
    position's scores (B, vocab), which ``rules`` (a :class:`WhisperRules`, or None) edit; a
    sampled token is drawn at ``temperature`` from the ``top_k`` likeliest (0: all) by ``rng``.
    Each row ends at ``eos`` (kept; default the rules' end token, None or -1: no end) or after
    ``max_new_tokens``; rows that ended are fed the end token and ignored. ``logprobs`` (a list)
    receives each row's summed log-probability of its tokens under the edited scores (at
    temperature 1, the end token's included), as transformers measures a window."""
    from edgeattn.runtime.generate import GenerationConfig, log_softmax, stream_tokens

    if len({len(p) for p in prompts}) != 1:
        raise WhisperSettingsError("rows decoded together need prompts of one length")
    if eos is None and isinstance(rules, WhisperRules):
        eos = rules.decoding.eos
    end = -1 if eos is None else eos
    sampled = temperature > 0
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, strategy="sample" if sampled else "greedy",
                           temperature=temperature if sampled else 1.0, top_k=top_k if sampled else 0)  # fmt: skip
    measured: list[np.ndarray] = []  # the step's scores the chosen token's log-probability is read from

    def edit(seen: np.ndarray, logits: np.ndarray) -> np.ndarray:
        scores = logits if rules is None else rules(seen, logits)
        if sampled:
            measured[:] = [_top_k(scores, top_k)]
        return scores

    sequences = [list(p) for p in prompts]
    done = np.zeros(len(prompts), dtype=bool)
    sums = np.zeros(len(prompts))
    for chosen, logp in stream_tokens(lambda n: _RowsStep(step, len(prompts)), len(prompts), -1, end, max(end, 0), cfg,
                                      prompts=np.array(prompts, dtype=np.int64), processor=edit,
                                      rng=np.random.default_rng() if rng is None else rng):  # fmt: skip
        if logprobs is not None:  # greedy: the core's own log-probability is the measure (temperature 1)
            picked = log_softmax(measured[0])[np.arange(len(chosen)), chosen] if sampled else logp
            sums += np.where(done, 0.0, picked)
        for row, token in enumerate(chosen.tolist()):
            if not done[row]:
                sequences[row].append(token)
        done |= chosen == end
    if logprobs is not None:
        logprobs.extend(sums.tolist())
    return sequences


def greedy(step: Callable[[np.ndarray], np.ndarray], prompts: list[list[int]],
           rules: Callable[[Sequence[Sequence[int]], np.ndarray], np.ndarray] | None, max_new_tokens: int,
           eos: int | None = None, logprobs: list[float] | None = None) -> list[list[int]]:  # fmt: skip
    """:func:`search` at temperature 0: every step's likeliest token."""
    return search(step, prompts, rules, max_new_tokens, eos, logprobs)


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Scores below each row's ``k``-th largest at -inf (transformers' top-k warper)."""
    if not k or k >= scores.shape[-1]:
        return scores
    kth = np.partition(scores, -k, axis=-1)[:, -k][:, None]
    return np.where(scores < kth, -np.inf, scores)
