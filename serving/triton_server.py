"""A real Triton Inference Server process on this machine, serving the Python-backend models of a
repository (``edgeattn serve``, and the tests that prove a repository serves).

The server is the one ``nvidia-pytriton`` ships (Triton 2.51 with the Python backend only; the
``serve`` extra installs it), or a ``tritonserver`` on PATH. Two facts shape the start: the
Python-backend stub links ``libpython3.11``, so the running interpreter's own library directory
goes first on ``LD_LIBRARY_PATH`` (another build of 3.11 found first fails at model load); and the
stub runs the Python found first on PATH, so this interpreter's directory goes first there.
Torch-free.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from edgeattn.errors import EdgeattnError

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'edgeattn[serve]' (nvidia-pytriton bundles a Triton server)"


class ServerError(EdgeattnError):
    """The Triton server could not start or stopped."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bundled() -> tuple[Path, Path, Path, Path] | None:
    """(tritonserver, python backend directory, stub for this Python, libraries) from nvidia-pytriton."""
    try:
        from pytriton.utils.distribution import get_libs_path, get_root_module_path, get_stub_path
    except ImportError:
        return None
    root = get_root_module_path() / "tritonserver"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return root / "bin" / "tritonserver", root / "backends" / "python", Path(get_stub_path(version)), get_libs_path()


def _stop_with_parent() -> None:
    """In the server's process before it runs (Linux): SIGTERM when the process that started it
    dies, so that a killed ``edgeattn serve`` or test leaves no server behind."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class TritonServer:
    """``tritonserver`` on ``repository`` loading ``models`` (all of the repository's when None),
    HTTP, gRPC and metrics on ``host``; a context manager that waits until the server is ready
    and stops it on exit."""

    def __init__(
        self,
        repository: str | Path,
        models: list[str] | None = None,
        host: str = "127.0.0.1",
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        log_file: str | Path | None = None,
    ) -> None:
        self.repository = Path(repository).resolve()
        self.models = models
        self.host = host
        self.http_port = http_port or free_port(host)
        self.grpc_port = grpc_port or free_port(host)
        self.metrics_port = metrics_port or free_port(host)
        self.log_file = Path(log_file) if log_file else None
        self.process: subprocess.Popen[bytes] | None = None
        self._work: tempfile.TemporaryDirectory[str] | None = None
        self._log: Any = None

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def command(self, backends: Path | None) -> list[str]:
        bundled = _bundled()
        binary = str(bundled[0]) if bundled else shutil.which("tritonserver")
        if binary is None:
            raise ServerError(f"no Triton server found: {INSTALL_HINT}, or put tritonserver on PATH")
        cmd = [binary, f"--model-repository={self.repository}", f"--http-address={self.host}",
               f"--grpc-address={self.host}", f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
               f"--metrics-port={self.metrics_port}", "--allow-metrics=true", "--allow-gpu-metrics=false",
               "--exit-on-error=true", "--exit-timeout-secs=5", "--log-verbose=0"]  # fmt: skip
        if backends is not None:
            cmd.append(f"--backend-directory={backends}")
        if self.models is not None:
            cmd += ["--model-control-mode=explicit", *(f"--load-model={m}" for m in self.models)]
        return cmd

    def _environment(self, libs: Path | None) -> dict[str, str]:
        env = os.environ.copy()
        paths = [sysconfig.get_config_var("LIBDIR") or "", str(libs or ""), env.get("LD_LIBRARY_PATH", "")]
        env["LD_LIBRARY_PATH"] = ":".join(p for p in paths if p)
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        return env

    def start(self, timeout: float = 120.0) -> TritonServer:
        """Start the server and wait until it says it is ready (ServerError if it stops first)."""
        bundled = _bundled()
        backends = None
        if bundled is not None:
            self._work = tempfile.TemporaryDirectory(prefix="edgeattn-triton-")
            backends = Path(self._work.name) / "backends"
            python = backends / "python"
            python.mkdir(parents=True)
            for item in bundled[1].iterdir():
                if item.is_file():
                    (python / item.name).symlink_to(item)
            shutil.copy2(bundled[2], python / "triton_python_backend_stub")
        cmd = self.command(backends)
        log.info("starting %s", " ".join(cmd))
        self._log = open(self.log_file, "wb") if self.log_file else None  # noqa: SIM115
        self.process = subprocess.Popen(cmd, stdout=self._log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                        env=self._environment(bundled[3] if bundled else None),
                                        preexec_fn=_stop_with_parent, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self._cleanup()
                where = f" (its log: {self.log_file})" if self.log_file else ""
                raise ServerError(f"the Triton server stopped while starting, exit code {code}{where}")
            if self.ready():
                return self
            time.sleep(0.25)
        self.stop()
        raise ServerError(f"the Triton server was not ready after {timeout:.0f} s")

    def ready(self) -> bool:
        """Whether the server answers ready on HTTP."""
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait(self) -> int:
        """Block until the server exits; its exit code."""
        assert self.process is not None
        return self.process.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``) and whatever it started (its
        Python-backend stubs: the server runs in a process group of its own)."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self._cleanup()

    def _cleanup(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._work is not None:
            self._work.cleanup()
            self._work = None

    def __enter__(self) -> TritonServer:
        return self.start() if self.process is None else self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
