"""A local Google Cloud Storage JSON API server for tests (the part the ``gcs`` object store uses).

Serves, for any bucket, in memory: multipart uploads (``POST /upload/storage/v1/b/B/o``), media
downloads (``GET /download/storage/v1/b/B/o/NAME?alt=media``), object metadata
(``GET /storage/v1/b/B/o/NAME``), deletes and listings with ``prefix`` and page tokens, with GCS's
generation preconditions (``ifGenerationMatch``, ``0`` meaning "does not exist") answered ``412``
and missing objects ``404``. Every write gets a new, increasing generation. Requests are handled
one at a time under a lock, so conditional writes race exactly as against the real service.

``GcsFake().start()`` listens on 127.0.0.1 with an ephemeral port; ``endpoint`` is the URL to give the
client library (``client_options={"api_endpoint": ...}``). Not for production use.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

PAGE_SIZE = 1000


@dataclass(frozen=True, slots=True)
class _Object:
    data: bytes
    generation: int
    updated: datetime


class GcsFake:
    """In-memory GCS JSON API; thread-safe."""

    def __init__(self) -> None:
        self._objects: dict[tuple[str, str], _Object] = {}
        self._lock = threading.Lock()
        self._generation = 1_700_000_000_000_000
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        #: Requests answered, by method and path kind, for tests that count calls.
        self.requests: list[tuple[str, str]] = []

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start() first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> GcsFake:
        fake = self

        class Handler(_Handler):
            owner = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="gcs-fake", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # --- storage operations (called with the lock held) ----------------------------------------

    def _next_generation(self) -> int:
        self._generation += 1
        return self._generation

    def resource(self, bucket: str, name: str, obj: _Object) -> dict[str, Any]:
        md5 = base64.b64encode(hashlib.md5(obj.data, usedforsecurity=False).digest()).decode()
        return {
            "kind": "storage#object",
            "id": f"{bucket}/{name}/{obj.generation}",
            "name": name,
            "bucket": bucket,
            "generation": str(obj.generation),
            "metageneration": "1",
            "size": str(len(obj.data)),
            "md5Hash": md5,
            "updated": obj.updated.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "timeCreated": obj.updated.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "contentType": "application/octet-stream",
        }


def _precondition(params: dict[str, list[str]], current: _Object | None) -> bool:
    """Whether ``ifGenerationMatch`` (if given) holds."""
    wanted = params.get("ifGenerationMatch")
    if not wanted:
        return True
    generation = int(wanted[0])
    if generation == 0:
        return current is None
    return current is not None and current.generation == generation


class _Handler(BaseHTTPRequestHandler):
    owner: GcsFake
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(
        self, status: int, body: bytes = b"", content_type: str = "application/json", **headers: str
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc: dict[str, Any], **headers: str) -> None:
        self._send(status, json.dumps(doc).encode(), **headers)

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": {"code": status, "message": message, "errors": [{"message": message}]}})

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _route(self) -> tuple[str, str, str, dict[str, list[str]]]:
        """(kind, bucket, object name, query) of the request path."""
        parts = urlsplit(self.path)
        params = parse_qs(parts.query)
        path = parts.path
        for kind, head in (
            ("upload", "/upload/storage/v1/b/"),
            ("download", "/download/storage/v1/b/"),
            ("json", "/storage/v1/b/"),
        ):
            if path.startswith(head):
                rest = path[len(head) :]
                bucket, _, tail = rest.partition("/o")
                name = unquote(tail[1:]) if tail.startswith("/") else ""
                return kind, bucket, name, params
        return "", "", "", params

    # --- verbs ---------------------------------------------------------------------------------

    def do_GET(self) -> None:
        kind, bucket, name, params = self._route()
        self.owner.requests.append(("GET", kind))
        with self.owner._lock:
            if kind == "json" and not name:
                self._list(bucket, params)
                return
            obj = self.owner._objects.get((bucket, name))
            if obj is None:
                self._error(404, f"No such object: {bucket}/{name}")
                return
            if not _precondition(params, obj):
                self._error(412, "Precondition Failed")
                return
            if kind == "download" or params.get("alt") == ["media"]:
                md5 = base64.b64encode(hashlib.md5(obj.data, usedforsecurity=False).digest()).decode()
                self._send(
                    200,
                    obj.data,
                    "application/octet-stream",
                    x_goog_generation=str(obj.generation),
                    x_goog_metageneration="1",
                    x_goog_hash=f"md5={md5}",
                    x_goog_stored_content_length=str(len(obj.data)),
                )
                return
            self._json(200, self.owner.resource(bucket, name, obj))

    def _list(self, bucket: str, params: dict[str, list[str]]) -> None:
        prefix = (params.get("prefix") or [""])[0]
        token = (params.get("pageToken") or [""])[0]
        size = int((params.get("maxResults") or [str(PAGE_SIZE)])[0])
        names = sorted(
            n for (b, n) in self.owner._objects if b == bucket and n.startswith(prefix) and n > token
        )
        page = names[:size]
        doc: dict[str, Any] = {
            "kind": "storage#objects",
            "items": [self.owner.resource(bucket, n, self.owner._objects[(bucket, n)]) for n in page],
        }
        if len(names) > size:
            doc["nextPageToken"] = page[-1]
        self._json(200, doc)

    def do_POST(self) -> None:
        kind, bucket, _name, params = self._route()
        self.owner.requests.append(("POST", kind))
        body = self._body()
        if kind != "upload" or params.get("uploadType") != ["multipart"]:
            self._error(400, "only multipart uploads are supported by this fake")
            return
        message = BytesParser(policy=HTTP).parsebytes(
            f"Content-Type: {self.headers.get('Content-Type')}\r\n\r\n".encode() + body
        )
        parts = list(message.iter_parts())
        if len(parts) != 2:
            self._error(400, "a multipart upload has a metadata part and a media part")
            return
        metadata = json.loads(parts[0].get_content())
        media = parts[1].get_payload(decode=True) or b""
        name = metadata.get("name") or (params.get("name") or [""])[0]
        with self.owner._lock:
            current = self.owner._objects.get((bucket, name))
            if not _precondition(params, current):
                self._error(412, "Precondition Failed")
                return
            obj = _Object(bytes(media), self.owner._next_generation(), datetime.now(UTC))
            self.owner._objects[(bucket, name)] = obj
            self._json(200, self.owner.resource(bucket, name, obj))

    def do_DELETE(self) -> None:
        kind, bucket, name, params = self._route()
        self.owner.requests.append(("DELETE", kind))
        with self.owner._lock:
            current = self.owner._objects.get((bucket, name))
            if current is None:
                self._error(404, f"No such object: {bucket}/{name}")
                return
            if not _precondition(params, current):
                self._error(412, "Precondition Failed")
                return
            del self.owner._objects[(bucket, name)]
            self._send(204)


def object_url(endpoint: str, bucket: str, name: str) -> str:
    """The JSON API URL of one object (for tests that talk to the fake directly)."""
    return f"{endpoint}/storage/v1/b/{bucket}/o/{quote(name, safe='')}"
