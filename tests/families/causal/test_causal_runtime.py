"""Decoder-only exports against transformers: every architecture's exported graph equals its eager
logits on left- and right-padded prompts of lengths never traced, through the prompt and steps at
several cache lengths; greedy and beam tokens equal transformers.generate; sampling with a seed is
reproducible and equals eager PyTorch's; text, stop strings, streaming, chat and conversations."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.helpers import causal_folders

transformers = pytest.importorskip("transformers")
from edgeattn.errors import EdgeattnError  # noqa: E402
from edgeattn.exporters.export import export_model  # noqa: E402
from edgeattn.exporters.reference import eager_generate  # noqa: E402
from edgeattn.hf import import_folder  # noqa: E402
from edgeattn.runtime import load  # noqa: E402
from edgeattn.runtime.families.causal.runtime import CausalRuntime, CausalState  # noqa: E402
from edgeattn.runtime.text_generation import until_stop  # noqa: E402

ATOL = 1e-4
pytestmark = pytest.mark.quick


_EXPORTS: dict = {}


#: architectures whose export the quick tier leaves to the full suite (Gemma 3's covers their windows)
_FULL_SUITE_ONLY = ("gemma2-softcap", "mistral-window", "smollm3-nope")


@pytest.fixture(scope="module", params=[pytest.param((m, p), marks=[pytest.mark.slow] if m in _FULL_SUITE_ONLY else [])
                                        for m in causal_folders.MODELS for p in ("fp32", "fp32-opt")],
                ids=lambda param: "-".join(param))  # fmt: skip
def exported(request, tmp_path_factory):
    """(transformers model, edgeattn's eager model, the export loaded at one precision) of one
    architecture: fp32 is the graph in standard operators, fp32-opt its GroupQueryAttention form."""
    name, precision = request.param
    if name not in _EXPORTS:
        root = tmp_path_factory.mktemp("causal-export")
        folder, reference = causal_folders.save_folder(name, root / name)
        hf = import_folder(folder)
        result = export_model(hf.model, root / "out", precisions=["fp32-opt"], **_fields(hf))
        assert result.report is not None and result.report.passed  # verified: unseen sizes, in-place cache, greedy
        assert result.manifest.graphs["causal_decoder"].precisions["fp32-opt"].attention_fused == hf.model.lm.n_layers
        _EXPORTS[name] = reference, hf.model, root / "out"
    reference, eager, out = _EXPORTS[name]
    return reference, eager, load(out, precision=precision)


def _fields(hf):
    return {"tokenizer": hf.tokenizer, "chat_template": hf.chat_template, "stop_ids": hf.stop_ids,
            "task": hf.task, "architecture": hf.architecture}  # fmt: skip


def _prompts(side: str, lengths=(13, 8, 1), vocab: int = 97, seed: int = 3):
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids = np.zeros((len(lengths), width), np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        cols = slice(width - n, width) if side == "left" else slice(0, n)
        ids[i, cols] = rng.integers(5, vocab, n)
        mask[i, cols] = 1
    return ids, mask


def _alone(ids, mask, row):
    return torch.from_numpy(ids[row : row + 1, mask[row].astype(bool)])


@pytest.mark.parametrize("side", ["left", "right"])
def test_prompt_and_steps_equal_transformers_logits(exported, side):
    """The prompt in one call, then 9 steps (the cache growing once on the way), against transformers'
    logits for each row alone over its prompt and the tokens fed."""
    reference, _, model = exported
    ids, mask = _prompts(side)
    steps = np.random.default_rng(4).integers(5, 97, size=(3, 9))
    state = model.state(ids, mask, capacity=ids.shape[1] + 4)  # too small: grows at the fifth step
    got = [state.step(np.zeros(3, np.int64))]
    for k in range(9):
        got.append(state.step(steps[:, k]))
    assert state.capacity > ids.shape[1] + 4
    for row in range(3):
        full = torch.cat([_alone(ids, mask, row), torch.from_numpy(steps[row : row + 1])], dim=1)
        with torch.no_grad():
            want = reference(input_ids=full).logits[0, -10:].numpy()
        mine = np.stack([g[row] for g in got])
        assert np.abs(mine - want).max() <= ATOL, (row, side)


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_prompt_in_chunks_answers_as_whole(exported, side, monkeypatch):
    """A prompt longer than ``prefill_chunk`` tokens over its rows runs in chunks (a row's last
    real token in any of them): the same next-token logits and greedy tokens as in one call."""
    _, _, model = exported
    ids, mask = _prompts(side, lengths=(13, 8, 1))
    whole = model.state(ids, mask, capacity=ids.shape[1] + 6)
    want = [whole.step(np.zeros(3, np.int64))] + [whole.step(np.full(3, 7 + k)) for k in range(5)]
    runs: list[int] = []
    feed = CausalState._feed
    monkeypatch.setattr(CausalState, "_feed",
                        lambda self, i, m, *rest: runs.append(i.shape[1]) or feed(self, i, m, *rest))  # fmt: skip
    try:
        model.prefill_chunk = 12  # 12 tokens over 3 rows: 13 columns in chunks of 4, 4, 4 and 1
        chunked = model.state(ids, mask, capacity=ids.shape[1] + 6)
        assert runs == [4, 4, 4, 1]
        got = [chunked.step(np.zeros(3, np.int64))] + [chunked.step(np.full(3, 7 + k)) for k in range(5)]
        tokens = model.greedy(ids, mask, 8, stop_at_eos=False)
    finally:
        del model.prefill_chunk
    assert max(float(np.abs(a - b).max()) for a, b in zip(got, want, strict=True)) <= 1e-5
    assert np.array_equal(tokens, model.greedy(ids, mask, 8, stop_at_eos=False))


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_prompt_read_with_its_logits_gives_teacher_forcing_and_the_same_continuation(exported, side, monkeypatch):
    """``prompt_logits`` is given every prompt token's logits chunk by chunk as the prompt is read
    (the gate's teacher forcing and continuation in one pass): together they are teacher forcing's
    logits, and the continuation is the one made without them; alike for eager PyTorch's greedy."""
    _, eager, model = exported
    ids, mask = _prompts(side, lengths=(13, 8, 1))
    want = model.next_token_logits(ids, mask)
    tokens = model.greedy(ids, mask, 8, stop_at_eos=False)

    def collect(into: np.ndarray, columns: list[int]):
        def every(column: int, logits: np.ndarray) -> None:
            columns.append(logits.shape[1])
            into[:, column : column + logits.shape[1]] = logits
        return every

    got, runs = np.full_like(want, np.nan), []
    monkeypatch.setattr(model, "prefill_chunk", 12)  # 13 columns over 3 rows: chunks of 4, 4, 4 and 1
    made = model.generate(ids, mask, 8, eos_id=-1, prompt_logits=collect(got, runs)).tokens
    assert runs == [4, 4, 4, 1]
    real = mask.astype(bool)
    assert np.abs(got[real] - want[real]).max() <= 1e-5
    assert np.array_equal(made, tokens)
    state_only = np.full_like(want, np.nan)
    model.state(ids, mask, prompt_logits=collect(state_only, []))
    assert np.abs(state_only[real] - want[real]).max() <= 1e-5
    with pytest.raises(EdgeattnError, match="beam"):
        model.generate(ids, mask, 4, strategy="beam", num_beams=2, prompt_logits=collect(got, []))

    eager_got, eager_runs = np.full_like(want, np.nan), []
    eager_tokens = eager.greedy(torch.from_numpy(ids), torch.from_numpy(mask), 8, stop_at_eos=False,
                                prompt_logits=collect(eager_got, eager_runs), prompt_columns=5).numpy()  # fmt: skip
    assert eager_runs == [5, 5, 3]
    with torch.no_grad():
        eager_want = eager(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    assert np.abs(eager_got[real] - eager_want[real]).max() <= 1e-5
    assert np.array_equal(eager_tokens, eager.greedy(torch.from_numpy(ids), torch.from_numpy(mask), 8,
                                                     stop_at_eos=False).numpy())  # fmt: skip
    assert eager.greedy(torch.from_numpy(ids), torch.from_numpy(mask), 0, prompt_logits=collect(eager_got, [])
                        ).shape == (3, 0)  # fmt: skip


def _states_alone(model) -> list:
    """Each of the three right-padded prompts (13, 8 and 1 tokens) in a state of its own, its
    prompt's logits taken (the next step feeds a token)."""
    ids, mask = _prompts("right")
    alone = [model.state(ids[r : r + 1, : int(mask[r].sum())], np.ones((1, int(mask[r].sum())), np.int64))
             for r in range(3)]  # fmt: skip
    for state in alone:
        state.step(np.zeros(1, np.int64))
    return alone


def test_merged_states_decode_each_row_as_alone(exported):
    """Rows of different states (prompts of 13, 8 and 1 tokens, one of them two steps ahead) merged
    into one batch, then stepped together: each row's logits equal its own state's, and the batch's
    room ends at max_len."""
    from edgeattn.runtime.families.causal.runtime import CausalState

    _, _, model = exported
    alone = _states_alone(model)
    alone[1].step(np.array([11]))
    alone[1].step(np.array([12]))
    merged = CausalState.merged(model, [(s, 0) for s in alone], room=4)
    assert merged.rows == 3 and merged.position == 13 and merged.capacity == 17
    for k in range(6):  # past the room: the cache grows as a state's does
        tokens = np.array([20 + k, 30 + k, 40 + k])
        got = merged.step(tokens)
        want = np.concatenate([s.step(tokens[i : i + 1]) for i, s in enumerate(alone)])
        assert np.abs(got - want).max() <= 1e-4, k
    near = CausalState.merged(model, [(merged, 0)], room=10_000)
    assert near.capacity == model.config.max_len


def test_a_row_taken_over_by_a_new_prompt_decodes_as_it_alone(exported):
    """A running batch's row handed to a prompt run alone (its old cache left masked behind it):
    that row's logits equal the prompt's own state's, and the other rows' are unchanged. A prompt
    longer than the batch's written slots is refused, the batch untouched."""
    from edgeattn.runtime.families.causal.runtime import CausalState

    _, _, model = exported
    alone = _states_alone(model)
    batch = CausalState.merged(model, [(alone[0], 0), (alone[2], 0)], room=8)
    for k in range(3):
        batch.step(np.array([50 + k, 60 + k]))
        alone[0].step(np.array([50 + k]))
    newcomer = alone[1]  # 8 tokens: fits before the batch's next slot (16)
    too_long = model.state(_prompts("right")[0][:1, :13], np.ones((1, 13), np.int64))
    too_long.step(np.zeros(1, np.int64))
    for _ in range(4):
        too_long.step(np.array([5]))
    before = batch.slots.copy()
    assert not batch.place(1, too_long, 0) and np.array_equal(batch.slots, before)
    assert batch.place(1, newcomer, 0)
    assert batch.slots[:, : batch.position].sum(axis=1).tolist() == [16, 8]  # filled slots a row
    for k in range(5):
        tokens = np.array([70 + k, 80 + k])
        got = batch.step(tokens)
        want = np.concatenate([alone[0].step(tokens[:1]), newcomer.step(tokens[1:])])
        assert np.abs(got - want).max() <= 1e-4, k


def test_teacher_forced_logits_equal_transformers(exported):
    reference, _, model = exported
    ids, mask = _prompts("right", lengths=(29, 17, 5))
    got = model.next_token_logits(ids, mask)
    for row in range(3):
        with torch.no_grad():
            want = reference(input_ids=_alone(ids, mask, row)).logits[0].numpy()
        assert np.abs(got[row, mask[row].astype(bool)] - want).max() <= ATOL


@pytest.mark.parametrize("side", ["left", "right"])
def test_greedy_tokens_equal_transformers_generate(exported, side):
    reference, _, model = exported
    ids, mask = _prompts(side)
    got = model.greedy(ids, mask, 32, stop_at_eos=False)
    reference.generation_config.eos_token_id = None
    for row in range(3):
        prompt = _alone(ids, mask, row)
        want = reference.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, do_sample=False,
                                  pad_token_id=0)[0, prompt.shape[1] :]  # fmt: skip
        assert got[row].tolist() == want.tolist(), (row, side)


def test_beam_tokens_equal_transformers_generate(exported):
    reference, _, model = exported
    ids, mask = _prompts("left", lengths=(9, 4))
    got = model.generate(ids, mask, 12, strategy="beam", num_beams=3, eos_id=-1).tokens
    reference.generation_config.eos_token_id = None
    for row in range(2):
        prompt = _alone(ids, mask, row)
        want = reference.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, num_beams=3,
                                  do_sample=False, pad_token_id=0, early_stopping=True)  # fmt: skip
        want = want[0, prompt.shape[1] :]
        assert got[row].tolist() == want.tolist(), row


def test_sampling_with_a_seed_is_reproducible_and_equals_eager(exported):
    _, eager, model = exported
    ids, mask = _prompts("left")
    options = {"strategy": "sample", "seed": 11, "temperature": 0.9, "top_k": 20, "top_p": 0.95,
               "repetition_penalty": 1.3}  # fmt: skip
    first = model.generate(ids, mask, 16, **options).tokens
    assert np.array_equal(first, model.generate(ids, mask, 16, **options).tokens)
    assert not np.array_equal(first, model.generate(ids, mask, 16, **{**options, "seed": 12}).tokens)
    assert np.array_equal(first, eager_generate(eager, ids, mask, 16, eos_id=model.stop_ids, **options).tokens)


def test_repetition_penalty_equals_transformers(exported):
    reference, _, model = exported
    ids, mask = _prompts("left", lengths=(6,))
    got = model.generate(ids, mask, 16, repetition_penalty=1.5, eos_id=-1).tokens[0]
    reference.generation_config.eos_token_id = None
    prompt = torch.from_numpy(ids)
    want = reference.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False,
                              repetition_penalty=1.5, pad_token_id=0)[0, 6:]  # fmt: skip
    assert got.tolist() == want.tolist()


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """A Llama with a trained tokenizer and a ChatML template, exported."""
    root = tmp_path_factory.mktemp("causal-text")
    folder, reference = causal_folders.save_folder("llama-gqa-tied", root / "hf", tokenizer=True)
    hf = import_folder(folder)
    export_model(hf.model, root / "out", **_fields(hf))
    return reference, folder, load(root / "out")


def test_text_answers_are_the_tokens_decoded_and_stop_where_asked(text_model):
    _, _, model = text_model
    assert isinstance(model, CausalRuntime) and model.stop_ids == [2, causal_folders.END_OF_TURN]
    prompts = ["the sea is", "write a haiku about the sea"]
    ids, mask = model.encode_prompts(prompts)
    assert (mask[:, -1] == 1).all() and (mask[0, 0] == 0)  # padded on the left
    tokens = model.generate(ids, mask, 20).tokens
    answers = model.generate_text(prompts, 20)
    assert answers == [model.tokenizer.decode(until_stop(row, model.stop_ids)) for row in tokens]
    assert "".join(model.stream_text(prompts[1], 20)) == answers[1]
    words = answers[1].split()
    if len(words) >= 2:  # a stop string ends the answer before it, streamed or not
        stop = " " + words[1]
        cut = answers[1][: answers[1].index(stop)]
        assert model.generate_text(prompts, 20, stop=[stop])[1] == cut
        assert "".join(model.stream_text(prompts[1], 20, stop=[stop])) == cut


def test_chat_renders_like_transformers_and_answers_the_rendered_prompt(text_model):
    _, folder, model = text_model
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello how are you"}]
    rendered = model.render_chat(messages)
    assert rendered == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = np.array([tokenizer(rendered, add_special_tokens=False)["input_ids"]])
    want = model.generate(ids, None, 24).tokens[0]
    assert model.chat(messages, 24) == model.tokenizer.decode(until_stop(want, model.stop_ids))
    assert "".join(model.stream_chat(messages, 24)) == model.chat(messages, 24)


def test_texts_and_conversations_answer_in_one_batch_as_alone(text_model):
    """A batch may mix texts and conversations (what a served batch of chat and plain requests
    is): each row answers as it does alone, with its tokens."""
    _, _, model = text_model
    messages = [{"role": "user", "content": "hello how are you"}]
    found = model.generate_answers(["the sea is", messages, "write a haiku about the sea"], 16)
    assert [text for text, _ in found] == [model.generate_text("the sea is", 16)[0], model.chat(messages, 16),
                                           model.generate_text("write a haiku about the sea", 16)[0]]  # fmt: skip
    assert all(model.tokenizer.decode(tokens) == text for text, tokens in found)
    assert "".join(model.stream_text(messages, 16)) == model.chat(messages, 16)
    with pytest.raises(EdgeattnError, match="a prompt is a text or a list of messages"):
        model.generate_answers(["the sea", 42], 4)


def test_a_conversation_keeps_its_cache_between_turns(text_model):
    _, _, model = text_model
    conversation = model.conversation("be brief")
    first = "".join(conversation.say("hello how are you", max_new_tokens=12))
    whole = len(conversation.cached)
    second = "".join(conversation.say("write a haiku about the sea", max_new_tokens=12))
    assert first == model.chat([{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hello how are you"}], 12)  # fmt: skip
    assert second == model.chat(conversation.messages[:-1], 12)  # what a fresh start answers
    assert 0 < conversation.fed < len(model.encode_prompts([model.render_chat(conversation.messages[:-1])],
                                                           special_tokens=False)[0][0]) - whole + 2  # fmt: skip
    assert [m["role"] for m in conversation.messages] == ["system", "user", "assistant", "user", "assistant"]


def test_bad_inputs_are_one_error(text_model):
    _, _, model = text_model
    with pytest.raises(EdgeattnError, match="unknown generation option"):
        model.generate_text("the sea", 4, beams=2)
    with pytest.raises(EdgeattnError, match="max_len"):
        model.generate_text("the sea", 200)
    with pytest.raises(EdgeattnError, match="beam search is for generate"):
        list(model.conversation().say("hello", strategy="beam"))
    assert len(model.generate_text("the sea " * 60, 8, truncate=True)) == 1
    with pytest.raises(AttributeError, match="classify\\(\\) is for encoder exports"):
        model.classify("the sea")


def test_the_command_line_runs_and_chats(text_model, tmp_path):
    from click.testing import CliRunner

    from edgeattn.cli import cli

    _, _, model = text_model
    out = str(model.export_dir)
    runner = CliRunner()
    raw = runner.invoke(cli, ["run", out, "the sea is", "--raw", "--max-new-tokens", "12"])
    assert raw.exit_code == 0, raw.output
    assert raw.output.rstrip("\n") == model.generate_text("the sea is", 12)[0]
    chatted = runner.invoke(cli, ["run", out, "hello how are you", "--max-new-tokens", "12", "--stream"])
    assert chatted.output.rstrip("\n") == model.chat([{"role": "user", "content": "hello how are you"}], 12)
    talk = runner.invoke(cli, ["chat", out, "--max-new-tokens", "8"], input="hello\n/reset\nthe sea\n/exit\n")
    assert talk.exit_code == 0, talk.output
    assert talk.output.splitlines() == [model.chat([{"role": "user", "content": "hello"}], 8),
                                        model.chat([{"role": "user", "content": "the sea"}], 8)]  # fmt: skip


def test_bench_times_a_language_model_export_its_own_way(text_model, tmp_path):
    """``edgeattn bench EXPORT`` asks the family record how to time a language model's export
    (prefill and decoding per prompt length and batch), writes its table and JSON."""
    from click.testing import CliRunner

    from edgeattn.cli import cli

    _, _, model = text_model
    out = tmp_path / "bench.json"
    done = CliRunner().invoke(cli, ["bench", str(model.export_dir), "--seq", "6", "--batch", "1,2", "--threads", "1",
                                    "--json", str(out)])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "decode tok/s" in done.output
    rows = json.loads(out.read_text())["rows"]
    assert [(r["precision"], r["prompt"], r["batch"]) for r in rows] == [("fp32", 6, 1), ("fp32", 6, 2)]
    assert all(r["decode_tok_s"] > 0 and r["prefill_s"] > 0 for r in rows)
