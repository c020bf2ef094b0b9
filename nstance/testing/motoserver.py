"""Start and stop a real ``moto_server`` (moto's S3/EC2/... HTTP emulator) as a subprocess.

This is test support shipped in the package so the contract suite, integration tests, demos and
benchmarks share one way to get a throw-away S3 endpoint: ``MotoServer().start()`` launches the
``moto_server`` console script on a free loopback port, waits until it answers HTTP, and exposes
``endpoint_url``; ``reset()`` wipes all emulated state (``POST /moto-api/reset``) and ``stop()``
terminates the process (then kills it if it does not exit).

It uses only the standard library (subprocess, socket, urllib): it must not import moto, so nstance
never depends on moto at runtime; moto has to be installed only where a server is actually started.

The server handles one request at a time. ``moto_server`` itself serves requests on threads, and its
S3 conditional writes check and store without a lock, so two concurrent ``If-None-Match: *`` PUTs
could both succeed there - an emulator race that real S3 does not have. Serialising requests gives the
contract suite the atomic conditional writes S3 documents.
It must not be used to expose anything beyond 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import IO

from nstance.testing.procs import free_port

_LOG_TAIL_BYTES = 4000


# Runs in the child process: moto's own WSGI app, served without threads (see the module docstring).
_LAUNCHER = """
import os, sys
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
host, port = sys.argv[1], int(sys.argv[2])
os.environ.setdefault("MOTO_PORT", str(port))
run_simple(host, port, DomainDispatcherApplication(create_backend_app), threaded=False,
           request_handler=MotoRequestHandler)
"""


def moto_server_command(host: str, port: int) -> list[str]:
    """The command that runs moto's server on ``host:port``, one request at a time."""
    return [sys.executable, "-c", _LAUNCHER, host, str(port)]


class MotoServer:
    """One ``moto_server`` subprocess on 127.0.0.1; usable as a context manager."""

    def __init__(self, *, host: str = "127.0.0.1", startup_timeout: float = 10.0) -> None:
        self._host = host
        self._startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._port = 0

    @property
    def port(self) -> int:
        """The port the server listens on (0 before ``start``)."""
        return self._port

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:PORT`` of the running server."""
        if self._proc is None:
            raise RuntimeError("moto_server is not running")
        return f"http://{self._host}:{self._port}"

    def start(self) -> MotoServer:
        """Launch the server and wait until it answers; retry on another port if one was taken."""
        if self._proc is not None:
            return self
        last_error = ""
        for _ in range(3):
            self._port = free_port(self._host)
            self._log = tempfile.TemporaryFile()  # noqa: SIM115 (lives until stop())
            self._proc = subprocess.Popen(
                moto_server_command(self._host, self._port),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
            if self._wait_ready():
                return self
            last_error = self._log_tail()
            self.stop()
        raise RuntimeError(f"moto_server did not start within {self._startup_timeout:.0f}s:\n{last_error}")

    def reset(self) -> None:
        """Forget every bucket, object and other emulated resource."""
        request = urllib.request.Request(self.endpoint_url + "/moto-api/reset", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 5 s) and release its log file."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
            else:
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_ready(self) -> bool:
        assert self._proc is not None
        url = f"http://{self._host}:{self._port}/moto-api/"
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False  # exited: port taken, or moto missing
            try:
                with urllib.request.urlopen(url, timeout=0.5) as response:
                    response.read()
                return True
            except urllib.error.HTTPError as exc:
                exc.close()
                return True  # it answered, which is all we wait for
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        return False

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        with contextlib.suppress(OSError):
            self._log.seek(0, 2)
            size = self._log.tell()
            self._log.seek(max(0, size - _LOG_TAIL_BYTES))
            return self._log.read().decode("utf-8", "replace")
        return ""
