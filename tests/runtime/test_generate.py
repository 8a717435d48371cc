"""Search strategies checked on a toy step function where the answer can be enumerated."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.generate import (
    GenerationConfig,
    chosen_log_probs,
    filter_logits,
    generate,
    log_softmax,
    stream_positions,
    stream_tokens,
    top_indices,
)

pytestmark = pytest.mark.quick

V, BOS, EOS, PAD = 5, 0, 4, 0


class MarkovStepper:
    """Next-token logits depend on the previous token only (a table per batch row)."""

    def __init__(self, tables: np.ndarray, repeat: int) -> None:
        self.tables = np.repeat(tables, repeat, axis=0)  # (N, V, V)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        return self.tables[np.arange(len(tokens)), tokens]

    def reorder(self, index: np.ndarray) -> None:
        self.tables = self.tables[index]


def tables(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(scale=2.0, size=(batch, V, V)).astype(np.float32)


def brute_force(table: np.ndarray, max_len: int, lp: float) -> tuple[float, list[int]]:
    logp = log_softmax(table)
    best = (-np.inf, [])
    for n in range(1, max_len + 1):
        for seq in itertools.product(range(V), repeat=n):
            if EOS in seq[:-1] or (n < max_len and seq[-1] != EOS):
                continue
            prev, total = BOS, 0.0
            for tok in seq:
                total += logp[prev, tok]
                prev = tok
            score = total / n**lp
            if score > best[0]:
                best = (score, list(seq))
    return best


@pytest.mark.parametrize("lp", [0.0, 1.0, 2.0])
def test_wide_beam_finds_the_best_sequence(lp):
    t = tables(3)
    cfg = GenerationConfig(max_new_tokens=4, strategy="beam", num_beams=V**4, length_penalty=lp)
    out = generate(lambda n: MarkovStepper(t, n), 3, BOS, EOS, PAD, cfg)
    for b in range(3):
        score, seq = brute_force(t[b], 4, lp)
        assert out.scores[b] == pytest.approx(score, abs=1e-9)
        assert out.tokens[b, : len(seq)].tolist() == seq


class CountingStepper(MarkovStepper):
    """A Markov stepper that counts its steps."""

    calls = 0

    def step(self, tokens: np.ndarray) -> np.ndarray:
        CountingStepper.calls += 1
        return super().step(tokens)


@pytest.mark.parametrize("width, lp", [(1, 1.0), (2, 0.0), (2, 1.0), (3, 2.0)])
def test_streamed_beam_search_joins_to_the_searchs_answer(width, lp):
    """Position by position, the streamed tokens are beam search's (width 3 over 5 tokens also has
    beams that cannot be extended, scored -inf, which must not hold the stream back)."""
    cfg = GenerationConfig(max_new_tokens=7, strategy="beam", num_beams=width, length_penalty=lp)
    early = 0
    for seed in range(25):
        t = tables(4, seed=seed)
        whole = generate(lambda n, t=t: MarkovStepper(t, n), 4, BOS, EOS, PAD, cfg).tokens
        CountingStepper.calls = 0
        pieces = []
        for tokens in stream_positions(lambda n, t=t: CountingStepper(t, n), 4, BOS, EOS, PAD, cfg):
            early += CountingStepper.calls < cfg.max_new_tokens and (tokens != PAD).any()
            pieces.append(tokens)
        np.testing.assert_array_equal(np.stack(pieces, axis=1), whole)
    assert early > 0  # some tokens came out while the search still ran


def test_streamed_beam_search_yields_what_every_beam_agrees_on_at_once():
    t = np.full((1, V, V), -10.0, dtype=np.float32)
    t[0, :, 1], t[0, :, 2] = 10.0, 5.0  # "1", else "2"; EOS unlikely
    t[0, 2, 2], t[0, 2, 3] = -10.0, 9.0  # after a "2", "1" or "3": a branch costs more the older it is
    cfg = GenerationConfig(max_new_tokens=6, strategy="beam", num_beams=2)
    CountingStepper.calls = 0
    seen = []
    for tokens in stream_positions(lambda n: CountingStepper(t, n), 1, BOS, EOS, PAD, cfg):
        seen.append((int(tokens[0]), CountingStepper.calls))
    # the beams are [1, ..., 1] and [1, ..., 1, 2]: all but their last token is out a step later
    assert seen[:3] == [(1, 2), (1, 3), (1, 4)]
    assert [tok for tok, _ in seen] == generate(lambda n: MarkovStepper(t, n), 1, BOS, EOS, PAD, cfg).tokens[0].tolist()


def test_beam_of_width_one_is_greedy():
    t = tables(4, seed=1)
    greedy = generate(lambda n: MarkovStepper(t, n), 4, BOS, EOS, PAD, GenerationConfig(max_new_tokens=6))
    beam = generate(
        lambda n: MarkovStepper(t, n), 4, BOS, EOS, PAD,
        GenerationConfig(max_new_tokens=6, strategy="beam", num_beams=1, length_penalty=0.0),
    )  # fmt: skip
    for b in range(4):
        g = greedy.tokens[b].tolist()
        g = g[: g.index(EOS) + 1] if EOS in g else g
        assert beam.tokens[b, : len(g)].tolist() == g


def test_rows_stop_at_eos_and_pad_after():
    t = np.zeros((2, V, V), dtype=np.float32)
    t[0, :, EOS] = 10.0  # row 0 ends at once
    t[1, :, 2] = 10.0  # row 1 never ends
    out = generate(lambda n: MarkovStepper(t, n), 2, BOS, EOS, PAD, GenerationConfig(max_new_tokens=5))
    assert out.tokens.tolist() == [[EOS, PAD, PAD, PAD, PAD], [2, 2, 2, 2, 2]]


def test_sampling_is_reproducible_and_respects_top_k():
    t = tables(6, seed=2)
    cfg = GenerationConfig(max_new_tokens=8, strategy="sample", seed=7, top_k=2, temperature=1.5)
    a = generate(lambda n: MarkovStepper(t, n), 6, BOS, EOS, PAD, cfg).tokens
    b = generate(lambda n: MarkovStepper(t, n), 6, BOS, EOS, PAD, cfg).tokens
    np.testing.assert_array_equal(a, b)
    other = GenerationConfig(max_new_tokens=8, strategy="sample", seed=8, top_k=2, temperature=1.5)
    assert not np.array_equal(a, generate(lambda n: MarkovStepper(t, n), 6, BOS, EOS, PAD, other).tokens)
    prev = np.full(6, BOS)
    for step in range(a.shape[1]):
        for row in range(6):
            if step and a[row, step - 1] in (EOS, PAD) and (a[row, :step] == EOS).any():
                continue
            allowed = np.argsort(-t[row, prev[row]])[:2]
            assert a[row, step] in allowed
        prev = a[:, step]


def test_filters():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    assert np.isinf(filter_logits(logits, 1.0, 2, 1.0)[0, 2:]).all()
    kept = np.isfinite(filter_logits(logits, 1.0, 0, 0.7)[0])
    assert kept.tolist() == [True, True, False, False]  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7
    assert np.isfinite(filter_logits(logits, 1.0, 0, 0.1)[0]).sum() == 1


def test_invalid_settings_and_stepwise_beam_log_probs_are_refused():
    with pytest.raises(EdgeattnError, match="temperature"):
        GenerationConfig(temperature=0)
    with pytest.raises(EdgeattnError, match="top_p"):
        GenerationConfig(top_p=1.5)
    with pytest.raises(EdgeattnError, match="strategy"):
        GenerationConfig(strategy="nucleus")
    with pytest.raises(EdgeattnError, match="stream_positions streams it"):
        next(stream_tokens(lambda n: MarkovStepper(tables(1), n), 1, BOS, EOS, PAD, GenerationConfig(strategy="beam")))


def test_the_shortcuts_agree_with_the_plain_computations():
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((6, 3000)) * 8).astype(np.float32)
    plain = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    plain = plain - np.log(np.exp(plain).sum(-1, keepdims=True))
    np.testing.assert_allclose(log_softmax(logits), plain, atol=1e-5)
    tokens = rng.integers(0, 3000, 6)
    np.testing.assert_allclose(chosen_log_probs(logits, tokens), plain[np.arange(6), tokens], atol=1e-5)
    scores = np.round(rng.standard_normal((4, 500)), 1)  # many equal scores
    scores[0, :] = -np.inf
    scores[0, 7] = 0.0
    for k in (1, 5, 40, 500, 600):
        want = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(top_indices(scores, k), want)


class _Chars:
    """A tokenizer whose tokens are characters' code points."""

    def decode(self, ids):
        return "".join(map(chr, ids))


def test_an_answer_shows_its_text_piece_by_piece_and_holds_back_a_stop_strings_start():
    from edgeattn.runtime.text_generation import AnswerText

    answer = AnswerText(_Chars(), ["END", "\n\n"])
    assert [answer.add(ord(c)) for c in "abEN"] == ["a", "b", "", ""]  # "EN" could begin "END"
    assert answer.add(ord("D")) == "" and answer.stopped and answer.text == "ab" and answer.finish() == ""
    assert answer.tokens == [ord(c) for c in "abEND"]
    held = AnswerText(_Chars(), ["END"])
    pieces = [held.add(ord(c)) for c in "xE"]
    assert pieces == ["x", ""] and not held.stopped
    assert held.finish() == "E" and held.text == "xE"  # the answer ended without the stop string
    whole = AnswerText(_Chars(), ["END"])
    assert whole.add(ord("E"), whole=True) == "E"  # the last token: nothing is held back
