"""An accept loop that owns every connection it accepts until that connection is closed.

asyncio's servers (``loop.create_server``, ``create_unix_server``, ``asyncio.start_server``) leak a
connection that arrives as they close. The loop accepts it in one turn and builds its transport in a
task a turn or two later; when ``Server.close()`` runs in between, the transport's constructor fails
an assertion (the server has no sockets left), asyncio swallows the failure, and the accepted socket
stays open until the garbage collector reports it (CPython issue gh-109564, open for 3.11 to 3.13).
A ``TlsRoute`` closing while grpc reconnected hit exactly that.

``Listener`` accepts in a reader callback of its own and hands each connection to ``serve`` in a task
created in the same turn, so there is no moment when a connection belongs to nobody. ``close`` stops
accepting, cancels those tasks, waits for them, and closes every connection whose task never got to
start. A failing accept (out of file descriptors or buffers) pauses accepting for ``ACCEPT_RETRY``
seconds instead of spinning.

``serve(conn, host)`` owns ``conn`` from its first line. The listener closes ``conn`` once ``serve``
ends, so ``serve`` must not return while a transport it built on ``conn`` may still read or write:
it waits for the transport's ``connection_lost``, or aborts it. ``open_streams`` gives a connection
the reader and writer that ``asyncio.start_server`` would have.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any, Final

log = logging.getLogger(__name__)

#: Seconds to wait after a failing accept (EMFILE, ENFILE, ENOBUFS, ENOMEM) before the next.
ACCEPT_RETRY: Final = 0.5
#: Connections accepted per readiness callback at most (the rest wait for the next turn).
ACCEPT_BATCH: Final = 100

Serve = Callable[[socket.socket, str], Awaitable[None]]


def peer_host(address: Any) -> str:
    """The host of an accepted connection's address: the IP for TCP, ``""`` for a Unix socket."""
    return str(address[0]) if isinstance(address, tuple) else ""


def reset(conn: socket.socket) -> None:
    """Close a refused connection with a reset (RST, not FIN): nothing of it lingers in TIME_WAIT here,
    and the client sees ``ConnectionResetError`` at once."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


async def open_streams(
    conn: socket.socket, *, limit: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An accepted connection as asyncio streams (``limit``: the reader's buffer, as in ``start_server``)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, conn)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def close_streams(writer: asyncio.StreamWriter, *, within: float) -> None:
    """Close a connection's streams, its unsent bytes first for up to ``within`` seconds; abort it when
    they do not go in time, the peer is gone, or this task is cancelled (the listener is closing)."""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), within)
    except asyncio.CancelledError:
        writer.transport.abort()
        raise
    except (TimeoutError, OSError):
        writer.transport.abort()


class Listener:
    """Accepts on the listening socket ``sock`` and serves each connection in its own task."""

    def __init__(self, sock: socket.socket, serve: Serve, *, what: str) -> None:
        self.sock = sock
        self._serve = serve
        self._what = what
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._tasks: dict[asyncio.Task[None], socket.socket] = {}

    def start(self) -> None:
        """Start accepting (on the running loop)."""
        self.sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.sock.fileno(), self._ready)

    def _ready(self) -> None:
        assert self._loop is not None
        for _ in range(ACCEPT_BATCH):
            try:
                conn, address = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                log.warning("%s: cannot accept a connection (%s); retrying", self._what, exc)
                self._loop.remove_reader(self.sock.fileno())
                self._retry = self._loop.call_later(ACCEPT_RETRY, self._resume)
                return
            conn.setblocking(False)
            task = self._loop.create_task(self._run(conn, peer_host(address)))
            self._tasks[task] = conn
            task.add_done_callback(self._done)

    def _resume(self) -> None:
        assert self._loop is not None
        self._retry = None
        self._loop.add_reader(self.sock.fileno(), self._ready)

    async def _run(self, conn: socket.socket, host: str) -> None:
        await self._serve(conn, host)

    def _done(self, task: asyncio.Task[None]) -> None:
        # Here, not in ``_run``: a task cancelled before its first step never runs any of ``_run``.
        self._tasks.pop(task).close()
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: serving a connection failed", self._what, exc_info=task.exception())

    async def close(self) -> None:
        """Stop accepting, close the listening socket, and end every connection's task."""
        if self.sock.fileno() < 0:  # closed already
            return
        if self._retry is not None:  # a retry is the only way back to accepting
            self._retry.cancel()
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
        self.sock.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
