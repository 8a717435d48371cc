"""The OpenAI API as Ray Serve replicas on a real local Ray cluster (a head and a worker node,
processes on this machine) through the official ``openai`` client: chat, completions, streams,
embeddings and transcriptions equal the in-process server's answers, and so do its errors; a
language model's replicas scale from one to two under load and back after it; a replica killed
mid-load costs its in-flight requests a clean error at most and new requests are answered; the
command line serves on a local cluster it starts and stops."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.helpers import causal_folders

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
pytest.importorskip("aiohttp")
openai = pytest.importorskip("openai")
soundfile = pytest.importorskip("soundfile")
pytest.importorskip("transformers")
from edgeattn.cli import cli  # noqa: E402
from edgeattn.serving.openai_api import ApiThread, OpenAIApi, served_models  # noqa: E402
from edgeattn.serving.ray_serve import APPLICATION, RayServeOptions, _model_named, deploy  # noqa: E402

pytestmark = [pytest.mark.slow,  # a window shorter than Ray's default metrics interval, for a quick test
              pytest.mark.filterwarnings("ignore:`look_back_period_s`:FutureWarning")]  # fmt: skip
KEY = "sesame"
PROMPTS = ["the sea is", "waves fold over the sand under", "the moon", "hello"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wav(seconds: float, seed: int) -> bytes:
    buffer = io.BytesIO()
    samples = (0.1 * np.random.default_rng(seed).standard_normal(int(seconds * 16_000))).astype(np.float32)
    soundfile.write(buffer, samples, 16_000, format="WAV")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> list[Path]:
    from edgeattn.exporters.export import export_model
    from edgeattn.sources import resolve_model
    from tests.helpers.encoder_folders import BERT_SPECIALS, make_checkpoint, make_tokenizer
    from tests.helpers.speech_folders import speech_folder

    root = tmp_path_factory.mktemp("ray-serve")
    lm = causal_folders.export_trained(root, "int8")
    make_checkpoint("Bert", "Model").save_pretrained(root / "hf-bert")
    make_tokenizer(*BERT_SPECIALS).save_pretrained(root / "hf-bert")
    source = resolve_model(from_hf=root / "hf-bert")
    export_model(source.model, root / "bert", graphs=["encoder"], tokenizer=source.tokenizer, task=source.task,
                 verify=False)  # fmt: skip
    result = CliRunner().invoke(cli, ["export", "--from-hf", str(speech_folder(root / "hf-whisper")), "-o",
                                      str(root / "whisper"), "--no-verify"])  # fmt: skip
    assert result.exit_code == 0, result.output
    return [lm, root / "bert", root / "whisper"]


@pytest.fixture(scope="module")
def in_process(exports):
    with ApiThread(OpenAIApi(served_models(exports, max_rows=4), api_key=KEY)) as server:
        yield server.url


@pytest.fixture(scope="module")
def on_ray(exports):
    """The exports deployed on a head (1 CPU) and a worker node (3 CPUs): the OpenAI base URL."""
    from ray import serve
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=3)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        options = RayServeOptions(api_key=KEY, max_rows=4, max_replicas=2, target_requests=2, upscale_delay_s=1.0,
                                  downscale_delay_s=3.0, look_back_s=2.0)  # fmt: skip
        with deploy(exports, options, port=_free_port()) as running:
            yield running.url
        serve.shutdown()
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_the_ingress_finds_the_model_in_json_and_multipart_bodies() -> None:
    import urllib3

    body, content_type = urllib3.encode_multipart_formdata(
        [("file", ("a.wav", b"RIFF\x00\x00", "audio/wav")), ("model", "whisper-base"), ("language", "en")])
    assert _model_named("/v1/audio/transcriptions", content_type, body) == "whisper-base"
    assert _model_named("/v1/chat/completions", "application/json", b'{"model": "lm", "messages": []}') == "lm"
    assert _model_named("/v1/chat/completions", "application/json", b"not json") is None
    assert _model_named("/v1/chat/completions", "application/json", b'["lm"]') is None
    assert _model_named("/v1/models/bert", "", b"") == "bert"
    no_model, content_type = urllib3.encode_multipart_formdata([("file", ("a.wav", b"x", "audio/wav"))])
    assert _model_named("/v1/audio/transcriptions", content_type, no_model) is None


def test_the_command_line_refuses_what_it_cannot_serve_on_ray_before_ray_starts(exports, tmp_path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["serve", str(exports[1]), "--ray"])
    assert result.exit_code == 2 and "--ray serves the OpenAI API: add --api openai" in result.output
    for arguments, message in [
        ([str(tmp_path / "missing")], "is not a directory (expected an edgeattn export)"),
        ([str(exports[1]), "--precision", "int4"], "int4"),
        ([str(exports[1]), "--min-replicas", "3", "--max-replicas", "2"], "--min-replicas must be at least 1"),
    ]:
        result = runner.invoke(cli, ["serve", *arguments, "--api", "openai", "--ray"])
        assert result.exit_code == 1, result.output
        assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not ray.is_initialized()


def _client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)


def _answers(url: str) -> dict:
    """What the client gets from each endpoint (answers without their ids and times)."""
    client = _client(url)
    chat = [client.chat.completions.create(model="lm", messages=[{"role": "user", "content": p}], max_tokens=12,
                                           temperature=0) for p in PROMPTS]  # fmt: skip
    completion = client.completions.create(model="lm", prompt=PROMPTS, max_tokens=10, temperature=0)
    stream = client.chat.completions.create(model="lm", messages=[{"role": "user", "content": PROMPTS[0]}],
                                            max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True})  # fmt: skip
    pieces, usage = [], None
    for chunk in stream:
        pieces += [c.delta.content or "" for c in chunk.choices]
        usage = chunk.usage or usage
    embeddings = client.embeddings.create(model="bert", input=["hello world", "the sea is calm"])
    transcript = client.audio.transcriptions.create(model="whisper", file=("clip.wav", _wav(1.5, 4)),
                                                    response_format="verbose_json")  # fmt: skip
    errors = {}
    for label, call in {
        "unknown": lambda: client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}]),
        "key": lambda: _client(url, "wrong").models.list(),
        "endpoint": lambda: client.embeddings.create(model="lm", input="x"),
        "audio of a text model": lambda: client.audio.transcriptions.create(model="bert",
                                                                            file=("a.wav", _wav(0.5, 1))),
        "no model": lambda: client.post("/chat/completions", body={"messages": []}, cast_to=object),
    }.items():
        with pytest.raises(openai.APIStatusError) as caught:
            call()
        errors[label] = (caught.value.status_code, caught.value.body)
    return {
        "models": [m.id for m in client.models.list().data],
        "chat": [(c.choices[0].message.content, c.choices[0].finish_reason, c.usage.model_dump()) for c in chat],
        "completion": [(c.text, c.finish_reason) for c in completion.choices],
        "stream": ("".join(pieces), usage.model_dump() if usage else None),
        "embeddings": np.array([d.embedding for d in embeddings.data]),
        "transcript": (transcript.text, [s.tokens for s in transcript.segments or []]),
        "errors": errors,
    }


def test_the_client_gets_the_in_process_answers_from_the_ray_ingress(in_process, on_ray) -> None:
    want, got = _answers(in_process), _answers(on_ray)
    np.testing.assert_allclose(got.pop("embeddings"), want.pop("embeddings"), rtol=0, atol=1e-6)
    assert got == want
    assert want["models"] == ["lm", "bert", "whisper"]
    status, body = want["errors"]["unknown"]
    assert status == 404 and "served: lm, bert, whisper" in body["message"]
    assert want["errors"]["key"][0] == 401
    health = json.loads(urllib.request.urlopen(on_ray.removesuffix("/v1") + "/health", timeout=30).read())
    assert health["status"] == "ok" and set(health["batches"]) == {"lm"}


def _running(deployment: str) -> int:
    from ray import serve

    states = serve.status().applications[APPLICATION].deployments[deployment].replica_states
    return int(states.get("RUNNING", 0))


def _load(url: str, stop: threading.Event, results: list, index: int) -> None:
    """Streams completions until ``stop``: each outcome (the text, or the error) in ``results``."""
    client = _client(url)
    while not stop.is_set():
        try:
            stream = client.completions.create(model="lm", prompt=PROMPTS[index % len(PROMPTS)], max_tokens=40,
                                               temperature=0, stream=True)  # fmt: skip
            results.append((index % len(PROMPTS), "".join(c.choices[0].text for c in stream if c.choices)))
        except openai.APIError as exc:  # a clean error: OpenAI's object, or a stream's error event
            results.append((index % len(PROMPTS), exc))


def test_a_language_models_replicas_scale_up_under_load_and_back(on_ray) -> None:
    assert _running("export-lm") == 1
    stop, results = threading.Event(), []
    with ThreadPoolExecutor(8) as pool:
        for index in range(8):
            pool.submit(_load, on_ray, stop, results, index)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and _running("export-lm") < 2:
            time.sleep(0.5)
        scaled = _running("export-lm")
        time.sleep(2)  # both replicas answer
        stop.set()
    assert scaled == 2, "a second replica did not start under 8 streaming clients"
    texts: dict[int, set] = {}
    for prompt, outcome in results:
        assert isinstance(outcome, str), outcome
        texts.setdefault(prompt, set()).add(outcome)
    assert all(len(seen) == 1 for seen in texts.values()), "replicas answered the same greedy prompt differently"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and _running("export-lm") > 1:
        time.sleep(0.5)
    assert _running("export-lm") == 1, "the replicas did not scale back after the load"


def test_a_replica_killed_mid_load_fails_cleanly_and_new_requests_are_answered(on_ray) -> None:
    deadline = time.monotonic() + 60
    while True:  # one replica left: one scaled down drains before its process goes (named actors come
        # from the GCS itself: the state API would need the dashboard, which another cluster's tests may hold)
        replicas = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["namespace"] == "serve" and "export-lm" in a["name"]]  # fmt: skip
        if len(replicas) == 1 == _running("export-lm") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(replicas) == 1 == _running("export-lm"), replicas
    want = _client(on_ray).completions.create(model="lm", prompt=PROMPTS[0], max_tokens=40, temperature=0)
    stop, results = threading.Event(), []
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_load, on_ray, stop, results, index) for index in range(4)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(results) < 4:
            time.sleep(0.05)
        ray.kill(ray.get_actor(replicas[0], namespace="serve"), no_restart=True)
        killed_at, before = time.monotonic(), len(results)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(isinstance(o, str) for _, o in results[before + 4:]):
            time.sleep(0.1)  # answers to requests sent after the kill
        recovered = time.monotonic() - killed_at
        stop.set()
        for future in futures:
            future.result(timeout=120)  # nothing hangs
    failed = [o for _, o in results if not isinstance(o, str)]
    logging.getLogger(__name__).info("replica killed: %d answers, %d clean errors (%s), answered again after %.1f s",
                                     len(results) - len(failed), len(failed), {type(o).__name__ for o in failed},
                                     recovered)  # fmt: skip
    assert recovered < 60, "no request was answered in the minute after the replica died"
    for _, outcome in results:
        assert isinstance(outcome, (str, openai.APIError)), outcome
    assert {o for p, o in results if p == 0 and isinstance(o, str)} <= {want.choices[0].text}
    again = _client(on_ray).completions.create(model="lm", prompt=PROMPTS[0], max_tokens=40, temperature=0)
    assert again.choices[0].text == want.choices[0].text


def test_the_command_line_serves_on_a_local_cluster_and_stops_on_ctrl_c(exports) -> None:
    port = _free_port()
    env = dict(os.environ, RAY_ADDRESS="")  # its own local cluster, whatever this machine runs
    process = subprocess.Popen([sys.executable, "-m", "edgeattn.cli", "serve", str(exports[0]), "--api", "openai",
                                "--ray", "--port", str(port), "--api-key", KEY],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not any("on Ray Serve at" in line for line in lines):
            assert process.poll() is None, "".join(lines)
            time.sleep(0.2)
        assert any(f"at http://127.0.0.1:{port}/v1" in line for line in lines), "".join(lines)
        answer = _client(f"http://127.0.0.1:{port}/v1").chat.completions.create(
            model="lm", messages=[{"role": "user", "content": "the sea is"}], max_tokens=8, temperature=0)
        assert answer.choices[0].message.content
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=90) == 0, "".join(lines)
        reader.join(timeout=10)
        assert any("stopping" in line for line in lines), "".join(lines)
    finally:
        if process.poll() is None:
            process.kill()
