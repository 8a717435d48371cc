"""The Python-backend model of a Triton repository written by ``edgeattn triton``: the task end
to end, text in and answers out.

Its graphs run either as the repository's ONNX Runtime backend models, called through Triton's
business logic scripting (``graphs: "bls"``, the default: each graph batched and placed by
Triton), or in this process (``graphs: "in-process"``: the same ONNX files through ONNX Runtime,
for a server without the ONNX Runtime backend); a language model, whose graph keeps its cache in
place, runs the export the repository carries for it (``export``) in this process. Either way the
edgeattn runtime's own decoding and text handling run over them, so answers match ``edgeattn
run``. A ``decoupled`` model streams each generated piece of text as its own response. Torch-free; imports Triton's
``triton_python_backend_utils`` only inside the server.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.config import ModelConfig
from edgeattn.errors import EdgeattnError
from edgeattn.runtime.exported_model import ExportedModel
from edgeattn.runtime.layout import TRITON_SETTINGS
from edgeattn.runtime.manifest import EmbeddingPooling
from edgeattn.runtime.session import CPU, create_session
from edgeattn.runtime.tokenizer import load_tokenizer
from edgeattn.serving.tasks import (
    answer,
    decoding,
    generation_options,
    prompts,
    request_texts,
    task_inputs,
    task_outputs,
)

log = logging.getLogger(__name__)


def _pb() -> Any:
    import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

    return pb_utils


class BlsSession:
    """One graph served by another model of the same Triton server, called as an ONNX Runtime
    session is (``run(output_names, feeds)``); batches over ``max_batch`` rows go in parts."""

    def __init__(self, model_name: str, max_batch: int) -> None:
        self.model_name = model_name
        self.max_batch = max_batch

    def get_providers(self) -> list[str]:
        return [f"triton:{self.model_name}"]

    def run(self, output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        rows = next(iter(feeds.values())).shape[0]
        step = self.max_batch if self.max_batch > 0 else rows
        if rows <= step:
            return self._call(output_names, feeds)
        parts = [self._call(output_names, {k: v[i : i + step] for k, v in feeds.items()}) for i in range(0, rows, step)]
        return [np.concatenate([p[j] for p in parts]) for j in range(len(output_names))]

    def _call(self, output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        pb = _pb()
        inputs = [pb.Tensor(name, np.ascontiguousarray(value)) for name, value in feeds.items()]
        request = pb.InferenceRequest(model_name=self.model_name, requested_output_names=list(output_names),
                                      inputs=inputs)  # fmt: skip
        response = request.exec()
        if response.has_error():
            raise EdgeattnError(f"model {self.model_name}: {response.error().message()}")
        return [pb.get_output_tensor_by_name(response, name).as_numpy() for name in output_names]


def served_model(version_dir: Path, graphs: str, max_batch: int) -> tuple[ExportedModel, dict[str, Any]]:
    """The runtime model the settings in ``version_dir`` describe, its graphs run as ``graphs`` says."""
    settings = json.loads((version_dir / TRITON_SETTINGS).read_text(encoding="utf-8"))
    config = ModelConfig.from_dict(settings["config"])
    repo = version_dir.parent.parent
    if settings.get("export"):  # graphs that keep state: only this process can run them
        from edgeattn.runtime import load

        if graphs != "in-process":
            raise EdgeattnError(f"this model's graphs keep their cache in place and run in-process, not {graphs!r}")
        return load(repo / settings["export"], providers=[CPU], precision=settings["precision"]), settings
    if graphs == "bls":
        sessions: dict[str, Any] = {g: BlsSession(m, max_batch) for g, m in settings["graph_models"].items()}
    elif graphs == "in-process":
        sessions = {}
        for graph, model_name in settings["graph_models"].items():
            path = repo / model_name / "1" / "model.onnx"
            if not path.is_file():
                raise EdgeattnError(f"graphs run in-process but {path} is missing")
            sessions[graph] = create_session(path, providers=[CPU])
    else:
        raise EdgeattnError(f"parameter graphs must be 'bls' or 'in-process', not {graphs!r}")
    pooling = EmbeddingPooling(**settings["pooling"]) if settings.get("pooling") else None
    model = ExportedModel.from_sessions(config, sessions, settings["precision"],
                                        load_tokenizer(version_dir / "tokenizer.json"), settings.get("labels"),
                                        pooling)  # fmt: skip
    return model, settings


class TritonPythonModel:
    """Triton's entry point (``model.py`` imports it)."""

    def initialize(self, args: dict[str, str]) -> None:
        model_config = json.loads(args["model_config"])
        version_dir = Path(args["model_repository"]) / args["model_version"]
        graphs = model_config.get("parameters", {}).get("graphs", {}).get("string_value", "bls")
        self.model, settings = served_model(version_dir, graphs, int(model_config.get("max_batch_size", 0)))
        self.task = settings["task"]
        self.decoupled = bool(settings["decoupled"])
        self.input_names = [t.name for t in task_inputs(self.task)]
        self.output_names = [t.name for t in task_outputs(self.task, self.model.config)]
        log.info("edgeattn %s model ready (%s, graphs %s)", self.task, settings["precision"], graphs)

    def _inputs(self, request: Any) -> dict[str, np.ndarray]:
        pb = _pb()
        found = {}
        for name in self.input_names:
            tensor = pb.get_input_tensor_by_name(request, name)
            if tensor is not None:
                found[name] = tensor.as_numpy()
        return found

    def execute(self, requests: list[Any]) -> list[Any] | None:
        pb = _pb()
        if self.decoupled:
            for request in requests:
                self._stream(request)
            return None
        results = answer(self.model, self.task, [self._inputs(r) for r in requests])
        responses = []
        for result in results:
            if isinstance(result, Exception):
                responses.append(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(str(result))))
            else:
                responses.append(
                    pb.InferenceResponse(output_tensors=[pb.Tensor(n, result[n]) for n in self.output_names])
                )
        return responses

    def _stream(self, request: Any) -> None:
        """One text's answer, a response per piece of text as it grows, then the final flag."""
        pb = _pb()
        sender = request.get_response_sender()
        try:
            inputs = self._inputs(request)
            texts = request_texts(inputs)
            if len(texts) != 1:
                raise EdgeattnError(f"a streamed request takes one text, not {len(texts)}")
            steps, options = decoding(generation_options(inputs, self.task))
            asked, options = prompts(texts, options)
            for piece in self.model.stream_text(asked[0], steps, **options):
                sender.send(pb.InferenceResponse(output_tensors=[
                    pb.Tensor("answer", np.array([[piece.encode("utf-8")]], dtype=np.object_)),
                    pb.Tensor("tokens", np.zeros((1, 0), np.int64)),
                ]))  # fmt: skip
        except (EdgeattnError, ValueError) as exc:
            sender.send(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(str(exc))))
        sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self) -> None:
        self.model = None  # type: ignore[assignment]
