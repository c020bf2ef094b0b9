"""The accept loop of the front's listeners: every connection admitted by a ``ConnectionLimiter`` first.

grpcio offers a cap per port (``grpc.max_allowed_incoming_connections``) but sees no client address
before it has accepted, and no interceptor sees connections at all, so the cap per client address is
applied here, where the front accepts: ``Acceptor`` takes each connection off the listening socket,
closes it at once (before any TLS) when its address or the port is over its limit, and otherwise
serves it in its own task, counting it until that task ends. Failing accepts (out of file
descriptors) are retried after a pause instead of spinning. Refusals are logged as warnings, which the
process's ``LogThrottle`` keeps to a few lines a minute. Nothing here reads or writes a byte of the
connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Final

from nstance.server.net.connlimit import ConnectionLimiter

log = logging.getLogger(__name__)

#: Seconds to wait after a failing accept (EMFILE, ENFILE, ENOBUFS) before the next.
ACCEPT_RETRY: Final = 0.5

Serve = Callable[[socket.socket, str], Awaitable[None]]


class Acceptor:
    """Accepts on ``sock`` and hands each admitted connection (non-blocking) and its host to ``serve``.

    ``limit_names`` names the config keys of the limiter's two caps (total, per address) for the log.
    """

    def __init__(
        self,
        sock: socket.socket,
        limiter: ConnectionLimiter,
        serve: Serve,
        *,
        what: str,
        limit_names: tuple[str, str],
    ) -> None:
        self.sock = sock
        self.limiter = limiter
        self._serve = serve
        self._what = what
        self._limit_names = limit_names
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._accept(), name=f"accept {self._what}")

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(self.sock)
            except OSError as exc:
                log.warning("%s: cannot accept a connection (%s); retrying", self._what, exc)
                await asyncio.sleep(ACCEPT_RETRY)
                continue
            host = str(address[0]) if isinstance(address, tuple) else str(address)
            key = self.limiter.admit(host)
            if key is None:
                self._refused(conn, host)
                continue
            conn.setblocking(False)
            task = loop.create_task(self._run(conn, host, key))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _refused(self, conn: socket.socket, host: str) -> None:
        with contextlib.suppress(OSError):
            # RST rather than FIN: nothing of the refused connection lingers in TIME_WAIT here.
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
        limiter = self.limiter
        total_name, per_address_name = self._limit_names
        if limiter.open >= limiter.total:
            log.warning(
                "%s: refused a connection from %s: the port holds %d connections (shard.limits.%s)",
                self._what,
                host,
                limiter.open,
                total_name,
            )
        else:
            log.warning(
                "%s: refused a connection from %s: its address holds %d connections (shard.limits.%s)",
                self._what,
                host,
                limiter.held_by(host),
                per_address_name,
            )

    async def _run(self, conn: socket.socket, host: str, key: str) -> None:
        try:
            await self._serve(conn, host)
        finally:
            self.limiter.release(key)
            conn.close()

    async def close(self) -> None:
        """Stop accepting and end every connection's task."""
        tasks = [t for t in (self._task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
