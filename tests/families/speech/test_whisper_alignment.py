"""Word timestamps' parts against transformers' own: dynamic time warping (its path, ties
included), the median filter, and words grouped from tokens with punctuation joined as its
tokenizer joins it."""

from __future__ import annotations

import numpy as np
import pytest

from edgeattn.runtime.families.speech.alignment import dynamic_time_warping, group_words, median_filter, token_times

torch = pytest.importorskip("torch")
whisper_generation = pytest.importorskip("transformers.models.whisper.generation_whisper")


@pytest.mark.parametrize("shape,ties", [((1, 1), False), ((5, 40), False), ((17, 9), False), ((30, 300), False),
                                        ((8, 30), True), ((12, 12), True)])  # fmt: skip
def test_the_path_is_transformers(shape, ties):
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    matrix = rng.integers(-2, 3, shape).astype(np.float64) if ties else rng.standard_normal(shape)
    ours = dynamic_time_warping(matrix)
    theirs = whisper_generation._dynamic_time_warping(matrix)
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))


@pytest.mark.parametrize("width,length", [(7, 50), (7, 4), (7, 3), (3, 9), (1, 5)])
def test_the_median_filter_is_transformers(width, length):
    x = np.random.default_rng(length).standard_normal((2, 3, 5, length)).astype(np.float32)
    theirs = whisper_generation._median_filter(torch.from_numpy(x), width).numpy()
    np.testing.assert_array_equal(median_filter(x, width), theirs)


def test_token_times_start_the_window_and_rise():
    rows, positions = 6, 60
    weights = np.zeros((2, rows, 100), np.float32)
    for r in range(rows):  # row r looks at positions 10 r .. 10 r + 9: token r + 1 is heard there
        weights[:, r, 10 * r : 10 * r + 10] = 1.0
    times = token_times(weights + 1e-3, positions, 7)
    assert times.shape == (rows + 1,) and times[0] == 0.0
    np.testing.assert_allclose(times[1:], [0.2 * r for r in range(rows)], atol=0.061)
    assert np.all(np.diff(times) >= 0) and token_times(weights[:, :0], positions, 7).tolist() == [0.0]


class Pieces:
    """A tokenizer whose token i decodes to PIECES[i]; 8 and 9 are the two bytes of "é"."""

    PIECES = [" Hello", ",", " wor", "ld", " (", "quoted", ")", "!", "", ""]

    def decode(self, ids):
        text = "".join(self.PIECES[i] for i in ids if i < 8)
        if 8 in ids and 9 in ids:
            return text + " é"
        return text + ("\ufffd" if 8 in ids or 9 in ids else "")


def test_words_join_pieces_and_punctuation_as_transformers_tokenizer():
    eos = 100
    tokens = [150, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 151]  # timestamps 150 and 151 around the text
    times = np.arange(len(tokens) + 1, dtype=np.float64) / 10
    words = group_words(tokens, times, Pieces(), eos, offset=2.0)
    assert [w.word for w in words] == [" Hello,", " world", " (quoted)!", " é"]
    assert [(w.start, w.end) for w in words] == [(2.1, 2.3), (2.3, 2.5), (2.5, 2.9), (2.9, 3.1)]
    unspaced = group_words(tokens, times, Pieces(), eos, language="ja")
    assert [w.word for w in unspaced][:3] == [" Hello,", " wor", "ld"]  # characters, punctuation still joined
    assert unspaced[-1].word == " é" and (unspaced[-1].start, unspaced[-1].end) == (0.9, 1.1)
