"""Property-based tests: whatever a caller passes, the runtime answers with a result of the right
shape and finite values, or with one of its documented exceptions (EdgeattnError and its
subclasses InputError, TokenizerError): never another exception, a NaN or a hang."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.quick

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from edgeattn.errors import EdgeattnError  # noqa: E402
from edgeattn.exporters.export import export_model  # noqa: E402
from edgeattn.runtime import load  # noqa: E402
from edgeattn.sources import resolve_model  # noqa: E402

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo export (encoder-decoder with a word tokenizer), loaded once."""
    out = tmp_path_factory.mktemp("prop") / "demo"
    source = resolve_model()
    export_model(source.model, out, verify=False, tokenizer=source.tokenizer, task=source.task)
    return load(out, threads=1)


DTYPES = st.sampled_from([np.int64, np.int32, np.int8, np.uint8, np.float32, np.float64, np.bool_, np.complex64])
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=70)
ARRAYS = st.one_of(
    hnp.arrays(DTYPES, SHAPES),  # any dtype and rank, values over the dtype's whole range
    hnp.arrays(np.int64, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=70),
               elements=st.integers(-2, 40)),  # near-valid ids: around the demo's vocabulary and max_len
    st.lists(st.lists(st.integers(-(2**70), 2**70), max_size=5), max_size=4),  # ragged, over int64
    st.just("not an array"),
    st.none(),
)  # fmt: skip


@SETTINGS
@given(ids=ARRAYS, mask=st.one_of(st.none(), ARRAYS))
def test_encode_answers_or_refuses(demo, ids, mask):
    try:
        out = demo.encode(ids, mask)
    except EdgeattnError:
        return
    arr = np.asarray(ids)
    assert out.shape == (*arr.shape, demo.config.d_model) and np.isfinite(out).all()


@SETTINGS
@given(
    lengths=st.lists(st.integers(1, 20), min_size=1, max_size=4),
    vocab=st.integers(-3, 40),
    max_new_tokens=st.one_of(st.integers(-2, 40), st.just(10**9), st.floats(allow_nan=True), st.text(max_size=2)),
    strategy=st.sampled_from(["greedy", "beam", "sample", "bogus"]),
    num_beams=st.one_of(st.integers(-1, 6), st.just(10**6)),
    temperature=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-1, 3)),
)
def test_generate_answers_or_refuses(demo, lengths, vocab, max_new_tokens, strategy, num_beams, temperature):
    rng = np.random.default_rng(len(lengths))
    width = max(lengths)
    ids = rng.integers(0, max(vocab, 1), size=(len(lengths), width)) + min(vocab, 0)
    mask = (np.arange(width)[None] < np.array(lengths)[:, None]).astype(np.int64)
    options = {"num_beams": num_beams} if strategy == "beam" else {}
    if strategy == "sample":
        options.update(temperature=temperature, seed=0)
    try:
        out = demo.generate(ids, mask, max_new_tokens=max_new_tokens, strategy=strategy, **options)
    except EdgeattnError:
        return
    assert out.tokens.shape[0] == len(lengths) and out.tokens.shape[1] <= max_new_tokens
    assert ((out.tokens >= 0) & (out.tokens < demo.config.vocab_size)).all()


@SETTINGS
@given(texts=st.lists(st.text(max_size=40), min_size=1, max_size=3), raw=st.binary(max_size=30))
def test_generate_text_answers_or_refuses(demo, texts, raw):
    for batch in (texts, [raw.decode("utf-8", "surrogateescape")], ["5 2 9 1" * 40]):
        try:
            answers = demo.generate_text(batch, max_new_tokens=8)
        except EdgeattnError:
            continue
        assert len(answers) == len(batch) and all(isinstance(a, str) for a in answers)


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    """A token classifier with a Hugging Face tokenizer (transformers builds it)."""
    transformers = pytest.importorskip("transformers")
    from tests.helpers.encoder_folders import BERT_SPECIALS, make_checkpoint, make_tokenizer

    folder = tmp_path_factory.mktemp("prop-hf")
    make_tokenizer(*BERT_SPECIALS).save_pretrained(folder / "hf")
    make_checkpoint("Bert", "ForTokenClassification").save_pretrained(folder / "hf")
    source = resolve_model(from_hf=folder / "hf")
    export_model(source.model, folder / "out", graphs=["encoder"], verify=False, tokenizer=source.tokenizer,
                 task=source.task, labels=source.labels)  # fmt: skip
    assert transformers
    return load(folder / "out", threads=1)


@SETTINGS
@given(
    texts=st.one_of(
        st.text(max_size=300),
        st.lists(st.text(max_size=80), max_size=4),
        st.binary(max_size=20),
        st.integers(),
        st.none(),
    ),  # fmt: skip
    truncate=st.booleans(),
)
def test_the_text_api_answers_or_refuses(tagger, texts, truncate):
    for call in (tagger.tag, tagger.embed):
        try:
            out = call(texts, truncate=truncate)
        except EdgeattnError:
            continue
        rows = 1 if isinstance(texts, str) else len(texts)
        assert len(out) == rows
        if call == tagger.embed:
            assert np.isfinite(out).all() and out.shape == (rows, tagger.config.d_model)
