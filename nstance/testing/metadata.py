"""A small local instance-metadata server speaking the AWS IMDSv2 and Google metadata paths Nstance uses.

For tests and demos of the agent's spot poller and of the server's lookup of its own VM (leader
network): ``MetadataServer`` listens on 127.0.0.1 (a free port) in a background thread and answers

* AWS: ``PUT /latest/api/token`` (needs ``X-aws-ec2-metadata-token-ttl-seconds``), then with the
  ``X-aws-ec2-metadata-token`` header (401 without it) ``GET /latest/meta-data/instance-life-cycle``,
  ``GET /latest/meta-data/spot/instance-action`` (404 without a notice, 200 JSON
  ``{"action", "time"}`` with one) and ``GET /latest/meta-data/instance-id``;
* Google: ``GET /computeMetadata/v1/instance/scheduling/preemptible``,
  ``GET /computeMetadata/v1/instance/preempted``, ``.../instance/id`` and ``.../instance/name``
  (403 without ``Metadata-Flavor: Google``).

A cloud that is switched off (``aws_life_cycle=None`` / ``google_preemptible=None``) answers 404 on
its paths, as a machine on another cloud would. State is plain attributes, settable while running.
This is a fake: nothing in the product imports it.
"""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


class MetadataServer:
    """Fake AWS + Google metadata endpoints; use as a context manager or call start/stop."""

    def __init__(self) -> None:
        self.aws_life_cycle: str | None = None  # "spot", "on-demand", or None (not AWS)
        self.aws_action: dict[str, str] | None = None  # {"action": ..., "time": ...}
        self.google_preemptible: bool | None = None  # None (not Google)
        self.google_preempted: bool = False
        self.aws_instance_id = "i-0123456789abcdef0"
        self.google_instance_id = "4242424242424242424"
        self.google_instance_name = "nstance-server-1"
        self.requests: list[tuple[str, str]] = []
        self._tokens: set[str] = set()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> MetadataServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="metadata", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> MetadataServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- request handling --------------------------------------------------------------------------

    def _answer(self, method: str, path: str, headers: Any) -> tuple[int, bytes, str]:
        with self._lock:
            self.requests.append((method, path))
        if path.startswith("/latest/"):
            return self._aws(method, path, headers)
        if path.startswith("/computeMetadata/v1/"):
            return self._google(method, path, headers)
        return 404, b"not found\n", "text/plain"

    def _aws(self, method: str, path: str, headers: Any) -> tuple[int, bytes, str]:
        if self.aws_life_cycle is None:
            return 404, b"not found\n", "text/plain"
        if path == "/latest/api/token":
            if method != "PUT":
                return 405, b"", "text/plain"
            if not headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return 400, b"missing ttl header\n", "text/plain"
            token = secrets.token_urlsafe(16)
            with self._lock:
                self._tokens.add(token)
            return 200, token.encode(), "text/plain"
        if method != "GET":
            return 405, b"", "text/plain"
        with self._lock:
            authorised = headers.get("X-aws-ec2-metadata-token", "") in self._tokens
        if not authorised:
            return 401, b"", "text/plain"
        if path == "/latest/meta-data/instance-life-cycle":
            return 200, self.aws_life_cycle.encode(), "text/plain"
        if path == "/latest/meta-data/instance-id":
            return 200, self.aws_instance_id.encode(), "text/plain"
        if path == "/latest/meta-data/spot/instance-action":
            action = self.aws_action
            if action is None:
                return 404, b"", "text/plain"
            return 200, json.dumps(action).encode(), "application/json"
        return 404, b"", "text/plain"

    def _google(self, method: str, path: str, headers: Any) -> tuple[int, bytes, str]:
        if self.google_preemptible is None:
            return 404, b"not found\n", "text/plain"
        if headers.get("Metadata-Flavor") != "Google":
            return 403, b"Missing Metadata-Flavor:Google header.\n", "text/plain"
        if method != "GET":
            return 405, b"", "text/plain"
        if path == "/computeMetadata/v1/instance/scheduling/preemptible":
            return 200, b"TRUE" if self.google_preemptible else b"FALSE", "application/text"
        if path == "/computeMetadata/v1/instance/preempted":
            return 200, b"TRUE" if self.google_preempted else b"FALSE", "application/text"
        if path == "/computeMetadata/v1/instance/id":
            return 200, self.google_instance_id.encode(), "application/text"
        if path == "/computeMetadata/v1/instance/name":
            return 200, self.google_instance_name.encode(), "application/text"
        return 404, b"", "text/plain"

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                status, body, content_type = fake._answer(self.command, self.path, self.headers)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._serve()

            def do_PUT(self) -> None:
                self._serve()

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler
