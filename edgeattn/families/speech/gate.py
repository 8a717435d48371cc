"""The speech family's side of the accuracy gate and of calibration: eager float32 Whisper's
answers on held-out windows of log-mel features (the user's audio, or seeded random features),
and each graph measured against them.

The audio encoder and cross keys/values are judged by cosine; the decoders by teacher-forced
top-1 agreement over eager float32's own greedy tokens; whole decoding by how many of float32's
tokens a candidate keeps (one minus the token edit distance over float32's tokens: the word error
rate's analogue on tokens, which needs no tokenizer) and how many of float32's transcript's words
(one minus the word error rate against it, through the export's tokenizer) and, reported, exact
match.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np
import torch

from edgeattn.exporters.gate import HeldOut, Reference, cosine_metrics
from edgeattn.families.seq2seq.gate import TeacherForced
from edgeattn.families.speech.model import WhisperModel
from edgeattn.runtime.families.speech.specs import FEATURES
from edgeattn.runtime.families.speech.wer import edit_distance, words
from edgeattn.runtime.specs import GraphSpec, cache_names

#: windows of random features the gate measures when no held-out audio is given
RANDOM_WINDOWS = 6
#: the tokens each window is decoded for (a 30 s window of speech is some 80-120 tokens)
SPEECH_TOKENS = 64


def random_features(model: WhisperModel, windows: int, seed: int) -> np.ndarray:
    """Seeded features in the range real log-mel features take ([-1, 1.5]: Whisper's scaling)."""
    speech = model.config.section
    assert speech is not None
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(-0.2, 0.5, (windows, speech.n_mels, speech.frames)), -1.0, 1.5).astype(np.float32)


class SpeechReference(Reference):
    """Eager float32 Whisper on the held-out windows (``heldout.features``, else seeded random
    features), each answer computed once."""

    def __init__(self, model: WhisperModel, heldout: HeldOut, new_tokens: int = 16, progress: bool = False
                 ) -> None:  # fmt: skip
        super().__init__(model, heldout, new_tokens, progress)
        if heldout.features is None:
            windows = min(len(heldout.ids), RANDOM_WINDOWS)
            self.heldout = HeldOut(heldout.ids[:windows], heldout.mask[:windows],
                                   f"seeded random log-mel features ({windows} windows)", True,
                                   random_features(model, windows, 99))  # fmt: skip
        assert self.heldout.features is not None
        self.features = self.heldout.features
        speech = model.config.section
        assert speech is not None
        rows = self.features.shape[0]
        self.valid = np.ones((rows, speech.audio_positions), dtype=bool)
        random = heldout.features is None
        self.prompts = [[model.config.bos_id]] * rows if random else self.heldout.ids.tolist()
        self.new_tokens = min(max(new_tokens, SPEECH_TOKENS), model.config.max_len - len(self.prompts[0]))

    @cached_property
    def hidden(self) -> torch.Tensor:
        with torch.no_grad():
            return self.model.encode(torch.from_numpy(self.features))

    @cached_property
    def cross(self) -> dict[str, np.ndarray]:
        with torch.no_grad():
            kv = self.model.cross_kv(self.hidden)
        names = cache_names("cross", self.model.config.n_decoder_layers)
        return {n: t.numpy() for n, t in zip(names, (t for pair in kv for t in pair), strict=True)}

    @cached_property
    def greedy(self) -> np.ndarray:
        """Eager float32's greedy tokens after the start token (B, new_tokens), every step taken."""
        rows = self.model.greedy(torch.from_numpy(self.features), self.prompts, self.new_tokens)
        return np.array([r[len(self.prompts[0]) :] for r in rows], dtype=np.int64)

    def generated(self, runtime: Any, steps: int) -> np.ndarray:
        key = id(runtime)
        kept = self._generated.get(key)
        if kept is None or kept[0] is not runtime or kept[1].shape[1] < steps:
            rows = runtime.decode(self.features, self.prompts, steps, eos=-1)
            kept = (runtime, np.array([r[len(self.prompts[0]) :] for r in rows], dtype=np.int64))
            self._generated = {key: kept}
        return kept[1][:, :steps]

    @cached_property
    def forced(self) -> TeacherForced:
        """Eager float32's greedy tokens fed back to the decoder (after the start token)."""
        c = self.model.config
        targets = np.concatenate([np.array(self.prompts, np.int64), self.greedy[:, :-1]], axis=1)
        with torch.no_grad():
            logits, _ = self.model.decode(torch.from_numpy(targets), cross_kv=self._cross_pairs())
        rows = targets.shape[0]
        past = {n: np.zeros((rows, c.n_heads, 0, c.head_dim), np.float32) for n in cache_names("past",
                                                                                              c.n_decoder_layers)}
        feeds = {"input_ids": targets, "encoder_attention_mask": self.valid.astype(np.int64), **past, **self.cross}
        return TeacherForced(feeds, self.cross, logits.numpy())

    def _cross_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        values = [torch.from_numpy(v) for v in self.cross.values()]
        return [(values[i], values[i + 1]) for i in range(0, len(values), 2)]


def _until(row: np.ndarray, eos: int) -> list[int]:
    ends = np.flatnonzero(row == eos)
    return row[: ends[0]].tolist() if ends.size else row.tolist()


def generation_metrics(ref: SpeechReference, runtime: Any) -> dict[str, float]:
    """The share of float32's greedy tokens each window keeps (up to the end token), exact match,
    and, where the export has its tokenizer, the share of float32's transcript's words kept (one
    minus the candidate's word error rate against float32's transcript)."""
    eos = ref.model.config.eos_id
    eager, got = ref.greedy, ref.generated(runtime, ref.new_tokens)
    kept, same, pairs = [], [], []
    for want, have in zip(eager, got, strict=True):
        a, b = _until(want, eos), _until(have, eos)
        kept.append(1.0 - min(1.0, edit_distance([str(t) for t in a], [str(t) for t in b]) / max(1, len(a))))
        same.append(a == b)
        pairs.append((a, b))
    metrics = {"tokens_kept": float(np.mean(kept)), "exact_match": float(np.mean(same))}
    kept_words = _words_kept(runtime, pairs, eos)
    if kept_words is not None:
        metrics["words_kept"] = kept_words
    return metrics


def _words_kept(runtime: Any, pairs: list[tuple[list[int], list[int]]], eos: int) -> float | None:
    """1 - the word error rate of the candidate's transcripts against float32's (their text tokens
    decoded by the export's tokenizer); None without a tokenizer or words to measure."""
    tokenizer = getattr(runtime, "tokenizer", None)
    if tokenizer is None:
        return None

    def text(tokens: list[int]) -> list[str]:
        return words(str(tokenizer.decode([t for t in tokens if t < eos])))

    errors = total = 0
    for want, have in pairs:
        reference = text(want)
        errors += edit_distance(reference, text(have))
        total += len(reference)
    return None if total == 0 else 1.0 - min(1.0, errors / total)


def encoder_metrics(ref: SpeechReference, runtime: Any, graph: str) -> dict[str, float]:
    """The encoder states' cosine to eager float32's."""
    out = runtime.run(graph, {FEATURES: ref.features})["last_hidden_state"]
    return cosine_metrics(out, ref.hidden.numpy())


# ------------------------------------------------------------------------------- calibration
def encoder_calibration(model: WhisperModel, spec: GraphSpec, ids: np.ndarray, mask: np.ndarray,
                        rng: np.random.Generator, new_tokens: int) -> dict[str, np.ndarray]:  # fmt: skip
    """Windows of random features, one a row."""
    return {FEATURES: random_features(model, ids.shape[0], int(rng.integers(1 << 30)))}


def cross_kv_calibration(model: WhisperModel, spec: GraphSpec, ids: np.ndarray, mask: np.ndarray,
                         rng: np.random.Generator, new_tokens: int) -> dict[str, np.ndarray]:  # fmt: skip
    """Eager encoder states of random windows."""
    features = encoder_calibration(model, spec, ids, mask, rng, new_tokens)[FEATURES]
    with torch.no_grad():
        return {"encoder_hidden_states": model.encode(torch.from_numpy(features)).numpy()}


def decoder_calibration(model: WhisperModel, spec: GraphSpec, ids: np.ndarray, mask: np.ndarray,
                        rng: np.random.Generator, new_tokens: int) -> dict[str, np.ndarray]:  # fmt: skip
    """The decoder under teacher forcing of eager greedy tokens on random windows."""
    from edgeattn.families.seq2seq.gate import slot_feeds
    from edgeattn.runtime.specs import POSITION

    features = encoder_calibration(model, spec, ids, mask, rng, new_tokens)[FEATURES]
    held = HeldOut(ids, mask, features=features)
    feeds = SpeechReference(model, held, new_tokens).forced.feeds
    return slot_feeds(feeds, model.config) if POSITION in spec.input_names else feeds


