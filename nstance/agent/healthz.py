"""``GET /healthz`` for the agent (NSTANCE_HEALTH_ADDR): 200 when registered and the health stream is up.

Responsible for a tiny HTTP/1.1 responder on asyncio streams: ``/healthz`` answers 200 ``ok`` or 503
with a one-line reason taken from AgentState; any other path is 404. It does not decide health itself
and serves nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Final

from nstance.agent.state import AgentState
from nstance.core.hostport import split_host_port
from nstance.core.listener import Listener, close_streams, open_streams

log = logging.getLogger("nstance.agent.healthz")

#: Bytes a request line or header line may take (asyncio's stream default).
READ_LIMIT: Final = 2**16
#: Seconds an answer may take to go out once the connection is closing.
CLOSE_WITHIN: Final = 5.0

_REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
    400: "Bad Request",
}


def listen_address(addr: str) -> tuple[str, int]:
    """``host:port``, ``:port`` or ``[v6]:port`` → (host, port) to listen on; an empty host means all
    interfaces, port 0 a free port. Raises ValueError for anything else."""
    parsed = split_host_port(addr, any_port=True)
    if parsed is None:
        raise ValueError(f"{addr!r} is not host:port with a port from 0 to 65535")
    host, port = parsed
    return host.strip("[]") or "0.0.0.0", port


async def serve_healthz(addr: str, state: AgentState) -> Listener:
    """Start listening on ``addr``; the caller closes the returned listener."""
    host, port = listen_address(addr)

    async def handle(conn: socket.socket, _peer: str) -> None:
        reader, writer = await open_streams(conn, limit=READ_LIMIT)
        try:
            request_line = await asyncio.wait_for(reader.readline(), timeout=5)
            while True:  # drain headers
                line = await asyncio.wait_for(reader.readline(), timeout=5)
                if line in (b"\r\n", b"\n", b""):
                    break
            parts = request_line.decode("latin-1").split()
            if len(parts) < 2:
                status, body = 400, "bad request"
            elif parts[0] not in ("GET", "HEAD"):
                status, body = 405, "method not allowed"
            elif parts[1].split("?", 1)[0] != "/healthz":
                status, body = 404, "not found"
            else:
                ok, reason = state.healthz()
                status, body = (200 if ok else 503), reason
            payload = body.replace("\n", " ").encode()  # "ok" exactly, as upstream answers
            head = (
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
            ).encode()
            writer.write(head if parts and parts[0] == "HEAD" else head + payload)
            await writer.drain()
        except (TimeoutError, ConnectionError, OSError):
            pass
        finally:
            await close_streams(writer, within=CLOSE_WITHIN)

    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = Listener(socket.create_server(address[:2], family=family), handle, what="agent /healthz")
    listener.start()
    log.info("serving /healthz on %s", addr)
    return listener
