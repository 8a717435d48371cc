"""``edgeattn serve-web``: a web bundle's page served on this machine, with the headers
onnxruntime-web needs for threads (cross-origin isolation), and its JavaScript runtime from a
local copy when one is given (else the page loads it from the jsDelivr CDN). Torch-free.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from edgeattn.errors import EdgeattnError

log = logging.getLogger(__name__)

PAGE = "index.html"
ORT_PLACEHOLDER, WEBGPU_PLACEHOLDER = "__ORT_MODULE__", "__ORT_WEBGPU_MODULE__"
#: the self-contained ES module of onnxruntime-web's wasm backend (it loads its .wasm beside it)
ORT_MODULE = "ort.wasm.bundle.min.mjs"
#: onnxruntime-web's build with the WebGPU backend, imported when the page is asked to run on it
ORT_WEBGPU_MODULE = "ort.webgpu.bundle.min.mjs"


def cdn_module(version: str, name: str = ORT_MODULE) -> str:
    return f"https://cdn.jsdelivr.net/npm/onnxruntime-web@{version}/dist/{name}"


def page(template: str, ort_module: str, webgpu_module: str | None = None) -> str:
    """The page with its import map pointing at ``ort_module`` (and its WebGPU build at ``webgpu_module``)."""
    return template.replace(ORT_PLACEHOLDER, ort_module).replace(WEBGPU_PLACEHOLDER, webgpu_module or "")


def read_bundle(bundle_dir: Path) -> dict[str, Any]:
    """A web bundle's ``bundle.json``, or an EdgeattnError saying what the directory is not."""
    path = bundle_dir / "bundle.json"
    if not path.is_file():
        raise EdgeattnError(f"{bundle_dir} has no bundle.json; write one with edgeattn package --target web")
    described = json.loads(path.read_text(encoding="utf-8"))
    if described.get("target") != "web":
        raise EdgeattnError(f"{bundle_dir} is a {described.get('target')!r} bundle; serve-web serves --target web "
                            "bundles")  # fmt: skip
    return described


class _Handler(SimpleHTTPRequestHandler):
    """Static files with cross-origin isolation (COOP/COEP: SharedArrayBuffer, hence wasm threads),
    the right types for ES modules and wasm, the page rewritten for the local runtime, and
    ``/ort/`` served from a local onnxruntime-web dist."""

    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript", ".js": "text/javascript",
                      ".wasm": "application/wasm", ".json": "application/json"}  # fmt: skip

    def __init__(self, *args: Any, bundle: Path, ort_dist: Path | None, **kwargs: Any) -> None:
        self.bundle, self.ort_dist = bundle, ort_dist
        super().__init__(*args, directory=str(bundle), **kwargs)

    def end_headers(self) -> None:
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def translate_path(self, path: str) -> str:
        if self.ort_dist is not None and path.split("?", 1)[0].startswith("/ort/"):
            name = path.split("?", 1)[0][len("/ort/"):]
            target = (self.ort_dist / name).resolve()
            if target.parent == self.ort_dist.resolve():
                return str(target)
            return str(self.ort_dist / "missing")
        return super().translate_path(path)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.split("?", 1)[0] in ("/", f"/{PAGE}"):
            template = (self.bundle / PAGE).read_text(encoding="utf-8")
            described = json.loads((self.bundle / "bundle.json").read_text(encoding="utf-8"))
            version = described["runtime"]["version"]
            module = f"./ort/{ORT_MODULE}" if self.ort_dist else cdn_module(version)
            webgpu = f"./ort/{ORT_WEBGPU_MODULE}" if self.ort_dist else cdn_module(version, ORT_WEBGPU_MODULE)
            body = page(template, module, webgpu).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        log.debug("%s " + format, self.address_string(), *args)


class WebPageServer:
    """The page of a web bundle on ``host:port`` (port 0: any free one) until :meth:`stop`."""

    def __init__(self, bundle_dir: str | Path, host: str = "127.0.0.1", port: int = 8080,
                 ort_dist: str | Path | None = None) -> None:  # fmt: skip
        self.bundle = Path(bundle_dir).resolve()
        read_bundle(self.bundle)
        if not (self.bundle / PAGE).is_file():
            raise EdgeattnError(f"{self.bundle} has no {PAGE}; write the bundle again with this edgeattn")
        self.ort_dist = None if ort_dist is None else Path(ort_dist).resolve()
        if self.ort_dist is not None and not (self.ort_dist / ORT_MODULE).is_file():
            raise EdgeattnError(f"{self.ort_dist} holds no {ORT_MODULE}: give onnxruntime-web's dist folder "
                                "(node_modules/onnxruntime-web/dist)")  # fmt: skip
        handler = functools.partial(_Handler, bundle=self.bundle, ort_dist=self.ort_dist)
        self.server = ThreadingHTTPServer((host, port), handler)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> WebPageServer:
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> WebPageServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
