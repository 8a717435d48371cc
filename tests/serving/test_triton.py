"""Triton model repositories (``edgeattn triton``) and a real Triton server (``edgeattn serve``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgeattn.errors import ConfigError, EdgeattnError
from edgeattn.exporters.export import export_model
from edgeattn.runtime import load
from edgeattn.serving.repository import RepositoryOptions, write_repository
from edgeattn.serving.tasks import answer, task_inputs, task_outputs
from edgeattn.sources import resolve_model
from tests.helpers.serving_clients import ask_concurrently, stream_pieces, text_tensor

CPU = ["CPUExecutionProvider"]
ONNX_TYPES = {"TYPE_FP32": onnx.TensorProto.FLOAT, "TYPE_FP16": onnx.TensorProto.FLOAT16,
              "TYPE_INT64": onnx.TensorProto.INT64, "TYPE_INT32": onnx.TensorProto.INT32}  # fmt: skip
SOURCES = ["3 1 2", "9 8 7 6 5", "4 4 1", "7", "2 9 0 5 5 1 3", "8 6"]


@pytest.fixture(scope="module")
def demo_export(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "sorter"
    source = resolve_model()
    precisions = ["fp32-opt", "int8", "int8-static", "fp16"]
    export_model(source.model, out, precisions=precisions, verify=False, tokenizer=source.tokenizer, task=source.task)
    return out


def _parse(path: Path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def _types(config) -> dict[int, str]:
    from tritonclient.grpc import model_config_pb2

    return {v: k for k, v in model_config_pb2.DataType.items()}


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "fp32-opt", "int8", "int8-static", "fp16"])
def test_every_config_parses_with_tritons_schema_and_matches_its_onnx_file(demo_export, tmp_path, precision):
    pytest.importorskip("tritonclient.grpc")
    repo = write_repository(demo_export, tmp_path / "repo", RepositoryOptions(precision=precision, max_batch_size=4))
    assert repo.task == "generate" and set(repo.models) == {
        "sorter", "sorter_stream", "sorter_encoder", "sorter_cross_kv", "sorter_decoder"}  # fmt: skip
    manifest_config = load(demo_export, providers=CPU).config
    for name, backend in repo.models.items():
        config = _parse(tmp_path / "repo" / name / "config.pbtxt")
        names = _types(config)
        assert config.name == name and config.backend == backend and config.max_batch_size == 4
        assert config.dynamic_batching.max_queue_delay_microseconds == 1000
        if backend == "python":
            expected_in = task_inputs("generate")
            assert [(t.name, names[t.data_type], list(t.dims), t.optional) for t in config.input] == [
                (t.name, t.triton_type, list(t.dims), t.optional) for t in expected_in]  # fmt: skip
            assert [t.name for t in config.output] == [t.name for t in task_outputs("generate", manifest_config)]
            assert config.model_transaction_policy.decoupled == name.endswith("_stream")
            continue
        graph = onnx.load(str(tmp_path / "repo" / name / "1" / "model.onnx"), load_external_data=False)
        for declared, actual in ((config.input, graph.graph.input), (config.output, graph.graph.output)):
            assert [t.name for t in declared] == [v.name for v in actual]
            for t, v in zip(declared, actual, strict=True):
                tensor = v.type.tensor_type
                assert ONNX_TYPES[names[t.data_type]] == tensor.elem_type, t.name
                assert len(t.dims) + 1 == len(tensor.shape.dim), t.name  # the batch axis is Triton's
                for dim, onnx_dim in zip(t.dims, tensor.shape.dim[1:], strict=True):
                    assert dim == (onnx_dim.dim_value if onnx_dim.HasField("dim_value") else -1), t.name
        assert len(config.model_warmup) == 1 and config.model_warmup[0].batch_size == 1
        for key, value in config.model_warmup[0].inputs.items():
            if value.input_data_file:
                data = (tmp_path / "repo" / name / "warmup" / value.input_data_file).read_bytes()
                assert len(data) == 8 * int(np.prod(value.dims)) and key.endswith("mask")


def test_gpu_settings_and_refusals(demo_export, tmp_path):
    pytest.importorskip("tritonclient.grpc")
    options = RepositoryOptions(kind="gpu", accelerator="tensorrt", fp16=True, instances=2, max_batch_size=0)
    write_repository(demo_export, tmp_path / "gpu", options)
    encoder = _parse(tmp_path / "gpu" / "sorter_encoder" / "config.pbtxt")
    assert encoder.instance_group[0].kind == encoder.instance_group[0].KIND_GPU
    assert encoder.instance_group[0].count == 2 and not encoder.HasField("dynamic_batching")
    accelerator = encoder.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "FP16"
    assert [len(t.dims) for t in encoder.input] == [2, 2]  # no batching: the batch axis is a dim
    python = _parse(tmp_path / "gpu" / "sorter" / "config.pbtxt")
    assert python.instance_group[0].kind == python.instance_group[0].KIND_CPU
    with pytest.raises(ConfigError, match="--fp16 sets TensorRT"):
        RepositoryOptions(kind="gpu", accelerator="cuda", fp16=True).check()
    with pytest.raises(ConfigError, match="needs --kind gpu"):
        RepositoryOptions(accelerator="cuda").check()
    with pytest.raises(ConfigError, match="where those graphs are fp32: serve --precision fp32"):
        RepositoryOptions(precision="bf16").check()  # OpenVINO's bfloat16 is not what Triton's backend runs
    with pytest.raises(EdgeattnError, match="not empty"):
        write_repository(demo_export, tmp_path / "gpu", RepositoryOptions())
    with pytest.raises(EdgeattnError, match="was not exported at precision 'int4'"):
        write_repository(demo_export, tmp_path / "int4", RepositoryOptions(precision="int4"))
    with pytest.raises(EdgeattnError, match="cannot serve task 'tag'"):
        write_repository(demo_export, tmp_path / "tag", RepositoryOptions(task="tag"))


# ------------------------------------------------------------------- the Python-backend model, BLS
class _FakeTriton:
    """``triton_python_backend_utils`` as Triton gives it to a Python model, its BLS calls run on
    the repository's ONNX files: what the end-to-end model does is checked without a server."""

    def __init__(self, repo: Path, max_batch: int) -> None:
        import onnxruntime as ort

        self.sessions: dict[str, ort.InferenceSession] = {}
        self.calls: list[tuple[str, int]] = []
        self.repo, self.max_batch = repo, max_batch
        module = types.ModuleType("triton_python_backend_utils")
        module.Tensor = self.Tensor
        module.InferenceRequest = self._request_class()
        module.InferenceResponse = self.Response
        module.TritonError = self.Error
        module.get_input_tensor_by_name = lambda r, n: r.inputs.get(n)
        module.get_output_tensor_by_name = lambda r, n: r.outputs.get(n)
        self.module = module

    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, array

        def as_numpy(self):
            return self.array

    class Error:
        def __init__(self, message):
            self._message = message

        def message(self):
            return self._message

    class Response:
        def __init__(self, output_tensors, error=None):
            self.outputs = {t.name: t for t in output_tensors}
            self._error = error

        def has_error(self):
            return self._error is not None

        def error(self):
            return self._error

    def _request_class(self):
        fake = self

        class InferenceRequest:
            def __init__(self, model_name, requested_output_names, inputs):
                self.model_name, self.names, self.inputs = model_name, requested_output_names, inputs

            def exec(self):
                import onnxruntime as ort

                rows = self.inputs[0].array.shape[0]
                fake.calls.append((self.model_name, rows))
                if rows > fake.max_batch:
                    return fake.Response([], fake.Error(f"batch {rows} over max_batch_size {fake.max_batch}"))
                if self.model_name not in fake.sessions:
                    path = fake.repo / self.model_name / "1" / "model.onnx"
                    fake.sessions[self.model_name] = ort.InferenceSession(str(path), providers=CPU)
                outs = fake.sessions[self.model_name].run(self.names, {t.name: t.array for t in self.inputs})
                return fake.Response([fake.Tensor(n, o) for n, o in zip(self.names, outs, strict=True)])

        return InferenceRequest


class _Request:
    def __init__(self, **inputs):
        self.inputs = {k: _FakeTriton.Tensor(k, v) for k, v in inputs.items()}


def test_the_python_model_runs_the_graphs_through_bls_as_the_runtime_does(demo_export, tmp_path, monkeypatch):
    write_repository(demo_export, tmp_path / "repo", RepositoryOptions(max_batch_size=2))
    fake = _FakeTriton(tmp_path / "repo", max_batch=2)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake.module)
    from edgeattn.serving.triton_backend import TritonPythonModel

    model = TritonPythonModel()
    config = (tmp_path / "repo" / "sorter" / "config.pbtxt").read_text()
    model.initialize({"model_config": json.dumps({"max_batch_size": 2, "parameters": {}}),
                      "model_repository": str(tmp_path / "repo" / "sorter"), "model_version": "1"})  # fmt: skip
    assert 'string_value: "bls"' in config
    reference = load(demo_export, providers=CPU)
    requests = [_Request(text=text_tensor(SOURCES[0])), _Request(text=text_tensor(SOURCES[1], SOURCES[2])),
                _Request(text=text_tensor("3 x")),
                _Request(text=text_tensor(SOURCES[3]), strategy=np.array([[b"beam"]], object),
                                                      num_beams=np.array([[3]], np.int32))]  # fmt: skip
    responses = model.execute(requests)
    assert [r.outputs["answer"].array[:, 0].tolist() for r in responses[:2]] == [
        [a.encode() for a in reference.generate_text([SOURCES[0]])],
        [a.encode() for a in reference.generate_text(SOURCES[1:3])],
    ]
    assert responses[2].has_error() and "unknown token" in responses[2].error().message()
    beam = reference.generate_text([SOURCES[3]], strategy="beam", num_beams=3)
    assert responses[3].outputs["answer"].array[0, 0].decode() == beam[0]
    assert {m for m, _ in fake.calls} == {"sorter_encoder", "sorter_cross_kv", "sorter_decoder"}
    assert max(rows for _, rows in fake.calls) == 2  # 3 beams went to the decoder in parts of 2


def test_answers_and_errors_per_request(demo_export):
    model = load(demo_export, providers=CPU)
    requests = [{"text": text_tensor(SOURCES[0])}, {"nothing": np.zeros(1)},
                {"text": text_tensor(SOURCES[4], SOURCES[5])},
                {"text": np.array([[b"\xff"]], object)}]  # fmt: skip
    results = answer(model, "generate", requests)
    assert isinstance(results[1], EdgeattnError) and "no 'text' input" in str(results[1])
    assert isinstance(results[3], EdgeattnError) and "not UTF-8" in str(results[3])
    alone = [answer(model, "generate", [{"text": text_tensor(s)}])[0] for s in (SOURCES[0], SOURCES[4], SOURCES[5])]
    assert results[0]["answer"].tolist() == alone[0]["answer"].tolist()
    assert results[2]["answer"][:, 0].tolist() == [alone[1]["answer"][0, 0], alone[2]["answer"][0, 0]]
    np.testing.assert_array_equal(results[0]["tokens"], alone[0]["tokens"])  # no columns from batch-mates


# ------------------------------------------------------------------------------ a real server
def _server_or_skip():
    pytest.importorskip("pytriton")
    pytest.importorskip("tritonclient.http")
    from edgeattn.serving.triton_server import TritonServer

    return TritonServer


@pytest.mark.slow
def test_a_real_server_batches_concurrent_requests_and_answers_as_the_runtime(demo_export, tmp_path):
    server_class = _server_or_skip()
    import tritonclient.grpc as grpc
    import tritonclient.http as http

    repo = write_repository(demo_export, tmp_path / "repo", RepositoryOptions(graphs="in-process",
                                                                                max_queue_delay_us=20000))  # fmt: skip
    reference = load(demo_export, providers=CPU)
    expected = {s: reference.generate_text([s])[0] for s in SOURCES}
    with server_class(repo.path, ["sorter", "sorter_stream"], log_file=tmp_path / "server.log") as server:
        got = ask_concurrently(server, "sorter", SOURCES, requests=48, threads=16)
        assert all(answer_ == expected[source] for source, answer_ in got)
        client = http.InferenceServerClient(server.http_url)
        stats = client.get_inference_statistics("sorter")["model_stats"][0]
        sizes = {int(b["batch_size"]) for b in stats["batch_stats"]}
        assert max(sizes) > 1, sizes
        bad = http.InferInput("text", [1, 1], "BYTES")
        bad.set_data_from_numpy(text_tensor("3 x 1"))
        with pytest.raises(Exception, match="unknown token"):
            client.infer("sorter", [bad])
        with pytest.raises(Exception, match="unexpected inference input|expected 1 inputs|text"):
            wrong = http.InferInput("texts", [1, 1], "BYTES")
            wrong.set_data_from_numpy(text_tensor("3 1"))
            client.infer("sorter", [wrong])
        assert ask_concurrently(server, "sorter", SOURCES[1:2], requests=1, threads=1)[0][1] == expected[SOURCES[1]]
        assert "nv_inference_request_success" in _get(server.metrics_url)
        pieces = _stream(grpc, server.grpc_url, SOURCES[4])
        assert len(pieces) > 1 and "".join(pieces) == expected[SOURCES[4]]
        beam = _stream(grpc, server.grpc_url, SOURCES[4], strategy="beam", num_beams=3)
        assert "".join(beam) == reference.generate_text([SOURCES[4]], strategy="beam", num_beams=3)[0]


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _stream(grpc, url: str, source: str, strategy: str | None = None, num_beams: int | None = None) -> list[str]:
    """The pieces ``sorter_stream`` sends for one text."""
    inputs = {"text": text_tensor(source)}
    if strategy is not None:
        inputs["strategy"] = np.array([[strategy.encode()]], dtype=object)
    if num_beams is not None:
        inputs["num_beams"] = np.array([[num_beams]], np.int32)
    return stream_pieces(url, "sorter_stream", inputs)


def _line_with(process: subprocess.Popen, word: str, timeout: float) -> str:
    """The first line of ``process``'s standard output holding ``word``, waiting up to ``timeout`` s
    (empty if none came)."""
    import select

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([process.stdout], [], [], 0.5)[0]:
            line = process.stdout.readline()
            if word in line:
                return line
            if not line:  # the output ended
                return ""
    return ""


@pytest.mark.slow
def test_edgeattn_serve_serves_until_interrupted(demo_export, tmp_path):
    server_class = _server_or_skip()
    import tritonclient.http as http

    from edgeattn.serving.triton_server import free_port

    ports = [free_port() for _ in range(3)]
    cmd = [sys.executable, "-m", "edgeattn.cli", "serve", str(demo_export), "--port", str(ports[0]),
           "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), "--name", "sort"]  # fmt: skip
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        client = http.InferenceServerClient(f"127.0.0.1:{ports[0]}")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if client.is_model_ready("sort"):
                    break
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            time.sleep(0.5)
        text = http.InferInput("text", [1, 1], "BYTES")
        text.set_data_from_numpy(text_tensor("5 4 3"))
        assert client.infer("sort", [text]).as_numpy("answer")[0, 0] == b"3 4 5"
        assert server_class is not None
        # the server can answer before the command's own readiness poll (every 0.25 s) has said
        # "serving"; an interrupt then is one during start-up, a case checked below
        said = _line_with(process, "serving", timeout=30)
    finally:
        process.send_signal(2)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "serving sort, sort_stream" in said and "stopping" in out
    early = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)  # interrupted while it writes the repository or the server starts
    early.send_signal(2)
    out, err = early.communicate(timeout=60)
    assert early.returncode in (0, 1) and ("stopping" in out or "aborted" in err), (out, err)
    with pytest.raises(Exception):  # noqa: B017 - nothing listens any more
        http.InferenceServerClient(f"127.0.0.1:{ports[0]}").is_server_live()


# ------------------------------------------------------------------ answers independent of batching
def _encoder_rows(path: Path, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=CPU)
    return session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask})[0]


def test_served_int8_graphs_give_a_row_the_same_result_in_any_batch(demo_export, tmp_path):
    from edgeattn.runtime.manifest import read_manifest

    repo = write_repository(demo_export, tmp_path / "repo", RepositoryOptions(precision="int8"))
    settings = json.loads((repo.path / "sorter" / "1" / "edgeattn.json").read_text())
    assert settings["row_independent_int8"]["encoder"]["per_tensor_left"] == 0
    assert "own scale" in (repo.path / "README.md").read_text()
    rng = np.random.default_rng(5)
    ids = rng.integers(3, 12, (4, 14)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1:, 6:] = 0  # shorter batch-mates, padded
    fp32 = _encoder_rows(demo_export / "encoder.onnx", ids, mask)
    per_tensor = demo_export / read_manifest(demo_export).entry("encoder", "int8").file
    served = repo.path / "sorter_encoder" / "1" / "model.onnx"
    for path, independent in ((per_tensor, False), (served, True)):
        batched = _encoder_rows(path, ids, mask)
        alone = _encoder_rows(path, ids[:1], mask[:1])
        gap = float(np.abs(batched[0] - alone[0]).max())
        assert (gap == 0.0) == independent, (path.name, gap)  # the per-tensor graph shows the test can fail
        cosine = (batched * fp32).sum(-1) / np.linalg.norm(batched, axis=-1) / np.linalg.norm(fp32, axis=-1)
        assert cosine[mask == 1].min() > 0.999


@pytest.mark.parametrize("precision", ["fp32", "int8", "int8-static", "fp16"])
def test_served_answers_do_not_depend_on_batch_mates(demo_export, tmp_path, precision):
    from edgeattn.serving.triton_backend import served_model

    write_repository(demo_export, tmp_path / "repo", RepositoryOptions(precision=precision, graphs="in-process"))
    model, _ = served_model(tmp_path / "repo" / "sorter" / "1", "in-process", 8)
    alone = [answer(model, "generate", [{"text": text_tensor(s)}])[0] for s in SOURCES]
    together = answer(model, "generate", [{"text": text_tensor(s)} for s in SOURCES])
    mixed = answer(model, "generate", [{"text": text_tensor(*SOURCES[::-1])}])[0]
    for i, own in enumerate(alone):
        assert together[i]["answer"].tolist() == own["answer"].tolist()
        np.testing.assert_array_equal(together[i]["tokens"], own["tokens"])
        assert mixed["answer"][len(SOURCES) - 1 - i, 0] == own["answer"][0, 0]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["tag", "classify"])
def test_served_labels_and_entities_do_not_depend_on_batch_mates(tmp_path, task):
    pytest.importorskip("transformers")
    from edgeattn.serving.triton_backend import served_model
    from tests.helpers.encoder_folders import BERT_SPECIALS, TEXTS, make_checkpoint, make_tokenizer

    head = "ForTokenClassification" if task == "tag" else "ForSequenceClassification"
    make_checkpoint("Bert", head).save_pretrained(tmp_path / "hf")
    make_tokenizer(*BERT_SPECIALS).save_pretrained(tmp_path / "hf")
    source = resolve_model(from_hf=tmp_path / "hf")
    export_model(source.model, tmp_path / "out", graphs=["encoder"], tokenizer=source.tokenizer, task=source.task,
                 labels=source.labels, precisions=["int8"], verify=False)  # fmt: skip
    texts = [*TEXTS, "Paris.", "Ada Lovelace visited Warsaw and London and Paris in May with Angela Merkel."]
    output = "entities" if task == "tag" else "label"
    for precision in ("fp32", "int8"):
        repo = tmp_path / f"repo-{precision}"
        write_repository(tmp_path / "out", repo, RepositoryOptions(precision=precision, graphs="in-process"))
        model, _ = served_model(repo / "out" / "1", "in-process", 8)
        alone = [answer(model, task, [{"text": text_tensor(t)}])[0][output][0, 0] for t in texts]
        together = answer(model, task, [{"text": text_tensor(*texts)}])[0][output][:, 0].tolist()
        assert together == alone, precision
        if task == "tag":
            assert any(json.loads(a) for a in alone)  # entities were found, so spans were compared


def test_a_written_repository_runs_where_edgeattn_is_not_installed(demo_export, tmp_path):
    """As in Triton's container (numpy, onnxruntime and tokenizers only): the written model.py
    imports from its own vendor folder, and the served model answers as the runtime does."""
    from tests.helpers.without_edgeattn import vendored_answers

    write_repository(demo_export, tmp_path / "repo", RepositoryOptions(precision="int8"))
    got = vendored_answers(tmp_path / "repo" / "sorter" / "1", SOURCES[:2], "answer")
    assert got == [a.encode() for a in load(demo_export, precision="int8").generate_text(SOURCES[:2])]


def test_an_encoders_repository_runs_where_edgeattn_is_not_installed(tmp_path):
    """The encoder family's repository (a classifier: ONNX Runtime backend graph, Python model around
    it) imports from its vendor folder alone and labels as the runtime does."""
    pytest.importorskip("transformers")
    from tests.helpers.encoder_folders import BERT_SPECIALS, TEXTS, make_checkpoint, make_tokenizer
    from tests.helpers.without_edgeattn import vendored_answers

    make_checkpoint("Bert", "ForSequenceClassification").save_pretrained(tmp_path / "hf")
    make_tokenizer(*BERT_SPECIALS).save_pretrained(tmp_path / "hf")
    source = resolve_model(from_hf=tmp_path / "hf")
    export_model(source.model, tmp_path / "out", graphs=["encoder"], tokenizer=source.tokenizer, task=source.task,
                 labels=source.labels, verify=False)  # fmt: skip
    repo = write_repository(tmp_path / "out", tmp_path / "repo", RepositoryOptions(graphs="in-process"))
    got = vendored_answers(repo.path / repo.name / "1", TEXTS, "label")
    assert got == [c.label.encode() for c in load(tmp_path / "out").classify(TEXTS)]


def test_writing_and_serving_need_no_torch(demo_export, tmp_path):
    code = (
        "import sys\n"
        "from edgeattn.cli import main\n"
        "from edgeattn.serving.repository import RepositoryOptions, write_repository\n"
        "import edgeattn.serving.triton_backend, edgeattn.serving.triton_server\n"
        f"write_repository({str(demo_export)!r}, {str(tmp_path / 'repo')!r}, RepositoryOptions())\n"
        "from edgeattn.serving.triton_backend import served_model\n"
        f"model, _ = served_model(__import__('pathlib').Path({str(tmp_path / 'repo' / 'sorter' / '1')!r}), "
        "'in-process', 8)\n"
        "assert model.generate_text(['3 1 2']) == ['1 2 3']\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
