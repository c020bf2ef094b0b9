"""The front's listeners admit every connection through a ``ConnectionLimiter`` first.

grpcio offers a cap per port (``grpc.max_allowed_incoming_connections``) but sees no client address
before it has accepted, and no interceptor sees connections at all, so the cap per client address is
applied here, where the front accepts: ``Acceptor`` serves each connection that ``core.listener``
accepts only once its address and the port are under their limits, counting it until it ends, and
closes the others at once (before any TLS). Refusals are logged as warnings, which the process's
``LogThrottle`` keeps to a few lines a minute. Nothing here reads or writes a byte of the connections.
"""

from __future__ import annotations

import logging
import socket

from nstance.core.listener import Listener, Serve, reset
from nstance.server.net.connlimit import ConnectionLimiter

log = logging.getLogger(__name__)


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
        self._listener = Listener(sock, self._admit, what=what)

    def start(self) -> None:
        self._listener.start()

    async def _admit(self, conn: socket.socket, host: str) -> None:
        key = self.limiter.admit(host)
        if key is None:
            self._refused(conn, host)
            return
        try:
            await self._serve(conn, host)
        finally:
            self.limiter.release(key)

    def _refused(self, conn: socket.socket, host: str) -> None:
        reset(conn)
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

    async def close(self) -> None:
        """Stop accepting, close the listening socket, and end every connection's task."""
        await self._listener.close()
