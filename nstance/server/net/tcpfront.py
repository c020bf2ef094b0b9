"""A plain TCP front for the registration port: connections admitted per client address, bytes forwarded.

The registration port needs no client certificate, so anyone who reaches it can open connections; a
cap for the whole port alone lets one address take every slot. grpcio cannot limit per address (it
has no hook between accept and its own TLS), so the port is served like the mTLS ports: the front
process accepts on the public address (``frontaccept``: a cap for the port and one per client
address, refused connections closed before a byte is read) and copies each admitted connection's
bytes, TLS and all, to the registration gRPC server on a private Unix socket, where grpcio's own TLS
(and its handshake and idle timeouts) still apply. The forwarding socket is bound to a name that
carries the client's address (``<dir>/<prefix><backend>.<n>.<host>``), which grpc reports as the
call's ``context.peer()``, so refusals in the server's log still say who called.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from pathlib import Path

from nstance.pki.tlspipe import Pipe
from nstance.server.net.connlimit import ConnectionLimiter
from nstance.server.net.frontaccept import Acceptor

log = logging.getLogger(__name__)

#: Longest client address put into a forwarding socket's name (a Unix socket path has 108 bytes).
MAX_HOST_IN_NAME = 45


class TcpFront:
    """Forward admitted TCP connections on one listening socket to the Unix socket ``backend``."""

    def __init__(
        self,
        *,
        directory: Path,
        backend: Path,
        limiter: ConnectionLimiter,
        limit_names: tuple[str, str],
        what: str = "registration",
        name_prefix: str = "",
    ) -> None:
        self.directory = directory
        self.backend = backend
        self.limiter = limiter
        self.what = what
        self._limit_names = limit_names
        self._name_prefix = name_prefix
        self._names = itertools.count()
        self._acceptor: Acceptor | None = None

    async def start_on(self, sock: socket.socket) -> int:
        """Serve on an already bound and listening socket; return its port."""
        sock.setblocking(False)
        self._acceptor = Acceptor(
            sock, self.limiter, self._forward, what=self.what, limit_names=self._limit_names
        )
        self._acceptor.start()
        return int(sock.getsockname()[1])

    async def _forward(self, conn: socket.socket, host: str) -> None:
        loop = asyncio.get_running_loop()
        label = host[:MAX_HOST_IN_NAME].replace("/", "_")
        name = self.directory / f"{self._name_prefix}{self.backend.stem}.{next(self._names)}.{label}"
        upstream_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream_sock.setblocking(False)
        client_lost = loop.create_future()
        upstream_lost = loop.create_future()
        try:
            upstream_sock.bind(str(name))
            try:
                await loop.sock_connect(upstream_sock, str(self.backend))
            finally:
                with contextlib.suppress(FileNotFoundError):
                    name.unlink()
            _, upstream = await loop.create_unix_connection(
                lambda: Pipe(on_lost=upstream_lost), sock=upstream_sock
            )
        except OSError as exc:
            upstream_sock.close()
            log.warning("%s: cannot forward a connection to the gRPC server: %s", self.what, exc)
            return
        try:
            _, client = await loop.connect_accepted_socket(lambda: Pipe(on_lost=client_lost), conn)
        except OSError:  # the client left before it was taken on
            upstream.close()
            return
        client.attach(upstream)
        upstream.attach(client)
        try:
            await asyncio.wait({client_lost, upstream_lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            upstream.close()
            client.close()

    async def close(self) -> None:
        """Stop listening and close every forwarded connection."""
        if self._acceptor is not None:
            await self._acceptor.close()
