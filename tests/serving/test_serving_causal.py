"""Serving a language model: a Triton repository whose end-to-end models carry the export (its
graph writes its cache in place, which a stateless graph model cannot keep), the answers of
batched, chat and stop requests, and a real server streaming them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.helpers import causal_folders
from tests.helpers.serving_clients import ask_concurrently, stream_pieces

pytest.importorskip("transformers")
from edgeattn.errors import ConfigError, EdgeattnError  # noqa: E402
from edgeattn.runtime import load  # noqa: E402
from edgeattn.runtime.manifest import read_manifest  # noqa: E402
from edgeattn.serving.repository import RepositoryOptions, write_repository  # noqa: E402
from edgeattn.serving.tasks import answer  # noqa: E402
from edgeattn.serving.triton_backend import served_model  # noqa: E402

PROMPTS = ["the sea is", "write a haiku about the sea", "hello", "waves fold over the sand under"]
HELLO = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello how are you"}]


@pytest.fixture(scope="module")
def lm_export(tmp_path_factory) -> Path:
    """A trained Llama with a tokenizer and ChatML template, exported at fp32 and int8 (gated)."""
    return causal_folders.export_trained(tmp_path_factory.mktemp("served-lm"), "int8")


def _texts(*texts: str) -> np.ndarray:
    return np.array([[t.encode()] for t in texts], dtype=object)


def _flag(value: bool) -> np.ndarray:
    return np.array([[value]], dtype=bool)


def _parse(path: Path):
    from google.protobuf import text_format

    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")

    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_the_repository_carries_the_export_at_its_precision(lm_export, tmp_path, precision):
    """No graph model (the cache is written in place); the end-to-end and streaming models read one
    carried copy of the export's files at the served precision, which loads as an export does."""
    repo = write_repository(lm_export, tmp_path / "repo", RepositoryOptions(precision=precision, max_batch_size=4))
    assert repo.task == "complete" and repo.models == {"lm": "python", "lm_stream": "python"}
    carried = repo.path / "lm" / "1" / "export"
    manifest = read_manifest(carried)
    entry = manifest.entry("causal_decoder", precision)
    on_disk = {p.name for p in carried.iterdir()}
    assert on_disk == {"manifest.json", "tokenizer.json", "chat_template.json", entry.file,
                       *(d.file for d in entry.external_data)}  # fmt: skip
    assert set(manifest.graphs["causal_decoder"].precisions) == ({precision} - {"fp32"})
    assert set(manifest.gates) == ({precision} - {"fp32"}) and manifest.stop_ids == read_manifest(lm_export).stop_ids
    ops = {n.op_type for n in onnx.load(str(carried / entry.file), load_external_data=False).graph.node}
    if precision == "int8":  # 8-bit blocks, each row's activations quantised per block: no batch-wide scale
        assert "DynamicQuantizeLinear" not in ops and "MatMulNBits" in ops
        assert entry.quantization["bits"] == 8 and "activation_scales" not in entry.quantization
    for name in ("lm", "lm_stream"):
        settings = json.loads((repo.path / name / "1" / "edgeattn.json").read_text())
        assert settings["export"] == "lm/1/export" and settings["graph_models"] == {}
        config = (repo.path / name / "config.pbtxt").read_text()
        assert 'string_value: "in-process"' in config and ("decoupled: true" in config) == (name == "lm_stream")
        parsed = _parse(repo.path / name / "config.pbtxt")  # Triton's own schema
        assert {"text", "chat", "stop", "repetition_penalty", "max_new_tokens"} <= {t.name for t in parsed.input}
        assert {t.name for t in parsed.output} == {"answer", "tokens"}
    model, _ = served_model(repo.path / "lm_stream" / "1", "in-process", 4)
    reference = load(lm_export, precision=precision)
    assert model.stop_ids == reference.stop_ids and model.chat_template is not None
    if precision == "fp32":
        assert model.generate_text(PROMPTS, 16) == reference.generate_text(PROMPTS, 16)


def test_a_written_repository_runs_where_edgeattn_is_not_installed(lm_export, tmp_path):
    """As in Triton's container (numpy, onnxruntime and tokenizers only): the carried export runs
    from the model's own vendor folder, its int8 cache included, and answers as the runtime does."""
    from tests.helpers.without_edgeattn import vendored_answers

    repo = write_repository(lm_export, tmp_path / "repo", RepositoryOptions(precision="int8"))
    got = vendored_answers(repo.path / repo.name / "1", PROMPTS[:2], "answer", {"max_new_tokens": 8})
    assert got == [a.encode() for a in load(lm_export, precision="int8").generate_text(PROMPTS[:2], 8)]


def test_bls_is_refused_and_a_bad_carried_file_is_found(lm_export, tmp_path):
    with pytest.raises(ConfigError, match="a cache written in place.*drop --graphs bls"):
        write_repository(lm_export, tmp_path / "bls", RepositoryOptions(graphs="bls"))
    repo = write_repository(lm_export, tmp_path / "repo", RepositoryOptions())
    path = repo.path / "lm" / "1" / "export" / "tokenizer.json"
    path.write_text(path.read_text().replace("the", "tha"))
    with pytest.raises(EdgeattnError, match="tokenizer.json does not match its manifest sha256"):
        served_model(repo.path / "lm" / "1", "in-process", 4)


@pytest.fixture(scope="module")
def served(lm_export, tmp_path_factory):
    """(the int8 repository's model as the server loads it, the export loaded by the runtime)."""
    repo = tmp_path_factory.mktemp("served") / "repo"
    write_repository(lm_export, repo, RepositoryOptions(precision="int8", max_batch_size=8))
    return served_model(repo / "lm" / "1", "in-process", 8)[0], load(repo / "lm" / "1" / "export", precision="int8")


def test_answers_do_not_depend_on_batch_mates(served, lm_export):
    """The served int8 graph (a language model's: 8-bit blocks, each row's activations quantised
    per block, no batch-wide scale) gives a prompt the same logits alone and left-padded among
    others, as the export's own graph does."""
    model, _ = served
    ids, mask = model.encode_prompts(PROMPTS)
    batched = model.next_token_logits(ids, mask)[:, -1]
    exported = load(lm_export, precision="int8")
    for i, prompt in enumerate(PROMPTS):
        alone = model.next_token_logits(*model.encode_prompts([prompt]))[0, -1]
        np.testing.assert_allclose(alone, batched[i], atol=1e-5)  # float32 noise of other shapes only
        np.testing.assert_allclose(exported.next_token_logits(*exported.encode_prompts([prompt]))[0, -1],
                                   batched[i], atol=1e-5)  # fmt: skip
    alone = [answer(model, "complete", [{"text": _texts(p)}])[0] for p in PROMPTS]
    together = answer(model, "complete", [{"text": _texts(p)} for p in PROMPTS])
    mixed = answer(model, "complete", [{"text": _texts(*PROMPTS[::-1])}])[0]
    assert any(len(own["answer"][0, 0]) > 0 for own in alone)  # something was generated
    for i, own in enumerate(alone):
        assert together[i]["answer"].tolist() == own["answer"].tolist()
        np.testing.assert_array_equal(together[i]["tokens"], own["tokens"])
        assert mixed["answer"][len(PROMPTS) - 1 - i, 0] == own["answer"][0, 0]
        assert own["answer"][0, 0].decode() == model.generate_text(PROMPTS[i])[0]


def test_chat_stop_and_settings_requests_answer_as_the_runtime(served):
    model, reference = served
    plain, conversation, one_message, stopped, penalised, bad_json, sampled = answer(model, "complete", [
        {"text": _texts(PROMPTS[1])},
        {"text": _texts(json.dumps(HELLO)), "chat": _flag(True)},
        {"text": _texts("hello how are you"), "chat": _flag(True), "max_new_tokens": np.array([[12]], np.int32)},
        {"text": _texts(PROMPTS[1]), "stop": _texts(json.dumps([" the", "zzz"]))},
        {"text": _texts(PROMPTS[1]), "repetition_penalty": np.array([[1.8]], np.float32)},
        {"text": _texts("[{not json"), "chat": _flag(True)},
        {"text": _texts(PROMPTS[0]), "strategy": _texts("sample"), "seed": np.array([[7]], np.int64),
         "temperature": np.array([[0.8]], np.float32)},
    ])  # fmt: skip
    text = reference.generate_text(PROMPTS[1])[0]
    assert plain["answer"][0, 0].decode() == text
    assert conversation["answer"][0, 0].decode() == reference.chat(HELLO)
    asked = [{"role": "user", "content": "hello how are you"}]
    assert one_message["answer"][0, 0].decode() == reference.chat(asked, 12)
    assert stopped["answer"][0, 0].decode() == reference.generate_text(PROMPTS[1], stop=[" the", "zzz"])[0]
    if " the" in text:
        assert stopped["answer"][0, 0].decode() == text[: text.index(" the")]
    assert penalised["answer"][0, 0].decode() == reference.generate_text(PROMPTS[1], repetition_penalty=1.8)[0]
    assert isinstance(bad_json, EdgeattnError) and "JSON messages" in str(bad_json)
    want = reference.generate_text(PROMPTS[0], strategy="sample", seed=7, temperature=0.8)[0]
    assert sampled["answer"][0, 0].decode() == want


# ------------------------------------------------------------------------------ a real server
@pytest.mark.slow
def test_a_real_server_answers_and_streams_a_language_model(lm_export, tmp_path):
    pytest.importorskip("pytriton")
    pytest.importorskip("tritonclient.http")
    import tritonclient.grpc as grpc
    import tritonclient.http as http

    from edgeattn.serving.triton_server import TritonServer

    repo = write_repository(lm_export, tmp_path / "repo", RepositoryOptions(precision="int8",
                                                                              max_queue_delay_us=20000))  # fmt: skip
    # what the server runs: the carried export, its int8 scaling each token's activations alone (the
    # export's own graph, one scale a batch, answers a long chat differently on a VNNI machine)
    reference = load(repo.path / "lm" / "1" / "export", precision="int8")
    with TritonServer(repo.path, ["lm", "lm_stream"], log_file=tmp_path / "server.log") as server:
        expected = {p: served_answer for p, served_answer in
                    zip(PROMPTS, answer(served_model(repo.path / "lm" / "1", "in-process", 8)[0], "complete",
                                        [{"text": _texts(p)} for p in PROMPTS]), strict=True)}  # fmt: skip

        got = ask_concurrently(server, "lm", PROMPTS, requests=24, threads=8)
        assert all(text == expected[p]["answer"][0, 0].decode() for p, text in got)
        stats = http.InferenceServerClient(server.http_url).get_inference_statistics("lm")["model_stats"][0]
        assert max(int(b["batch_size"]) for b in stats["batch_stats"]) > 1  # requests were batched
        pieces = _stream(grpc, server.grpc_url, json.dumps(HELLO), chat=True)
        assert len(pieces) > 1 and "".join(pieces) == reference.chat(HELLO)
        pieces = _stream(grpc, server.grpc_url, PROMPTS[1], stop='[" the"]')
        assert "".join(pieces) == reference.generate_text(PROMPTS[1], stop=[" the"])[0]
        error = _stream(grpc, server.grpc_url, "[{not json", chat=True)
        assert len(error) == 1 and error[0].startswith("ERROR") and "JSON messages" in error[0]


def _stream(grpc, url: str, text: str, chat: bool = False, stop: str | None = None) -> list[str]:
    """The pieces ``lm_stream`` sends for one text ("ERROR ..." for an error)."""
    inputs = {"text": _texts(text)}
    if chat:
        inputs["chat"] = _flag(True)
    if stop is not None:
        inputs["stop"] = _texts(stop)
    return stream_pieces(url, "lm_stream", inputs)


def test_load_requests_carry_settings_of_the_declared_types():
    from edgeattn.serving.traffic import request_settings

    found = request_settings("complete", {"max_new_tokens": 32, "stop": "\n", "chat": True, "top_p": 0.9})
    assert {k: (v.dtype, v.shape) for k, v in found.items()} == {
        "max_new_tokens": (np.int32, (1, 1)), "stop": (np.object_, (1, 1)), "chat": (np.bool_, (1, 1)),
        "top_p": (np.float32, (1, 1))}  # fmt: skip
    assert found["stop"][0, 0] == b"\n"
    with pytest.raises(EdgeattnError, match="a classify request takes no setting 'max_new_tokens'"):
        request_settings("classify", {"max_new_tokens": 4})
