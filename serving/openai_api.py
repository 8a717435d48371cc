"""An OpenAI-compatible HTTP API over exports (aiohttp): ``GET /v1/models``,
``POST /v1/chat/completions`` and ``/v1/completions`` for language models (continuous batching,
:mod:`edgeattn.serving.batching`), ``POST /v1/embeddings`` for encoders,
``POST /v1/audio/transcriptions`` and ``/v1/audio/translations`` for speech models (a multipart
upload). Errors are OpenAI's error objects with their HTTP status; an API key, when set, is
required as a bearer token."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.exported_model import InputError
from edgeattn.runtime.families import FAMILIES, resolve
from edgeattn.runtime.families.causal.tool_calls import ToolUse, history, template_format, tool_use
from edgeattn.runtime.precisions import FP32
from edgeattn.serving.batching import Batcher, Finished, Generation, Piece

log = logging.getLogger(__name__)

#: the largest JSON request body read (bytes)
MAX_BODY = 4 * 1024 * 1024
#: the largest audio upload (OpenAI's limit)
MAX_UPLOAD = 25 * 1024 * 1024
#: what a transcription answers in, by ``response_format``
AUDIO_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
#: the most stop strings, choices and top log-probabilities a request may ask for (OpenAI's limits)
MAX_STOP, MAX_N, MAX_TOP_LOGPROBS = 4, 8, 20
#: the most texts one embeddings request may give
MAX_INPUTS = 256


class ApiError(Exception):
    """An error answered as OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return web.json_response(body, status=self.status)


@dataclass
class Served:
    """One export the API serves, by name."""

    name: str
    model: Any
    created: int
    batcher: Batcher | None = None

    @property
    def generates(self) -> bool:
        return self.batcher is not None

    @property
    def does(self) -> str:
        """What its endpoints do, as its family's record says: ``generate`` (text), ``embed`` or ``transcribe``."""
        return self.model.family.api


#: what a family's exports are served as when the API generates text with them (``Family.api``)
GENERATE = "generate"


def served_names(exports: list[Path]) -> list[str]:
    """The names ``exports`` are served by (their directories'), refused where two are the same."""
    names: list[str] = []
    for path in exports:
        name = Path(path).resolve().name
        if name in names:
            raise EdgeattnError(f"two exports are named {name!r}; serve exports whose directories differ in name")
        names.append(name)
    return names


def refuse_unserved(family: Any, path: Path) -> None:
    """An EdgeattnError where ``family`` (a record) has no OpenAI endpoints."""
    if not family.api:
        served = [f.name for f in FAMILIES.values() if f.api]
        raise EdgeattnError(f"{path} is a {family.name} export; the OpenAI API serves {', '.join(served)} exports")


def served_models(exports: list[Path], max_rows: int, precision: str = FP32,
                  threads: int | None = None) -> dict[str, Served]:  # fmt: skip
    """Each export loaded at ``precision`` with ``threads`` (None: ONNX Runtime's choice), its
    directory's name the model's; a language model with its batcher."""
    from edgeattn.runtime import load

    models: dict[str, Served] = {}
    for name, path in zip(served_names(exports), exports, strict=True):
        model = load(path, precision=precision, threads=threads)
        refuse_unserved(model.family, path)
        batcher = Batcher(model, max_rows) if model.family.api == GENERATE else None
        models[name] = Served(name, model, int(path.stat().st_mtime), batcher)
    return models


# ------------------------------------------------------------------ fields
def _field(body: dict[str, Any], name: str, kinds: type | tuple[type, ...], default: Any = None,
           low: float | None = None, high: float | None = None) -> Any:  # fmt: skip
    value = body.get(name, default)
    if value is None:
        return default
    allowed = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, bool) and bool not in allowed or not isinstance(value, allowed):
        raise ApiError(400, f"{name} has the wrong type ({type(value).__name__})", name)
    if low is not None and value < low or high is not None and value > high:
        raise ApiError(400, f"{name} must be between {low} and {high}, got {value}", name)
    return value


def _texts(body: dict[str, Any], name: str) -> list[str]:
    """Field ``name``: a non-empty string or a non-empty list of them, as a list."""
    value = body.get(name)
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise ApiError(400, f"{name} is a non-empty string or a list of them", name)
    return texts


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP:
        raise ApiError(400, f"stop is a string or a list of at most {MAX_STOP} non-empty strings", "stop")
    return stops


UNSUPPORTED = {
    "functions": "functions is replaced by tools (the legacy field is not served)",
    "function_call": "function_call is replaced by tool_choice (the legacy field is not served)",
    "logit_bias": "logit_bias is not served yet",
}


def _conversation(messages: Any) -> list[dict[str, Any]]:
    """A request's ``messages`` checked: each a role and text content (or text parts), an
    assistant's earlier ``tool_calls``, a tool's ``tool_call_id``."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages is a non-empty list of {role, content} objects", "messages")
    conversation = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] needs a role", f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):  # parts: only text is served
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise ApiError(400, f"messages[{i}].content: only text parts are served", f"messages[{i}].content")
            content = "".join(p.get("text", "") for p in content)
        message: dict[str, Any] = {"role": m["role"], "content": content}
        calls = m.get("tool_calls")
        if m["role"] == "assistant" and calls:
            if not isinstance(calls, list) or not all(
                    isinstance(c, dict) and isinstance(c.get("function"), dict)
                    and isinstance(c["function"].get("name"), str) for c in calls):  # fmt: skip
                raise ApiError(400, f"messages[{i}].tool_calls are {{'id', 'type': 'function', 'function': "
                               "{'name', 'arguments'}}", f"messages[{i}].tool_calls")  # fmt: skip
            message["tool_calls"] = calls
            message["content"] = content or ""
        elif not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content is a string", f"messages[{i}].content")
        if m["role"] == "tool":
            message["tool_call_id"] = m.get("tool_call_id")
            if isinstance(m.get("name"), str):
                message["name"] = m["name"]
        conversation.append(message)
    return conversation


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name, why in UNSUPPORTED.items():
        if body.get(name) not in (None, [], {}):
            raise ApiError(400, why, name)


def _response_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema ``response_format`` asks answers to keep to (json_object: any object), or
    None for text."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(400, "response_format.json_schema.schema is the JSON schema (an object)",
                           "response_format")  # fmt: skip
        return schema
    raise ApiError(400, f"response_format type is 'text', 'json_object' or 'json_schema', not {kind!r}",
                   "response_format")  # fmt: skip


def key_refused(api_key: str | None, path: str, authorization: str) -> ApiError | None:
    """The 401 a request to ``path`` with header ``Authorization: authorization`` gets, or None."""
    if api_key is not None and path != "/health" and authorization != f"Bearer {api_key}":
        return ApiError(401, "incorrect API key provided", kind="invalid_request_error", code="invalid_api_key")
    return None


def too_large(path: str) -> ApiError:
    """The 413 a body over the limit of ``path``'s endpoint gets."""
    limit = MAX_UPLOAD if path.startswith("/v1/audio/") else MAX_BODY
    return ApiError(413, f"the request body is over {limit} bytes")


class OpenAIApi:
    """The application: :meth:`app` for aiohttp, ``models`` by name."""

    def __init__(self, models: dict[str, Served], api_key: str | None = None, owns_models: bool = True,
                 every_name: tuple[str, ...] = ()) -> None:  # fmt: skip
        #: ``owns_models``: the batchers stop when the application shuts down; ``every_name``: what
        #: the whole application serves where other processes serve some (Ray Serve), for messages
        self.models, self.api_key, self.owns_models = models, api_key, owns_models
        self.every_name = every_name or tuple(models)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_UPLOAD, middlewares=[self._errors])
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/v1/models/{name}", self.get_model)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/v1/audio/transcriptions", self.transcriptions)
        app.router.add_post("/v1/audio/translations", self.translations)
        if self.owns_models:
            app.on_shutdown.append(self._close)
        return app

    async def _close(self, app: web.Application) -> None:
        for served in self.models.values():
            if served.batcher is not None:
                await asyncio.get_running_loop().run_in_executor(None, served.batcher.close)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            refused = key_refused(self.api_key, request.path, request.headers.get("Authorization", ""))
            if refused is not None:
                raise refused
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except web.HTTPRequestEntityTooLarge:
            return too_large(request.path).response()
        except web.HTTPException as exc:
            return ApiError(exc.status, exc.reason or "not found", kind="invalid_request_error").response()
        except EdgeattnError as exc:
            return ApiError(400, str(exc)).response()

    # ------------------------------------------------------------ helpers
    async def _body(self, request: web.Request) -> dict[str, Any]:
        if (request.content_length or 0) > MAX_BODY:
            raise ApiError(413, f"the request body is over {MAX_BODY} bytes")
        raw = await request.read()
        if len(raw) > MAX_BODY:
            raise ApiError(413, f"the request body is over {MAX_BODY} bytes")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ApiError(400, "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body is a JSON object")
        return body

    def _model(self, body: dict[str, Any], does: str) -> Served:
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "model is required", "model")
        served = self.models.get(name)
        if served is None:
            raise ApiError(404, f"the model {name!r} does not exist (served: {', '.join(self.every_name)})", "model",
                           code="model_not_found")  # fmt: skip
        if does != served.does:
            what = {"generate": "generates text", "embed": "embeds its inputs", "transcribe": "transcribes speech"}
            use = {"generate": "completions", "embed": "embeddings", "transcribe": "audio"}
            raise ApiError(400, f"the model {name!r} {what[served.does]}; use the {use[served.does]} endpoints for it",
                           "model")  # fmt: skip
        return served

    # ----------------------------------------------------------- endpoints
    def _card(self, served: Served) -> dict[str, Any]:
        return {"id": served.name, "object": "model", "created": served.created, "owned_by": "edgeattn"}

    async def health(self, request: web.Request) -> web.Response:
        """Liveness and each language model's batch: rows decoding now, the widest step, how
        generations ended (open without the key, as llama.cpp's /health is)."""
        batches = {s.name: {"rows": s.batcher.rows, "widest": s.batcher.widest, "ended": dict(s.batcher.ended)}
                   for s in self.models.values() if s.batcher is not None}  # fmt: skip
        return web.json_response({"status": "ok", "batches": batches})

    async def list_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._card(s) for s in self.models.values()]})

    async def get_model(self, request: web.Request) -> web.Response:
        served = self.models.get(request.match_info["name"])
        if served is None:
            raise ApiError(404, f"the model {request.match_info['name']!r} does not exist", "model",
                           code="model_not_found")  # fmt: skip
        return web.json_response(self._card(served))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        served = self._model(body, "generate")
        model = served.model
        if model.chat_template is None:
            raise ApiError(400, f"the model {served.name!r} has no chat template; use /v1/completions", "messages")
        conversation = _conversation(body.get("messages"))
        try:
            tools = tool_use(model.chat_template.source, body.get("tools"), body.get("tool_choice"),
                             body.get("parallel_tool_calls", True), _response_schema(body))  # fmt: skip
        except InputError as exc:
            field = next((f for f in ("tool_choice", "parallel_tool_calls") if f in str(exc)), "tools")
            raise ApiError(400, str(exc), field) from None
        if tools is None:
            text = model.render_chat(history(template_format(model.chat_template.source), conversation))
        else:
            text = model.render_chat(tools.messages(conversation), tools=tools.template_tools())
        ids = model._tokenizer().encode(text, False)
        limit = _field(body, "max_completion_tokens", int, None, 1)
        limit = _field(body, "max_tokens", int, limit, 1)
        return await self._generate(request, body, served, [ids], "chat.completion", limit, tools)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        served = self._model(body, "generate")
        prompts = _texts(body, "prompt")
        tokenizer = served.model._tokenizer()
        ids = [tokenizer.encode(p, True) for p in prompts]
        limit = _field(body, "max_tokens", int, 16, 1)
        return await self._generate(request, body, served, ids, "text_completion", limit)

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        served = self._model(body, "embed")
        texts = _texts(body, "input")
        if len(texts) > MAX_INPUTS:
            raise ApiError(400, f"input holds {len(texts)} texts; at most {MAX_INPUTS} a request", "input")
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise ApiError(400, "encoding_format is 'float' or 'base64'", "encoding_format")
        if body.get("dimensions") is not None:
            raise ApiError(400, "dimensions is not served (the export's vectors have their own size)", "dimensions")
        tokenizer = getattr(served.model, "tokenizer", None)
        counts = sum(len(tokenizer.encode(t)) for t in texts) if hasattr(tokenizer, "encode") else 0
        family = served.model.family
        embed = served.model.embed if family.api_embed is None else partial(resolve(family.api_embed), served.model)
        vectors = await asyncio.get_running_loop().run_in_executor(None, lambda: embed(texts))
        data = []
        for i, v in enumerate(np.asarray(vectors, np.float32)):
            value = base64.b64encode(v.tobytes()).decode() if encoding == "base64" else v.tolist()
            data.append({"object": "embedding", "index": i, "embedding": value})
        return web.json_response({"object": "list", "data": data, "model": served.name,
                                  "usage": {"prompt_tokens": counts, "total_tokens": counts}})  # fmt: skip

    async def transcriptions(self, request: web.Request) -> web.Response:
        return await self._audio(request, "transcribe")

    async def translations(self, request: web.Request) -> web.Response:
        return await self._audio(request, "translate")

    async def _audio(self, request: web.Request, task: str) -> web.Response:
        """A multipart upload (``file``, ``model``, ``language``, ``response_format``, ...)
        transcribed or translated into English."""
        from edgeattn.runtime.families.speech.formats import render

        form = await self._form(request)
        served = self._model(form, "transcribe")
        if "file" not in form:
            raise ApiError(400, "file is required (the audio, as a multipart upload)", "file")
        answer = form.get("response_format", "json")
        if answer not in AUDIO_FORMATS:
            raise ApiError(400, f"response_format is one of {', '.join(AUDIO_FORMATS)}", "response_format")
        try:
            temperature = float(form.get("temperature", 0) or 0)
        except ValueError:
            raise ApiError(400, "temperature is a number", "temperature") from None
        if not 0 <= temperature <= 1:
            raise ApiError(400, "temperature is from 0 (greedy) to 1 (sampled)", "temperature")
        granularities = form.get("timestamp_granularities[]", []) + form.get("timestamp_granularities", [])
        unknown = sorted(set(granularities) - {"word", "segment"})
        if unknown:
            raise ApiError(400, f"timestamp_granularities are word and segment, not {', '.join(unknown)}",
                           "timestamp_granularities")  # fmt: skip
        if granularities and answer != "verbose_json":
            raise ApiError(400, "timestamp_granularities need response_format verbose_json", "timestamp_granularities")
        words = "word" in granularities
        if words and not served.model.has_word_timestamps:
            raise ApiError(400, "this model's export has no alignment heads' weights, which word timestamps are "
                           "found by (its folder listed none)", "timestamp_granularities")  # fmt: skip
        language = form.get("language") or None
        stamps = answer in ("srt", "vtt", "verbose_json")

        def hear() -> Any:
            return served.model.transcribe(form["file"], language=language, task=task, timestamps=stamps,
                                           temperature=temperature, word_timestamps=words,
                                           prompt=form.get("prompt") or None)  # fmt: skip

        heard = await asyncio.get_running_loop().run_in_executor(None, hear)
        if answer == "json":
            return web.json_response({"text": heard.text.strip()})
        if answer == "text":
            return web.Response(text=heard.text.strip() + "\n", content_type="text/plain")
        if answer == "verbose_json":
            segments = [{"id": i, "seek": s.seek, "start": s.start, "end": s.end, "text": s.text,
                         "tokens": list(s.tokens), "temperature": s.temperature, "avg_logprob": s.avg_logprob,
                         "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}
                        for i, s in enumerate(heard.segments)]  # fmt: skip
            body: dict[str, Any] = {"task": "translate" if task == "translate" else "transcribe",
                                    "language": heard.language or "en", "duration": heard.duration,
                                    "text": heard.text.strip()}  # fmt: skip
            if words:
                body["words"] = [{"word": w.word.strip(), "start": w.start, "end": w.end}
                                 for s in heard.segments for w in s.words or ()]  # fmt: skip
            if not words or "segment" in granularities:
                body["segments"] = segments
            return web.json_response(body)
        kind = "text/vtt" if answer == "vtt" else "application/x-subrip"
        return web.Response(text=render(heard, answer, True), content_type=kind)

    async def _form(self, request: web.Request) -> dict[str, Any]:
        """A multipart form's fields (text) and ``file`` (bytes); list fields (``name[]``) as lists."""
        if not request.content_type.startswith("multipart/"):
            raise ApiError(400, "an audio request is a multipart/form-data upload with its file and model")
        form: dict[str, Any] = {}
        reader = await request.multipart()
        async for part in reader:
            name = getattr(part, "name", None)
            if not name:
                continue
            if name == "file":
                form["file"] = bytes(await part.read(decode=False))
            elif name.endswith("[]") or name == "timestamp_granularities":
                form.setdefault(name, []).append(await part.text())
            else:
                form[name] = await part.text()
        return form

    # --------------------------------------------------------- generation
    async def _generate(self, request: web.Request, body: dict[str, Any], served: Served, prompts: list[list[int]],
                        kind: str, limit: int | None, tools: ToolUse | None = None) -> web.StreamResponse:  # fmt: skip
        _refuse_unsupported(body)
        max_len = served.model.config.max_len
        longest = max(len(p) for p in prompts)
        if longest >= max_len:
            where = "messages" if kind == "chat.completion" else "prompt"
            raise ApiError(400, f"the prompt is {longest} tokens; this model's context is {max_len} tokens", where,
                           code="context_length_exceeded")  # fmt: skip
        limit = max_len - longest if limit is None else limit
        if longest + limit > max_len:
            raise ApiError(400, f"the prompt's {longest} tokens and max_tokens {limit} exceed this model's context of "
                           f"{max_len} tokens", "max_tokens", code="context_length_exceeded")  # fmt: skip
        n = _field(body, "n", int, 1, 1, MAX_N)
        stream = _field(body, "stream", bool, False)
        usage_in_stream = bool((_field(body, "stream_options", dict, {}) or {}).get("include_usage"))
        logprobs = _field(body, "logprobs", (bool, int), False)
        top = _field(body, "top_logprobs", int, 0, 0, MAX_TOP_LOGPROBS)
        if kind == "text_completion" and not isinstance(logprobs, bool):  # completions: logprobs is the count
            logprobs, top = True, int(_field(body, "logprobs", int, 0, 0, 5))
        settings = {
            "temperature": float(_field(body, "temperature", (int, float), 1.0, 0, 2)),
            "top_p": float(_field(body, "top_p", (int, float), 1.0, 0, 1)),
            "presence_penalty": float(_field(body, "presence_penalty", (int, float), 0.0, -2, 2)),
            "frequency_penalty": float(_field(body, "frequency_penalty", (int, float), 0.0, -2, 2)),
            "stop": _stop(body),
            "top_logprobs": top if logprobs else 0,
        }
        seed = _field(body, "seed", int, None)
        schema = _response_schema(body)
        grammar = tools.grammar() if tools is not None else None if schema is None else ("json_schema", schema)
        constraints: list[Any] = [None] * (len(prompts) * n)
        if grammar is not None:  # built before any row is taken: a grammar that cannot compile is the client's error
            from edgeattn.runtime.constrained import Constraint

            try:
                constraints = [Constraint.of(served.model, *grammar) for _ in constraints]
            except EdgeattnError as exc:
                raise ApiError(400, str(exc), "tools" if tools is not None else "response_format") from None
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, Piece | Finished]] = asyncio.Queue()
        generations = []
        for p, ids in enumerate(prompts):
            for j in range(n):
                index = p * n + j

                def emit(event: Piece | Finished, index: int = index) -> None:
                    loop.call_soon_threadsafe(events.put_nowait, (index, event))

                generations.append(Generation(ids, limit, emit, seed=None if seed is None else seed + index,
                                              constraint=constraints[index], **settings))  # fmt: skip
        assert served.batcher is not None
        for g in generations:
            served.batcher.submit(g)
        ident = ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + uuid.uuid4().hex
        prompt_tokens = sum(len(p) for p in prompts)
        try:
            if stream:
                return await self._stream(request, served, kind, ident, events, generations, usage_in_stream,
                                          bool(logprobs), prompt_tokens, tools)  # fmt: skip
            return await self._whole(served, kind, ident, events, generations, bool(logprobs), prompt_tokens, tools)
        finally:  # a client that went (or an error) frees its rows at the next step
            for g in generations:
                g.cancelled.set()

    def _logprob_entry(self, served: Served, piece: Piece) -> dict[str, Any]:
        tokenizer = served.model._tokenizer()

        def text(token: int) -> str:
            return tokenizer.decode([token])

        return {"token": text(piece.token), "logprob": piece.logprob, "bytes": list(text(piece.token).encode()),
                "top_logprobs": [{"token": text(t), "logprob": lp, "bytes": list(text(t).encode())}
                                 for t, lp in piece.top]}  # fmt: skip

    async def _whole(self, served: Served, kind: str, ident: str, events: asyncio.Queue, generations: list,
                     logprobs: bool, prompt_tokens: int, tools: ToolUse | None = None) -> web.Response:  # fmt: skip
        texts = [""] * len(generations)
        pieces: list[list[Piece]] = [[] for _ in generations]
        ends: dict[int, Finished] = {}
        while len(ends) < len(generations):
            index, event = await events.get()
            if isinstance(event, Piece):
                texts[index] += event.text
                pieces[index].append(event)
            else:
                texts[index] += event.tail
                ends[index] = event
        errors = [e.error for e in ends.values() if e.reason == "error"]
        if errors:
            raise ApiError(500, f"generation failed: {errors[0]}", kind="server_error")
        choices = []
        for i, text in enumerate(texts):
            reason = ends[i].reason
            entry: dict[str, Any] = {"index": i, "finish_reason": reason}
            if kind == "chat.completion":
                entry["message"] = {"role": "assistant", "content": text}
                if tools is not None:
                    content, calls = tools.parse(text)
                    entry["message"]["content"] = content
                    if calls:
                        entry["message"]["tool_calls"] = [c.openai() for c in calls]
                        entry["finish_reason"] = "tool_calls" if reason == "stop" else reason
                content = [self._logprob_entry(served, p) for p in pieces[i]]
                entry["logprobs"] = {"content": content} if logprobs else None
            else:
                entry["text"] = text
                entry["logprobs"] = self._completion_logprobs(served, pieces[i]) if logprobs else None
            choices.append(entry)
        completion = sum(e.completion_tokens for e in ends.values())
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                 "total_tokens": prompt_tokens + completion}  # fmt: skip
        return web.json_response({"id": ident, "object": kind, "created": int(time.time()), "model": served.name,
                                  "choices": choices, "usage": usage})  # fmt: skip

    def _completion_logprobs(self, served: Served, pieces: list[Piece]) -> dict[str, Any]:
        tokenizer = served.model._tokenizer()
        tokens = [tokenizer.decode([p.token]) for p in pieces]
        return {"tokens": tokens, "token_logprobs": [p.logprob for p in pieces],
                "top_logprobs": [{tokenizer.decode([t]): lp for t, lp in p.top} for p in pieces],
                "text_offset": list(np.cumsum([0] + [len(t) for t in tokens[:-1]]).tolist())}  # fmt: skip

    async def _stream(self, request: web.Request, served: Served, kind: str, ident: str, events: asyncio.Queue,
                      generations: list, usage: bool, logprobs: bool, prompt_tokens: int,
                      tools: ToolUse | None = None) -> web.StreamResponse:  # fmt: skip
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        try:
            await self._events(response, served, kind, ident, events, generations, usage, logprobs, prompt_tokens,
                               tools)  # fmt: skip
        except ConnectionResetError:  # the client went: the caller frees its rows
            log.info("%s: the client went mid-stream", ident)
        return response

    async def _events(self, response: web.StreamResponse, served: Served, kind: str, ident: str,
                      events: asyncio.Queue, generations: list, usage: bool, logprobs: bool, prompt_tokens: int,
                      tools: ToolUse | None = None) -> None:  # fmt: skip
        """Server-sent chunks as pieces come. With tools, an answer's text is held while it may
        still become calls: calls are sent whole at the end (one delta a call), text once it
        cannot be a call."""
        created = int(time.time())
        chunk_kind = "chat.completion.chunk" if kind == "chat.completion" else "text_completion"

        async def send(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> None:
            chunk = {"id": ident, "object": chunk_kind, "created": created, "model": served.name, "choices": choices,
                     **(extra or {})}  # fmt: skip
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        if kind == "chat.completion":
            await send([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                        for i in range(len(generations))])  # fmt: skip
        ends: dict[int, Finished] = {}
        held = {i: "" for i in range(len(generations))} if tools is not None else {}
        while len(ends) < len(generations):
            index, event = await events.get()
            if isinstance(event, Finished):
                ends[index] = event
                if event.reason == "error":
                    failed = {"error": {"message": event.error, "type": "server_error"}}
                    await response.write(f"data: {json.dumps(failed)}\n\n".encode())
                    continue
                reason = event.reason
                if index in held:
                    assert tools is not None
                    content, calls = tools.parse(held.pop(index) + event.tail)
                    if calls:
                        deltas = [{"index": k, **c.openai()} for k, c in enumerate(calls)]
                        await send([{"index": index, "delta": {"tool_calls": deltas}, "finish_reason": None}])
                        reason = "tool_calls" if reason == "stop" else reason
                    elif content:
                        await send([self._delta(served, kind, index, content, None, None)])
                elif event.tail:
                    await send([self._delta(served, kind, index, event.tail, None, None)])
                await send([self._delta(served, kind, index, "", reason, None)])
                continue
            text = event.text
            if index in held:
                assert tools is not None
                held[index] += text
                if tools.may_be_call(held[index]):
                    continue
                text = held.pop(index)
            if text or logprobs:
                await send([self._delta(served, kind, index, text, None, event if logprobs else None)])
        if usage:
            completion = sum(e.completion_tokens for e in ends.values())
            await send([], {"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                                      "total_tokens": prompt_tokens + completion}})  # fmt: skip
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()

    def _delta(self, served: Served, kind: str, index: int, text: str, reason: str | None,
               piece: Piece | None) -> dict[str, Any]:  # fmt: skip
        if kind == "chat.completion":
            entry: dict[str, Any] = {"index": index, "delta": {"content": text} if text or reason is None else {},
                                     "finish_reason": reason}  # fmt: skip
            entry["logprobs"] = {"content": [self._logprob_entry(served, piece)]} if piece is not None else None
            return entry
        return {"index": index, "text": text, "finish_reason": reason,
                "logprobs": self._completion_logprobs(served, [piece]) if piece is not None else None}  # fmt: skip


def run_api(exports: list[Path], host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
            max_rows: int = 8, precision: str = FP32, ready: Any = None) -> None:  # fmt: skip
    """Serve ``exports`` at ``precision`` until interrupted (``ready``: called with the URL once
    listening)."""
    api = OpenAIApi(served_models(exports, max_rows, precision), api_key)

    async def main() -> None:
        runner = web.AppRunner(api.app())
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        if ready is not None:
            ready(f"http://{host}:{port}/v1")
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())


class ApiThread:
    """The API served from a thread of this process on a free port (tests, benchmarks):
    ``with ApiThread(api) as server: server.url``."""

    def __init__(self, api: OpenAIApi, host: str = "127.0.0.1", port: int = 0) -> None:
        import threading

        self.api, self.host, self.port = api, host, port
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="edgeattn-openai-api", daemon=True)

    def __enter__(self) -> ApiThread:
        self._thread.start()

        async def start() -> web.AppRunner:
            runner = web.AppRunner(self.api.app())
            await runner.setup()
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
            self.port = runner.addresses[0][1]
            return runner

        self._runner = asyncio.run_coroutine_threadsafe(start(), self.loop).result(timeout=60)
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
