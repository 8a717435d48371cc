"""The OpenAI-compatible API on a Ray cluster with Ray Serve: each export a deployment of its own
(replicas between a minimum and a maximum, scaled on the requests they hold), one ingress routing
each request to its model's deployment by the ``model`` it names.

A replica runs :class:`~edgeattn.serving.openai_api.OpenAIApi` itself, the in-process server's
request handling, on a loopback port of its process: every endpoint, error, limit, API key and
stream is the in-process server's, and a language model's requests share one continuous batch in
each replica. Replicas hold no state between requests, so any one answers any request. The
ingress reads only what it routes by; it answers a request whose replica stopped mid-way with
OpenAI's error object (a 503, or an ``error`` event in a stream already begun).

Exports must be at the same path on every node that runs their replicas (one machine, or a shared
file system).
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.families import get_family
from edgeattn.runtime.manifest import read_manifest
from edgeattn.runtime.precisions import FP32
from edgeattn.serving.openai_api import (
    MAX_UPLOAD,
    ApiError,
    ApiThread,
    OpenAIApi,
    key_refused,
    refuse_unserved,
    served_models,
    served_names,
    too_large,
)

log = logging.getLogger(__name__)

#: the Ray Serve application's name
APPLICATION = "edgeattn"
#: request headers a replica is given; response headers the client is given
FORWARDED = ("authorization", "content-type", "accept")
#: the requests an ingress replica holds before one more is wanted (it only relays their bytes)
INGRESS_STREAMS = 256
RETURNED = ("content-type", "cache-control")


@dataclass(frozen=True)
class RayServeOptions:
    """How the exports are deployed: ``threads`` per replica (and as many CPUs reserved on its node,
    so replicas do not share cores), replicas between ``min_replicas`` and ``max_replicas``, one
    more wanted when each holds over ``target_requests`` requests (None: ``max_rows``, a language
    model's full batch), the delays before scaling up and down, the window requests are averaged
    over (None: Ray Serve's)."""

    precision: str = FP32
    max_rows: int = 8
    api_key: str | None = None
    threads: int = 1
    min_replicas: int = 1
    max_replicas: int = 1
    target_requests: float | None = None
    upscale_delay_s: float = 5.0
    downscale_delay_s: float = 60.0
    look_back_s: float | None = None

    def check(self) -> None:
        """An EdgeattnError naming the option a user can correct."""
        if self.threads < 1:
            raise EdgeattnError("--threads must be at least 1")
        if self.min_replicas < 1 or self.max_replicas < self.min_replicas:
            raise EdgeattnError(f"--min-replicas must be at least 1 and at most --max-replicas; got "
                                f"{self.min_replicas} and {self.max_replicas}")  # fmt: skip

    def autoscaling(self) -> dict[str, Any]:
        """Ray Serve's ``autoscaling_config`` for an export's deployment."""
        config = {"min_replicas": self.min_replicas, "initial_replicas": self.min_replicas,
                  "max_replicas": self.max_replicas, "target_ongoing_requests": self.target_requests or self.max_rows,
                  "upscale_delay_s": self.upscale_delay_s, "downscale_delay_s": self.downscale_delay_s}  # fmt: skip
        return config | ({"look_back_period_s": self.look_back_s} if self.look_back_s is not None else {})


def need_serve() -> Any:
    try:
        import ray
        from ray import serve  # noqa: F401 - Ray Serve is an extra of ray
    except ImportError as exc:
        raise EdgeattnError("--ray serves with Ray Serve, which is not installed: pip install 'edgeattn[ray]'") from exc
    return ray


def check_exports(exports: list[Path], precision: str) -> list[str]:
    """Each export's name, refused here (not in a replica) where one is not an export the API
    serves at ``precision``."""
    names = served_names(exports)
    for path in exports:
        manifest = read_manifest(path)
        refuse_unserved(get_family(manifest.family_name), Path(path))
        for graph in manifest.graphs:
            manifest.entry(graph, precision)
    return names


# ---------------------------------------------------------------- replica
class ExportReplica:
    """A replica of one export's deployment: the in-process API on a loopback port, given each
    request as it came (from the ingress, or from Ray Serve's proxy where the application serves
    one export)."""

    def __init__(self, export_dir: str, options: RayServeOptions, every_name: tuple[str, ...]) -> None:
        import aiohttp

        path = Path(export_dir)
        if not path.is_dir():
            raise EdgeattnError(f"{export_dir} is not on this node; put the exports at the same path on every node")
        models = served_models([path], options.max_rows, options.precision, threads=options.threads)
        self.name, self.api_key = next(iter(models)), options.api_key
        self.api = ApiThread(OpenAIApi(models, options.api_key, every_name=every_name)).__enter__()
        self.base = f"http://{self.api.host}:{self.api.port}"
        self._aiohttp = aiohttp
        self._session: Any = None

    async def forward(self, method: str, target: str, headers: dict[str, str], body: bytes) -> AsyncIterator[Any]:
        """The API's answer to the request: first ``{"status", "headers"}``, then the body (a stream
        chunk by chunk, anything else whole)."""
        if self._session is None:  # made on the replica's own event loop
            self._session = self._aiohttp.ClientSession(timeout=self._aiohttp.ClientTimeout(total=None),
                                                        connector=self._aiohttp.TCPConnector(limit=0))  # fmt: skip
        async with self._session.request(method, self.base + target, headers=headers, data=body) as response:
            head = {"status": response.status,
                    "headers": {k.lower(): v for k, v in response.headers.items() if k.lower() in RETURNED}}
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                yield head | {"body": await response.read()}
                return
            yield head
            async for chunk in response.content.iter_any():
                yield chunk

    async def __call__(self, request: Any) -> Any:
        """The application's HTTP entry where it serves this one export: no hop between replicas."""
        parts = await _request_parts(request, self.api_key)
        if not isinstance(parts, tuple):
            return parts
        return await _respond(lambda: self.forward(*parts), self.name)

    def __del__(self) -> None:
        api = getattr(self, "api", None)
        if api is not None:
            api.__exit__(None, None, None)


# ---------------------------------------------------------------- ingress
def _model_named(path: str, content_type: str, body: bytes) -> str | None:
    """The ``model`` a request names (JSON body, multipart form field, or ``/v1/models/NAME``)."""
    if path.startswith("/v1/models/"):
        return path.removeprefix("/v1/models/")
    if content_type.startswith("multipart/form-data"):
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)  # fmt: skip
        for part in message.iter_parts() if message.is_multipart() else ():
            if part.get_param("name", header="content-disposition") == "model":
                value = part.get_payload(decode=True)
                return value.decode("utf-8", "replace").strip() if value is not None else None
        return None
    try:
        parsed = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    name = parsed.get("model") if isinstance(parsed, dict) else None
    return name if isinstance(name, str) else None


def _error(error: ApiError) -> Any:
    from starlette.responses import JSONResponse

    body = {"error": {"message": error.message, "type": error.kind, "param": error.param, "code": error.code}}
    return JSONResponse(body, status_code=error.status)


async def _request_parts(request: Any, api_key: str | None) -> tuple[str, str, dict[str, str], bytes] | Any:
    """(method, path and query, forwarded headers, body) of a Starlette request, or the error a body
    over the upload limit gets."""
    path = request.url.path
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_UPLOAD:
            refused = key_refused(api_key, path, request.headers.get("authorization", ""))
            return _error(refused or too_large(path))
    target = path + (f"?{request.url.query}" if request.url.query else "")
    return request.method, target, {k: v for k, v in request.headers.items() if k.lower() in FORWARDED}, bytes(body)


async def _respond(answers: Any, name: str | None, attempts: int = 1) -> Any:
    """The Starlette response to what ``answers()`` yields (:meth:`ExportReplica.forward`'s items),
    asked again up to ``attempts`` times where it fails before its first item."""
    from starlette.responses import Response, StreamingResponse

    for attempt in range(1, attempts + 1):  # a replica lost before it answered: once more, elsewhere
        answer = answers()
        try:
            head = await answer.__anext__()
            break
        except asyncio.CancelledError:
            await _cancel(answer)
            raise
        except Exception as exc:  # noqa: BLE001 - Ray's errors for a replica that died are many
            log.warning("a replica of %s failed before answering (attempt %d): %s", name, attempt, exc)
            if attempt == attempts:
                return _error(ApiError(503, f"the replica serving {name!r} stopped before answering; try again",
                                       kind="server_error"))  # fmt: skip
    if "body" in head:
        return Response(head["body"], status_code=head["status"], headers=head["headers"])

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in answer:
                yield chunk
        except asyncio.CancelledError:
            await _cancel(answer)
            raise
        except Exception as exc:  # noqa: BLE001
            log.warning("a replica of %s stopped mid-stream: %s", name, exc)
            error = {"message": f"the replica serving {name!r} stopped mid-answer; try again",
                     "type": "server_error", "param": None, "code": None}  # fmt: skip
            yield b"data: " + json.dumps({"error": error}).encode() + b"\n\n"

    return StreamingResponse(chunks(), status_code=head["status"], headers=head["headers"])


async def _cancel(answer: Any) -> None:
    """Stop an answer whose client went: a Ray response's call, or a local generator."""
    if hasattr(answer, "cancel"):
        answer.cancel()
    else:
        await answer.aclose()


class Ingress:
    """The application's HTTP entry where it serves several exports: each request given to its
    model's deployment; ``/v1/models`` and ``/health`` asked of every one."""

    def __init__(self, replicas: dict[str, Any], api_key: str | None) -> None:
        self.replicas, self.api_key = replicas, api_key
        self.first = next(iter(replicas.values()))

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import Response

        parts = await _request_parts(request, self.api_key)
        if not isinstance(parts, tuple):
            return parts
        method, target, headers, body = parts
        path = request.url.path
        if method == "GET" and path in ("/v1/models", "/health"):
            answers = await asyncio.gather(*(self._whole(h, method, target, headers) for h in self.replicas.values()))
            failed = next((a for a in answers if a[0] != 200), None)
            if failed is not None:
                return Response(failed[2], status_code=failed[0], headers=failed[1])
            merged = [json.loads(a[2]) for a in answers]
            if path == "/health":
                batches = {name: rows for one in merged for name, rows in one.get("batches", {}).items()}
                combined: dict[str, Any] = {"status": "ok", "batches": batches}
            else:
                combined = {"object": "list", "data": [card for one in merged for card in one["data"]]}
            return Response(json.dumps(combined), media_type="application/json")
        name = _model_named(path, request.headers.get("content-type", ""), body)
        handle = self.replicas.get(name or "", self.first)  # an unknown model: any replica answers the 404
        return await _respond(lambda: handle.options(stream=True).forward.remote(method, target, headers, body),
                              name, attempts=2)  # fmt: skip

    async def _whole(self, handle: Any, method: str, target: str, headers: dict[str, str]) -> tuple:
        async for head in handle.options(stream=True).forward.remote(method, target, headers, b""):
            return head["status"], head["headers"], head["body"]
        raise EdgeattnError("a replica answered nothing")  # pragma: no cover - forward always answers


# ---------------------------------------------------------------- deploying
def application(exports: list[Path], options: RayServeOptions) -> Any:
    """The Ray Serve application: a deployment per export, the ingress over them (one export's
    deployment is its own)."""
    from ray import serve

    options.check()
    names = check_exports(exports, options.precision)
    replicas = {}
    for name, path in zip(names, exports, strict=True):
        deployment = serve.deployment(
            ExportReplica, name=f"export-{name}", ray_actor_options={"num_cpus": options.threads},
            autoscaling_config=options.autoscaling(), max_ongoing_requests=max(64, 4 * options.max_rows),
            health_check_period_s=5.0, health_check_timeout_s=30.0, graceful_shutdown_timeout_s=5.0,
            max_constructor_retry_count=2,
        )  # fmt: skip
        replicas[name] = deployment.bind(str(Path(path).resolve()), options, tuple(names))
    if len(replicas) == 1:
        return next(iter(replicas.values()))
    ingress = serve.deployment(Ingress, name="ingress", ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=4 * INGRESS_STREAMS,
                               autoscaling_config={"min_replicas": 1,
                                                   "max_replicas": options.max_replicas * len(replicas),
                                                   "target_ongoing_requests": INGRESS_STREAMS})  # fmt: skip
    return ingress.bind(replicas, options.api_key)


@dataclass
class RayApi:
    """The application deployed: ``url`` its OpenAI base URL. Closing deletes the application, and
    stops Ray where this started it."""

    url: str
    started_ray: bool

    def close(self) -> None:
        import ray
        from ray import serve

        try:
            serve.delete(APPLICATION)  # its replicas stopped gracefully; the rest goes with Ray
        finally:
            if self.started_ray:
                ray.shutdown()

    def __enter__(self) -> RayApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def deploy(exports: list[Path], options: RayServeOptions, host: str = "127.0.0.1", port: int = 8000,
           address: str | None = None) -> RayApi:  # fmt: skip
    """Deploy ``exports`` on the cluster at ``address`` (None: the one this process is connected to,
    else a new local one started here; ``"auto"``: the one ``ray start`` began), Ray Serve's HTTP
    proxy on ``host:port``; returns once every replica has loaded its export."""
    ray = need_serve()
    from ray import serve

    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # edgeattn says when it is ready
    app = application(exports, options)  # refused before Ray starts where an export cannot be served
    started = not ray.is_initialized()
    if started:
        local = address in (None, "local")
        ray.init(address=address or "local", log_to_driver=False, logging_level=logging.WARNING,
                 **({"include_dashboard": False, "_system_config": {"worker_niceness": 0}} if local else {}))
    try:
        serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": "WARNING"})
        began = time.perf_counter()
        try:
            serve.run(app, name=APPLICATION, route_prefix="/", blocking=False)
        except RuntimeError as exc:  # a replica failed to start: its error's last line
            lines = [line for line in str(exc).splitlines() if line.strip()]
            reason = next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else str(exc))
            raise EdgeattnError(f"the Ray Serve application did not start: {reason.strip()}") from exc
        log.info("deployed %d export(s) on Ray Serve in %.1f s", len(exports), time.perf_counter() - began)
    except BaseException:
        if started:
            serve.shutdown()
            ray.shutdown()
        raise
    return RayApi(f"http://{host}:{port}/v1", started)
