"""The OpenAI-compatible API through a real server on loopback and the official ``openai`` client:
chat and completions (plain and streamed) equal the runtime's greedy answers, concurrent chats share
one batch and each answers as alone, a client that goes mid-stream frees its row, embeddings equal
``embed``, and every error is OpenAI's object with its status."""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.helpers import causal_folders

pytest.importorskip("aiohttp")
openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")
from edgeattn.runtime import load  # noqa: E402
from edgeattn.serving.batching import Finished, Generation  # noqa: E402
from edgeattn.serving.openai_api import ApiThread, OpenAIApi, served_models  # noqa: E402

QUESTIONS = ["the sea is", "write a haiku about the sea", "hello", "waves fold over the sand under", "the moon",
             "tell me about waves", "sand and sea", "hello how are you"]  # fmt: skip


@pytest.fixture(scope="module")
def lm_export(tmp_path_factory):
    return causal_folders.export_trained(tmp_path_factory.mktemp("openai-lm"), "int8")


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    from edgeattn.exporters.export import export_model
    from edgeattn.sources import resolve_model
    from tests.helpers.encoder_folders import BERT_SPECIALS, make_checkpoint, make_tokenizer

    root = tmp_path_factory.mktemp("openai-embed")
    make_checkpoint("Bert", "Model").save_pretrained(root / "hf")
    make_tokenizer(*BERT_SPECIALS).save_pretrained(root / "hf")
    source = resolve_model(from_hf=root / "hf")
    export_model(source.model, root / "bert", graphs=["encoder"], tokenizer=source.tokenizer, task=source.task,
                 verify=False)  # fmt: skip
    return root / "bert"


@pytest.fixture(scope="module")
def json_lm(tmp_path_factory):
    """A random Llama whose byte-level tokenizer can spell any JSON (what llguidance reads)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from edgeattn.exporters.export import export_model
    from edgeattn.sources import resolve_model

    torch.manual_seed(0)  # the same weights whichever test asks first (a module fixture precedes the seed)
    root = tmp_path_factory.mktemp("openai-json")
    folder = root / "hf"
    folder.mkdir()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(['{"ok": true, "n": 1, "name": "sea"}', "the sea is blue"] * 20, trainer)
    tok.save(str(folder / "tokenizer.json"))
    settings = {"chat_template": causal_folders.CHATML, "eos_token": "<|im_end|>", "pad_token": "<pad>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    config = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=2048, pad_token_id=0, bos_token_id=1,
                                      eos_token_id=2)  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    source = resolve_model(from_hf=folder)
    export_model(source.model, root / "json-lm", verify=False, **source.export_fields())
    return root / "json-lm"


#: a template that speaks tools as Qwen 2.5's and Hermes' do (tools in the system turn, calls in <tool_call> tags)
HERMES = """{%- if tools %}<|im_start|>system
You may call functions: <tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>
Write each call as <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}
{% if m.content %}{{ m.content }}{% endif %}{% for c in m.tool_calls or [] %}<tool_call>
{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}
</tool_call>{% endfor %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def server(lm_export, embedder, json_lm):
    from edgeattn.runtime.families.causal.chat import ChatTemplate
    from edgeattn.serving.batching import Batcher
    from edgeattn.serving.openai_api import Served

    models = served_models([lm_export, embedder, json_lm], max_rows=8)
    hermes = load(json_lm)
    hermes.chat_template = ChatTemplate(HERMES, hermes.chat_template.special_tokens)
    models["hermes-lm"] = Served("hermes-lm", hermes, 0, Batcher(hermes, 4))
    api = OpenAIApi(models)
    with ApiThread(api) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_models_and_a_greedy_chat_equal_the_runtime(client, lm_export):
    assert {m.id for m in client.models.list().data} == {"lm", "bert", "json-lm", "hermes-lm"}
    runtime = load(lm_export)
    want = runtime.chat(_chat(QUESTIONS[0]), 12)
    answer = client.chat.completions.create(model="lm", messages=_chat(QUESTIONS[0]), max_tokens=12, temperature=0)
    assert answer.choices[0].message.content == want and answer.choices[0].message.role == "assistant"
    assert answer.choices[0].finish_reason in ("stop", "length")
    prompt = len(runtime._tokenizer().encode(runtime.render_chat(_chat(QUESTIONS[0])), False))
    assert answer.usage.prompt_tokens == prompt and 0 < answer.usage.completion_tokens <= 12
    pieces, usage = [], None
    for chunk in client.chat.completions.create(model="lm", messages=_chat(QUESTIONS[0]), max_tokens=12,
                                                temperature=0, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        pieces += [c.delta.content or "" for c in chunk.choices]
    assert "".join(pieces) == want and usage is not None and usage.total_tokens == answer.usage.total_tokens


def test_completions_stop_strings_n_and_logprobs(client, lm_export):
    runtime = load(lm_export)
    want = runtime.generate_text([QUESTIONS[1]], 10)[0]
    got = client.completions.create(model="lm", prompt=QUESTIONS[1], max_tokens=10, temperature=0)
    assert got.choices[0].text == want
    words = want.split()
    stop = words[1] if len(words) > 1 else None
    if stop:
        cut = client.completions.create(model="lm", prompt=QUESTIONS[1], max_tokens=10, temperature=0, stop=[stop])
        assert cut.choices[0].text == want[: want.index(stop)] and cut.choices[0].finish_reason == "stop"
    two = client.chat.completions.create(model="lm", messages=_chat("hello"), max_tokens=6, n=2, seed=3,
                                         temperature=0.9, logprobs=True, top_logprobs=3)  # fmt: skip
    again = client.chat.completions.create(model="lm", messages=_chat("hello"), max_tokens=6, n=2, seed=3,
                                           temperature=0.9, logprobs=True, top_logprobs=3)  # fmt: skip
    assert [c.message.content for c in two.choices] == [c.message.content for c in again.choices]  # seeded
    entries = two.choices[0].logprobs.content
    assert entries and all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in entries)
    assert all(e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob for e in entries)


def test_concurrent_streams_share_a_batch_and_answer_as_alone(client, server, lm_export):
    runtime = load(lm_export)
    lengths = [4 + 3 * (i % 5) for i in range(16)]
    asked = [(QUESTIONS[i % len(QUESTIONS)], lengths[i]) for i in range(16)]
    want = [runtime.chat(_chat(q), n) for q, n in asked]

    def stream(item):
        q, n = item
        pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="lm", messages=_chat(q), max_tokens=n, temperature=0, stream=True) if c.choices]  # fmt: skip
        return "".join(pieces)

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(stream, asked))
    assert got == want
    batcher = server.api.models["lm"].batcher
    assert batcher.widest > 1  # rows decoded together
    assert batcher.rows == 0 and batcher.state is None  # every row left


def test_a_client_that_goes_mid_stream_frees_its_row(server, lm_export):
    """Through HTTP: a client that reads one chunk and goes leaves no row behind. In the batch: a
    generation cancelled after its first token ends there, as cancelled, and its row is freed."""
    body = json.dumps({"model": "lm", "messages": _chat("the sea is"), "temperature": 0.8,
                       "stream": True}).encode()  # fmt: skip
    request = urllib.request.Request(server.url + "/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.readline().startswith(b"data: ")  # the first chunk, then the client goes
    batcher = server.api.models["lm"].batcher
    deadline = time.time() + 30
    while (batcher.rows or not batcher.waiting.empty()) and time.time() < deadline:
        time.sleep(0.05)
    assert batcher.rows == 0 and batcher.state is None

    runtime = load(lm_export)
    prompt = runtime._tokenizer().encode(runtime.render_chat(_chat(QUESTIONS[3])), False)
    assert len(runtime.generate_answers([_chat(QUESTIONS[3])], 8)[0][1]) >= 2  # its answer runs past one token
    events, before = [], batcher.ended["cancelled"]

    def emit(event):
        events.append(event)
        if len(events) == 1:  # the first token, chosen after its prompt ran alone
            generation.cancelled.set()

    generation = Generation(prompt, 40, emit, temperature=0)
    batcher.submit(generation)
    deadline = time.time() + 30
    while not any(isinstance(e, Finished) for e in events) and time.time() < deadline:
        time.sleep(0.01)
    assert isinstance(events[-1], Finished) and events[-1].reason == "cancelled", events
    assert events[-1].completion_tokens == 1 and batcher.ended["cancelled"] == before + 1
    assert batcher.rows == 0


def test_a_freed_row_is_taken_over_then_compacted_away_and_every_answer_is_as_alone(lm_export):
    """Two generations in one batch; when the short one ends a third arrives and takes over its
    row (no copy of the batch); when the third ends and nobody comes, within IDLE_STEPS steps the
    batch is compacted to the long one's row alone. Every answer equals the runtime's alone."""
    from edgeattn.serving.batching import IDLE_STEPS, Batcher

    runtime = load(lm_export)
    tokenizer = runtime._tokenizer()
    answers = {q: [int(t) for t in runtime.generate_answers([_chat(q)], 40)[0][1]] for q in QUESTIONS}
    ids = {q: tokenizer.encode(runtime.render_chat(_chat(q)), False) for q in QUESTIONS}
    long_q = max(QUESTIONS, key=lambda q: len(answers[q]))
    short_q = QUESTIONS[0] if long_q != QUESTIONS[0] else QUESTIONS[1]
    newcomer_q = min(QUESTIONS, key=lambda q: len(ids[q]))  # a prompt that fits the batch's written slots
    assert len(answers[long_q]) >= 3 + 4 + IDLE_STEPS + 2, answers  # room to see both happen
    assert len(answers[short_q]) >= 3, answers  # it ends at its limit, inside the batch
    batcher = Batcher(runtime, 4)
    rows_seen, done = [], threading.Event()
    got: dict[str, list[int]] = {"long": [], "short": [], "newcomer": []}

    def emit(name, event):
        if isinstance(event, Finished):
            if name == "short":  # the newcomer waits before the short one's row is freed
                batcher.submit(Generation(ids[newcomer_q], 4, lambda e: emit("newcomer", e), temperature=0))
            if name == "long":
                done.set()
            return
        got[name].append(event.token)
        if name == "long":
            rows_seen.append(0 if batcher.state is None else batcher.state.rows)

    try:
        batcher.submit(Generation(ids[long_q], 40, lambda e: emit("long", e), temperature=0))
        batcher.submit(Generation(ids[short_q], 3, lambda e: emit("short", e), temperature=0))
        assert done.wait(60)
    finally:
        batcher.close()
    assert got["long"] == answers[long_q]
    assert got["short"] == answers[short_q][:3] and got["newcomer"] == answers[newcomer_q][:4]
    assert batcher.joins["placed"] == 1, batcher.joins  # the newcomer took over the freed row
    assert 2 in rows_seen and rows_seen[-1] == 1  # decoded together, then alone after the compaction


def test_embeddings_equal_embed(client, embedder):
    texts = ["Angela Merkel visited Paris.", "the sea"]
    want = load(embedder).embed(texts)
    got = client.embeddings.create(model="bert", input=texts)
    assert np.allclose([d.embedding for d in got.data], want, atol=1e-6)
    raw = client.embeddings.create(model="bert", input=texts[0], encoding_format="base64")
    vector = raw.data[0].embedding
    if isinstance(vector, str):  # the client hands base64 back as it came
        vector = np.frombuffer(base64.b64decode(vector), np.float32)
    assert np.allclose(vector, want[0], atol=1e-6)


def test_errors_are_openais_objects(client, server):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="nope", messages=_chat("hi"))
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="lm", messages=_chat("hi"), temperature=5)
    assert bad.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model="lm", prompt="the sea " * 400, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="response_format type") as bad:
        client.chat.completions.create(model="lm", messages=_chat("hi"), response_format={"type": "yaml"})
    assert bad.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError, match="not among the tools") as bad:
        client.chat.completions.create(model="lm", messages=_chat("hi"), tools=TOOLS, tool_choice={
            "type": "function", "function": {"name": "nope"}})  # fmt: skip
    assert bad.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\] is") as bad:
        client.chat.completions.create(model="lm", messages=_chat("hi"), tools=[{"type": "retrieval"}])
    assert bad.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError, match="legacy") as bad:
        client.chat.completions.create(model="lm", messages=_chat("hi"), functions=[{"name": "f"}])
    with pytest.raises(openai.BadRequestError, match="embeds its inputs"):
        client.chat.completions.create(model="bert", messages=_chat("hi"))
    keyed = OpenAIApi(server.api.models, api_key="sesame", owns_models=False)
    with ApiThread(keyed) as locked:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=locked.url, api_key="wrong", max_retries=0).models.list()
        assert openai.OpenAI(base_url=locked.url, api_key="sesame", max_retries=0).models.list().data
        with urllib.request.urlopen(locked.url.removesuffix("/v1") + "/health", timeout=30) as r:  # no key
            health = json.loads(r.read())
        assert health["status"] == "ok" and set(health["batches"]) == {"lm", "json-lm", "hermes-lm"}
        lm = health["batches"]["lm"]  # the earlier tests' chats
        assert lm["widest"] >= 1 and lm["ended"].get("stop", 0) + lm["ended"].get("length", 0) >= 1


def test_edgeattn_serve_api_openai_answers_curl_until_interrupted(lm_export, embedder):
    import shutil
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "edgeattn.cli", "serve", str(lm_export), str(embedder), "--api", "openai",
               "--port", str(port), "--api-key", "sesame"]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("serving lm, bert at http://127.0.0.1:"), (line, server.stderr.read())
        body = json.dumps({"model": "lm", "prompt": "the sea is", "max_tokens": 4, "temperature": 0})
        url = f"http://127.0.0.1:{port}/v1/completions"
        if shutil.which("curl"):
            ask = ["curl", "-s", url, "-H", "Authorization: Bearer sesame", "-H", "Content-Type: application/json",
                   "-d", body]  # fmt: skip
            got = json.loads(subprocess.run(ask, capture_output=True, text=True, timeout=60, check=True).stdout)
            assert got["choices"][0]["text"] == load(lm_export).generate_text(["the sea is"], 4)[0]
            denied = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url, "-d", body],
                                    capture_output=True, text=True, timeout=60)  # fmt: skip
            assert denied.stdout == "401"
    finally:
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=60)
    assert server.returncode == 0 and "stopping" in out, err


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "enum": [1, 2, 3]},
                                           "name": {"type": "string", "enum": ["sea", "moon"]}},
          "required": ["ok", "n", "name"], "additionalProperties": False}  # fmt: skip


def test_json_schema_answers_parse_and_validate(client):
    """Random weights, so only the grammar makes these JSON: every answer parses and validates,
    greedy and sampled, several in one batch; json_object gives an object."""
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("llguidance")
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    greedy = client.chat.completions.create(model="json-lm", messages=_chat("answer"), temperature=0,
                                            response_format=fmt, max_tokens=60)  # fmt: skip
    sampled = client.chat.completions.create(model="json-lm", messages=_chat("answer"), temperature=1.0, seed=5,
                                             n=4, response_format=fmt, max_tokens=60)  # fmt: skip
    for choice in [*greedy.choices, *sampled.choices]:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        assert choice.finish_reason == "stop"
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="json-lm", messages=_chat("answer"), temperature=0, response_format=fmt, max_tokens=60, stream=True)
        if c.choices]  # fmt: skip
    assert "".join(pieces) == greedy.choices[0].message.content
    anything = client.chat.completions.create(model="json-lm", messages=_chat("answer"), temperature=0,
                                              response_format={"type": "json_object"}, max_tokens=200)  # fmt: skip
    if anything.choices[0].finish_reason == "stop":  # random weights may run out of tokens inside an object
        assert isinstance(json.loads(anything.choices[0].message.content), dict)
    with pytest.raises(openai.BadRequestError, match="JSON schema") as bad:
        client.chat.completions.create(model="json-lm", messages=_chat("answer"), response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})  # fmt: skip
    assert bad.value.body["param"] == "response_format"


def test_the_runtime_decodes_under_a_schema_or_a_regex(json_lm):
    """``chat`` / ``generate_text`` take ``json_schema`` or ``regex`` (no server): batched rows of
    different prompts, greedy and sampled, each answer on its grammar."""
    import re

    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("llguidance")
    model = load(json_lm)
    jsonschema.validate(json.loads(model.chat(_chat("answer"), 60, json_schema=SCHEMA)), SCHEMA)
    for answer in model.generate_text(["the sea", "is blue and the sea"], 60, json_schema=SCHEMA, strategy="sample",
                                      seed=2):  # fmt: skip
        jsonschema.validate(json.loads(answer), SCHEMA)
    pattern = r"(sea|blue)( (sea|blue)){2}"
    assert all(re.fullmatch(pattern, a) for a in model.generate_text(["the", "sea is"], 30, regex=pattern))
    with pytest.raises(Exception, match="not beam search"):
        model.generate_text(["the"], 8, regex=pattern, strategy="beam")


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                                              "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
             "required": ["city", "unit"], "additionalProperties": False}}},
         {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer", "enum": [1, 2]}, "b": {"type": "integer",
                                                                                      "enum": [1, 2]}},
             "required": ["a", "b"], "additionalProperties": False}}}]  # fmt: skip


def _valid_calls(message, names=("get_weather", "add")):
    """Each call names an offered tool, has an id, and its arguments validate against its schema."""
    jsonschema = pytest.importorskip("jsonschema")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]


@pytest.mark.parametrize("model", ["json-lm", "hermes-lm"])
def test_tool_calls_parse_and_validate(client, model):
    """Random weights, so only the grammar makes these calls: under ``required`` and a named tool
    every answer is calls whose arguments validate (a named tool's only), in both formats (the
    generic JSON of a template without tools, and a template's own <tool_call> tags); a streamed
    answer's calls equal the plain one's; ``auto`` answers text or calls; ``none`` answers text."""
    pytest.importorskip("llguidance")
    asked = dict(model=model, messages=_chat("weather in Paris?"), tools=TOOLS, temperature=0, max_tokens=120,
                 parallel_tool_calls=False)  # random weights would add parallel calls until the limit
    required = client.chat.completions.create(**asked, tool_choice="required")
    assert required.choices[0].finish_reason == "tool_calls" and required.choices[0].message.content is None
    calls = _valid_calls(required.choices[0].message)
    named = client.chat.completions.create(**asked, tool_choice={"type": "function", "function": {"name": "add"}})
    assert len(_valid_calls(named.choices[0].message, names=("add",))) == 1
    parallel = client.chat.completions.create(**{**asked, "parallel_tool_calls": True}, tool_choice="required")
    message = parallel.choices[0].message
    if parallel.choices[0].finish_reason == "tool_calls":
        assert len(_valid_calls(message)) >= 1
    elif model == "hermes-lm":  # cut short: the whole calls, not the one cut
        assert message.tool_calls is None or _valid_calls(message)
        assert "<tool" not in (message.content or "") and "<" != (message.content or " ")[-1]
    else:  # cut short inside the JSON: the text as it came
        assert message.tool_calls is None and message.content.startswith('{"tool_calls": [')
    streamed = []
    for chunk in client.chat.completions.create(**asked, tool_choice="required", stream=True):
        for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            streamed.append((call.function.name, json.loads(call.function.arguments)))
    assert streamed == calls
    sampled = client.chat.completions.create(**{**asked, "temperature": 1.0}, tool_choice="required", n=3, seed=4)
    for choice in sampled.choices:
        _valid_calls(choice.message)
    auto = client.chat.completions.create(**asked)
    if auto.choices[0].finish_reason == "tool_calls":
        _valid_calls(auto.choices[0].message)
    else:
        assert auto.choices[0].message.tool_calls is None and isinstance(auto.choices[0].message.content, str)
    plain = client.chat.completions.create(**asked, tool_choice="none")
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason in ("stop", "length")


def test_a_conversation_goes_on_after_its_tool_results(client, json_lm):
    """An assistant's earlier calls and the tools' results render in both formats (the calls'
    JSON-string arguments handed to a template as objects) and the next answer keeps to the grammar."""
    from edgeattn.runtime.families.causal.tool_calls import tool_use

    pytest.importorskip("llguidance")
    conversation = [*_chat("weather in Paris?"),
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21"}]  # fmt: skip
    for model in ("json-lm", "hermes-lm"):
        answer = client.chat.completions.create(model=model, messages=conversation, tools=TOOLS, max_tokens=120,
                                                temperature=0, tool_choice="required", parallel_tool_calls=False)
        _valid_calls(answer.choices[0].message)
    hermes = tool_use(HERMES, TOOLS)
    prompt = load(json_lm).chat_template.__class__(HERMES).render(hermes.messages(conversation), True,
                                                                   tools=hermes.template_tools())  # fmt: skip
    assert '<tools>{"type": "function", "function": {"name": "get_weather"' in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}' in prompt
    generic = tool_use(causal_folders.CHATML, TOOLS, "auto")
    shown = generic.messages(conversation)
    assert shown[0]["role"] == "system" and '"name": "get_weather"' in shown[0]["content"]
    assert json.loads(shown[2]["content"]) == {"tool_calls": [{"name": "get_weather",
                                                               "arguments": {"city": "Paris", "unit": "celsius"}}]}
    assert shown[3] == {"role": "tool", "content": "sunny, 21"}


def test_tool_answers_parse_in_both_formats():
    from edgeattn.runtime.families.causal.tool_calls import tool_use

    generic, hermes = tool_use(causal_folders.CHATML, TOOLS), tool_use(HERMES, TOOLS)
    assert (generic.format, hermes.format) == ("generic", "hermes")
    content, calls = generic.parse('{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}')
    assert content is None and [(c.name, c.arguments) for c in calls] == [("add", {"a": 1, "b": 2})]
    assert generic.parse('{"response": "hello"}') == ("hello", [])
    assert generic.parse('{"tool_calls": [{"name": "add", "argu') == ('{"tool_calls": [{"name": "add", "argu', [])
    content, calls = hermes.parse('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 1}}\n</tool_call>\n'
                                  '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>')
    assert content is None and [c.name for c in calls] == ["add", "get_weather"] and calls[0].id != calls[1].id
    assert hermes.parse("plain words") == ("plain words", [])
    content, calls = hermes.parse('<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>\n<tool_call>\n{"na')
    assert content is None and [c.name for c in calls] == ["add"]
    assert hermes.parse('<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>\n<tool_')[0] is None
    assert hermes.may_be_call("") and hermes.may_be_call("<tool") and not hermes.may_be_call("The")
    assert tool_use(HERMES, TOOLS, "none") is None and tool_use(HERMES, None) is None


def test_an_export_of_a_family_the_api_does_not_serve_is_refused_naming_those_it_serves(shared_export):
    """What the API serves is each family's record's say (``Family.api``): a seq2seq export is refused."""
    from edgeattn.errors import EdgeattnError
    from edgeattn.runtime.families import FAMILIES

    served = [f.name for f in FAMILIES.values() if f.api]
    assert served == ["encoder", "causal", "speech", "vision"]
    refused = "is a seq2seq export; the OpenAI API serves encoder, causal, speech, vision"
    with pytest.raises(EdgeattnError, match=refused):
        served_models([shared_export("tiny")], max_rows=2)
