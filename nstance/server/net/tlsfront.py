"""OpenSSL TLS in front of a grpc.aio server, so Ed25519 and ECDSA P-256 client identities both connect.

grpcio's TLS (BoringSSL as built into grpcio) offers no Ed25519 signature algorithm when it asks a
client for its certificate, so the Ed25519 identities Go agents, operators and admins hold fail the
handshake (``NO_COMMON_SIGNATURE_ALGORITHMS``). Python's ``ssl`` (OpenSSL 3) verifies them. For the
mTLS ports (agent and operator APIs) the server therefore terminates TLS here and hands plain HTTP/2
to its grpc.aio server (in the server, from a child process: ``frontproc``):

* ``TlsFront`` listens on the public address with an OpenSSL server context: TLS 1.3, ALPN ``h2``, a
  client certificate required and its chain verified against the cluster CA (Ed25519 or ECDSA P-256
  leaves, under an Ed25519 or ECDSA CA). A connection that fails the handshake never reaches gRPC.
  Connections are admitted before the handshake by a ``ConnectionLimiter`` (a cap for the port and,
  optionally, one per client address: ``frontaccept``).
* Each verified connection is forwarded over its own Unix-socket connection to the grpc.aio server,
  which listens in a private directory (mode 0700, so no other user can connect to it). Before it
  connects, the forwarding socket is bound to a name used once (``<dir>/<prefix><backend>.<n>``),
  which grpc reports as the call's ``context.peer()`` (``unix:<dir>/<prefix><backend>.<n>``).
* ``PeerTable`` maps that peer name to the DER certificate the client presented, from before the first
  byte is forwarded until the connection closes. The interceptor looks the caller's certificate up by
  ``context.peer()`` and applies the same checks as for grpc's own TLS (CA signature, validity, EKU,
  subject, role, revocation). A connection to the Unix socket that did not come through the front has
  no entry, and every call on it that needs a role is refused with UNAUTHENTICATED.

Bytes are copied between the two transports by asyncio protocols with flow control in both
directions (a full write buffer pauses reading on the other side). The module decides nothing about
who may call what; it only proves which certificate a connection presented.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import socket
import ssl
from pathlib import Path
from typing import Final, Protocol

from nstance.pki.tlspipe import HANDSHAKE_TIMEOUT, Pipe, load_key_pair
from nstance.server.net.connlimit import ConnectionLimiter
from nstance.server.net.frontaccept import Acceptor

log = logging.getLogger(__name__)

#: Unacknowledged TCP connections the listener queues (the same order as grpc core's default).
BACKLOG: Final = 1024
#: Connections a front holds when not told otherwise (what a process's open files allow at most).
UNLIMITED: Final = 1 << 20


class PeerRegistry(Protocol):
    """Where a front records which certificate stands behind a peer name (the table, or a channel to it)."""

    async def announce(self, peer: str, der: bytes) -> None:
        """Record ``peer`` -> ``der``; returns once calls from ``peer`` will find it."""

    def retract(self, peer: str) -> None:
        """Forget ``peer`` (its connection closed)."""


class PeerTable:
    """grpc peer name (``unix:<path>``) -> the DER client certificate of the connection behind it."""

    def __init__(self) -> None:
        self._certs: dict[str, bytes] = {}

    def add(self, peer: str, der: bytes) -> None:
        self._certs[peer] = der

    def remove(self, peer: str) -> None:
        self._certs.pop(peer, None)

    def clear(self) -> None:
        self._certs.clear()

    async def announce(self, peer: str, der: bytes) -> None:
        """``add``, as a ``PeerRegistry``."""
        self.add(peer, der)

    def retract(self, peer: str) -> None:
        """``remove``, as a ``PeerRegistry``."""
        self.remove(peer)

    def certificate(self, peer: str) -> bytes | None:
        """The certificate of the front connection ``peer`` names, or None for any other peer."""
        return self._certs.get(peer)

    def __len__(self) -> int:
        return len(self._certs)


def server_ssl_context(key_pem: bytes, cert_pem: bytes, ca_pem: bytes, *, scratch: Path) -> ssl.SSLContext:
    """An OpenSSL server context: TLS 1.3, ALPN h2, a client certificate required and chained to ``ca_pem``.

    ``scratch`` is a private directory: ``load_cert_chain`` only reads files, so the key and
    certificate are written there (0600) for the call and removed again.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=ca_pem.decode("ascii"))
    ctx.set_alpn_protocols(["h2"])
    load_key_pair(ctx, key_pem, cert_pem, scratch=scratch)
    return ctx


class TlsFront:
    """Terminate mTLS on a public address and forward verified connections to a Unix-socket server.

    ``directory`` is a private directory (0700) holding the backend socket ``backend`` and the
    forwarding sockets' names.
    """

    def __init__(
        self,
        ssl_context: ssl.SSLContext,
        *,
        directory: Path,
        backend: Path,
        peers: PeerRegistry | None = None,
        what: str = "mTLS",
        name_prefix: str = "",
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        limiter: ConnectionLimiter | None = None,
        limit_names: tuple[str, str] = ("max_connections", "max_connections_per_address"),
    ) -> None:
        self.ssl_context = ssl_context
        self.directory = directory
        self.backend = backend
        self.peers: PeerRegistry = peers if peers is not None else PeerTable()
        self.what = what
        self._name_prefix = name_prefix
        self._handshake_timeout = handshake_timeout
        self.limiter = limiter or ConnectionLimiter(total=UNLIMITED, per_address=None)
        self._limit_names = limit_names
        self._acceptor: Acceptor | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._names = itertools.count()

    @property
    def backend_target(self) -> str:
        """The grpc address the backend server listens on (``unix:<path>``)."""
        return f"unix:{self.backend}"

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (port 0: any free port) and return the bound port."""
        return await self.start_on(listening_socket(host, port))

    async def start_on(self, sock: socket.socket) -> int:
        """Serve on an already bound and listening socket; return its port."""
        sock.setblocking(False)
        self._acceptor = Acceptor(
            sock, self.limiter, self._handshake, what=self.what, limit_names=self._limit_names
        )
        self._acceptor.start()
        return int(sock.getsockname()[1])

    async def _handshake(self, conn: socket.socket, host: str) -> None:
        """TLS on one admitted connection; it stays counted until it closes (or its handshake fails)."""
        loop = asyncio.get_running_loop()
        closed = loop.create_future()
        try:
            await loop.connect_accepted_socket(
                lambda: Pipe(on_made=self._handshake_done, on_lost=closed),
                conn,
                ssl=self.ssl_context,
                ssl_handshake_timeout=self._handshake_timeout,
            )
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            log.debug("%s: handshake with %s failed: %s", self.what, host, exc)
            return
        await closed

    def _handshake_done(self, client: Pipe, transport: asyncio.Transport) -> None:
        transport.pause_reading()
        task = asyncio.get_running_loop().create_task(self._forward(client, transport))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _forward(self, client: Pipe, transport: asyncio.Transport) -> None:
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:  # pragma: no cover - CERT_REQUIRED refuses the handshake first
            transport.close()
            return
        loop = asyncio.get_running_loop()
        name = self.directory / f"{self._name_prefix}{self.backend.stem}.{next(self._names)}"
        peer = f"unix:{name}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        lost = loop.create_future()
        try:
            sock.bind(str(name))
            try:
                await loop.sock_connect(sock, str(self.backend))
            finally:
                with contextlib.suppress(FileNotFoundError):
                    name.unlink()
            # Known before the first byte of the connection reaches grpc.
            await self.peers.announce(peer, der)
            _, upstream = await loop.create_unix_connection(lambda: Pipe(on_lost=lost), sock=sock)
        except OSError as exc:
            sock.close()
            self.peers.retract(peer)
            log.warning("%s: cannot forward a connection to the gRPC server: %s", self.what, exc)
            transport.close()
            return
        client.attach(upstream)
        upstream.attach(client)
        if client.transport is None:  # the client left while the backend connected
            upstream.close()
        else:
            transport.resume_reading()
        try:
            await lost
        finally:
            self.peers.retract(peer)
            upstream.close()
            client.close()

    async def close(self) -> None:
        """Stop listening and close every forwarded connection."""
        if self._acceptor is not None:
            await self._acceptor.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


#: Linux's IP_FREEBIND and IPV6_FREEBIND (Python's socket module names neither).
_FREEBIND: Final = {socket.AF_INET: (socket.IPPROTO_IP, 15), socket.AF_INET6: (socket.IPPROTO_IPV6, 78)}


def listening_socket(host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket bound to ``host:port`` and listening (reuse_address, BACKLOG).

    An empty host or ``::`` listens on every interface (IPv4 too, where the system allows dual stack);
    ``0.0.0.0`` on every IPv4 interface; anything else on the first address it resolves to. An address
    this machine does not have (yet) is listened for anyway on Linux (``IP_FREEBIND``), with a warning:
    upstream's Terraform configs bind the registration, operator and agent ports to the shard's leader
    address, which reaches a machine only once its server leads (the ENI or alias IP moves there, or
    keepalived brings it), so a standby must be able to start without it; packets for it arrive only
    where the address is.
    """
    if host in ("", "::") and socket.has_dualstack_ipv6():
        sock = socket.create_server(
            ("::", port), family=socket.AF_INET6, backlog=BACKLOG, dualstack_ipv6=True
        )
    else:
        family, _, _, _, address = socket.getaddrinfo(host or "0.0.0.0", port, type=socket.SOCK_STREAM)[0]
        try:
            sock = socket.create_server(address[:2], family=family, backlog=BACKLOG)
        except OSError as exc:
            if (
                exc.errno != errno.EADDRNOTAVAIL
                or family not in _FREEBIND
                or not hasattr(socket, "SO_REUSEADDR")
            ):
                raise
            ip = str(address[0])
            sock = _freebind_server(family, (ip, port))
            log.warning(
                "%s is not an address of this machine: listening on port %d for when it arrives (the "
                "shard's leader address reaches the server that leads)",
                ip,
                port,
            )
    sock.setblocking(False)
    return sock


def _freebind_server(family: socket.AddressFamily, address: tuple[str, int]) -> socket.socket:
    """A listening socket bound with IP_FREEBIND: the address need not be configured here yet."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        level, option = _FREEBIND[family]
        sock.setsockopt(level, option, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock
