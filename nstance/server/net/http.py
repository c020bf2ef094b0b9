"""The shard server's plain-HTTP health and metrics endpoint (``shard.bind.health_addr``).

A deliberately tiny HTTP/1.1 server on asyncio streams (accepted by ``core.listener``, bound like
the front's ports): one request per connection
(``Connection: close``); a small request body is read and discarded. Routes:

* every path and method but the two below — readiness, as upstream serves it on ``/`` as a
  catch-all (``/health``, ``/``, ``/healthz``, ``POST /``, ...; HEAD gets the headers only): 200
  ``ok: leader`` / ``ok: standby (leader: ADDR)`` once the shard config is loaded and every API
  listens, else 503 ``config not loaded: <the exact load error>`` or ``starting: <what start-up waits
  for>``. A server that runs on a last good view (the config in storage became unreadable, empty or
  vanished) answers 200 ``degraded: leader; config: <reason>`` (or ``degraded: standby (leader:
  ADDR); ...``): still alive and serving, so a load balancer or supervisor keeps it, while the first
  word tells monitoring and operators that something needs fixing (the header ``X-Nstance-Health:
  degraded`` says the same for probes that only see headers);
* ``GET``/``HEAD /leader/health`` — 200 ``leader`` only on the shard leader, else 503 ``standby;
  leader: ADDR`` (for load balancers that must reach the leader only); with ``shard.leader_network``
  a second line says where the leader address stands (``leader network: 10.0.0.10 ready``), and a
  degraded leader adds a ``degraded: <reason>`` line (it still leads: it is the only server that may
  act);
* ``GET``/``HEAD /metrics`` — the Prometheus text exposition of ``Metrics``.

The request target may be a path, an absolute URL (its path counts) or ``*``. It is hardened against
garbage and slow clients: the request line and headers must arrive within ``READ_TIMEOUT`` seconds
(else 408) and fit in ``MAX_HEADER_BYTES`` (else 431); a malformed request line gets 400; a body of
at most ``MAX_BODY_BYTES`` is read within the same time, a larger or chunked one is left unread;
beyond ``max_connections`` connections at once, new ones are closed unanswered.
State comes from a ``HealthSource``; this module never changes it and serves nothing but these
routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from http import HTTPStatus
from typing import Final, Protocol
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST

from nstance.core.listener import Listener, close_streams, open_streams, reset
from nstance.server.net.tlsfront import listening_socket
from nstance.server.state.metrics import Metrics

logger = logging.getLogger(__name__)

READ_TIMEOUT: Final = 5.0
WRITE_TIMEOUT: Final = 5.0
MAX_HEADER_BYTES: Final = 8 * 1024
#: Largest request body read (and discarded) before answering; a larger one is left unread.
MAX_BODY_BYTES: Final = 64 * 1024
TEXT: Final = "text/plain; charset=utf-8"
#: A method is an RFC 9110 token (upstream's Go server takes any, and answers health to each).
_METHOD = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class HealthSource(Protocol):
    """What the health endpoint reports on."""

    def config_error(self) -> str | None:
        """None when the shard config is loaded; else the exact error of the last load attempt."""
        ...

    def starting(self) -> str | None:
        """None once every gRPC API listens; else what start-up is still waiting for."""
        ...

    def is_leader(self) -> bool:
        """Whether this process holds the shard leader lock."""
        ...

    def leader_address(self) -> str:
        """The shard leader's address as recorded in its lock file ('' when unknown)."""
        ...

    def leader_network_status(self) -> str:
        """Where the leader address stands on this server ('' when none is configured)."""
        ...

    def degraded(self) -> str | None:
        """None when healthy; else why this server runs on a last good view (one line)."""
        ...


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def _read_head(reader: asyncio.StreamReader) -> list[bytes]:
    """Request line and header lines (without line ends), enforcing the size limit."""
    lines: list[bytes] = []
    total = 0
    while True:
        try:
            line = await reader.readline()
        except (ValueError, asyncio.LimitOverrunError) as exc:  # one line longer than the stream limit
            raise _BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request header too large") from exc
        total += len(line)
        if total > MAX_HEADER_BYTES:
            raise _BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request header too large")
        if not line.endswith(b"\n"):  # EOF before the end of the header
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "incomplete request")
        stripped = line.rstrip(b"\r\n")
        if not stripped:
            if not lines:  # tolerate blank lines before the request line (RFC 9112 §2.2)
                continue
            return lines
        lines.append(stripped)


def _parse_request_line(line: bytes) -> tuple[str, str]:
    """``(method, path)`` of a request line; the path of an absolute URL, ``*`` as it is."""
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError as exc:
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed request line") from exc
    parts = text.split(" ")
    if len(parts) != 3 or not _METHOD.fullmatch(parts[0]):
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed request line")
    if target.startswith("/") or target == "*":
        return method, target.partition("?")[0]
    url = urlsplit(target)
    if url.scheme.lower() in ("http", "https") and url.netloc and target.isprintable():
        return method, url.path or "/"
    raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed request line")


def _content_length(headers: list[bytes]) -> int:
    """The request's Content-Length (0 when absent); -1 for a chunked body or an unusable length."""
    length = 0
    for line in headers:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            return -1
        if name == b"content-length":
            text = value.strip()
            if not text.isdigit():
                return -1
            length = int(text)
    return length


async def _discard_body(reader: asyncio.StreamReader, headers: list[bytes]) -> None:
    """Read a small body so closing the connection does not reset it before the client reads."""
    length = _content_length(headers)
    if 0 < length <= MAX_BODY_BYTES:
        with contextlib.suppress(asyncio.IncompleteReadError, TimeoutError):
            await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT)


class HealthServer:
    """Serves health and metrics over plain HTTP for one shard server."""

    def __init__(self, source: HealthSource, metrics: Metrics, *, max_connections: int = 32) -> None:
        self._source = source
        self._metrics = metrics
        self._max_connections = max_connections
        self._listener: Listener | None = None
        self._open = 0

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (port 0 picks a free one); returns the bound port."""
        if self._listener is not None:
            raise RuntimeError("HealthServer is already started")
        sock = listening_socket(host, port)
        self._listener = Listener(sock, self._accept, what="health endpoint")
        self._listener.start()
        bound: int = sock.getsockname()[1]
        logger.debug("health endpoint listening on %s:%d", host, bound)
        return bound

    async def close(self) -> None:
        """Stop listening and drop connections still being served."""
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.close()

    # --- connections --------------------------------------------------------------------------

    async def _accept(self, conn: socket.socket, host: str) -> None:
        if self._open >= self._max_connections:
            reset(conn)  # a flood: free the descriptor at once, answer nothing
            return
        self._open += 1
        try:
            # limit: a single line longer than this raises instead of buffering without bound.
            reader, writer = await open_streams(conn, limit=MAX_HEADER_BYTES)
            try:
                await self._serve(reader, writer)
            finally:
                await close_streams(writer, within=WRITE_TIMEOUT)
        finally:
            self._open -= 1

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head_only = False
        try:
            try:
                lines = await asyncio.wait_for(_read_head(reader), READ_TIMEOUT)
            except TimeoutError as exc:
                raise _BadRequest(HTTPStatus.REQUEST_TIMEOUT, "request not received in time") from exc
            method, path = _parse_request_line(lines[0])
            head_only = method == "HEAD"
            await _discard_body(reader, lines[1:])
            status, content_type, body = self._route(method, path)
            extra = []
            if content_type == TEXT and body.startswith(b"degraded"):
                extra.append(("X-Nstance-Health", "degraded"))
        except _BadRequest as exc:
            status, content_type, body, extra = exc.status, TEXT, f"{exc.message}\n".encode(), []
        except ConnectionError:
            return
        except Exception:
            logger.exception("health endpoint failed to answer a request")
            status, content_type, body, extra = (
                HTTPStatus.INTERNAL_SERVER_ERROR,
                TEXT,
                b"internal error\n",
                [],
            )
        await self._respond(writer, status, content_type, body, extra, head_only)

    def _route(self, method: str, path: str) -> tuple[HTTPStatus, str, bytes]:
        if method in ("GET", "HEAD") and path == "/leader/health":
            return self._leader_health()
        if method in ("GET", "HEAD") and path == "/metrics":
            return HTTPStatus.OK, CONTENT_TYPE_LATEST, self._metrics.render()
        return self._health()  # upstream's catch-all: any other path, any method

    def _leader_text(self) -> str:
        return self._source.leader_address() or "unknown"

    def _health(self) -> tuple[HTTPStatus, str, bytes]:
        error = self._source.config_error()
        if error is not None:
            return HTTPStatus.SERVICE_UNAVAILABLE, TEXT, f"config not loaded: {error}\n".encode()
        waiting = self._source.starting()
        if waiting is not None:
            return HTTPStatus.SERVICE_UNAVAILABLE, TEXT, f"starting: {waiting}\n".encode()
        role = "leader" if self._source.is_leader() else f"standby (leader: {self._leader_text()})"
        degraded = self._source.degraded()
        if degraded is not None:
            return HTTPStatus.OK, TEXT, f"degraded: {role}; {degraded}\n".encode()
        return HTTPStatus.OK, TEXT, f"ok: {role}\n".encode()

    def _leader_health(self) -> tuple[HTTPStatus, str, bytes]:
        if self._source.is_leader():
            network = self._source.leader_network_status()
            extra = f"leader network: {network}\n" if network else ""
            degraded = self._source.degraded()
            if degraded is not None:
                extra += f"degraded: {degraded}\n"
            return HTTPStatus.OK, TEXT, f"leader\n{extra}".encode()
        return HTTPStatus.SERVICE_UNAVAILABLE, TEXT, f"standby; leader: {self._leader_text()}\n".encode()

    async def _respond(
        self,
        writer: asyncio.StreamWriter,
        status: HTTPStatus,
        content_type: str,
        body: bytes,
        extra: list[tuple[str, str]],
        head_only: bool,
    ) -> None:
        headers = [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
            ("Connection", "close"),
            *extra,
        ]
        head = f"HTTP/1.1 {status.value} {status.phrase}\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers) + "\r\n"
        try:
            writer.write(head.encode("latin-1") + (b"" if head_only else body))
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
        except (ConnectionError, TimeoutError):
            logger.debug("health endpoint client went away before the response was sent")
