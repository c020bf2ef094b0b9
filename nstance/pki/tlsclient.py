"""Client-side OpenSSL TLS for gRPC channels, for servers that present Ed25519 certificates.

grpcio's TLS (BoringSSL as built into grpcio) does not offer Ed25519 among its signature algorithms, so
as a client it cannot verify a server that presents an Ed25519 certificate (what upstream's servers
present), and as a server it never asks for Ed25519 client signatures. ``TlsRoute`` carries a gRPC
channel over Python's ``ssl`` (OpenSSL) instead: it listens on a Unix socket in a private directory
(mode 0700), and carries every connection grpc makes to that socket over its own TLS connection to the
real server (TLS 1.2 or newer, ALPN ``h2``, the server verified against the cluster CA under the name
``nstance-server``, the client certificate presented when one is given). grpc itself speaks plain HTTP/2
to the socket.

``needs_openssl`` decides when a client needs this: when the cluster CA is Ed25519 (upstream's clusters,
whose servers present Ed25519 certificates). Otherwise grpcio's own TLS is used, as before: grpcio does
sign with an Ed25519 client key when the server offers Ed25519, which OpenSSL servers do.
``forwarded_channel`` and ``forwarded_aio_channel`` wrap a channel to the route so that closing the
channel also closes the route.

Routes run on one background event-loop thread per process, so synchronous (``nstance-admin``) and
asyncio (agent) callers use them alike. A failed TLS connection is logged with the OpenSSL reason and
grpc sees the connection close (UNAVAILABLE).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import grpc
import grpc.aio
from cryptography.hazmat.primitives.asymmetric import ed25519

from nstance.core.listener import Listener
from nstance.pki.ca import parse_certificate
from nstance.pki.tlspipe import (
    HANDSHAKE_TIMEOUT,
    Pipe,
    load_key_pair,
    private_directory,
    remove_private_directory,
)

log = logging.getLogger(__name__)

#: The name every Nstance server certificate carries (upstream's and this project's).
SERVER_NAME: Final = "nstance-server"
#: Seconds a synchronous caller waits for the background loop to open or close a route.
LOOP_CALL_TIMEOUT: Final = 30.0
#: Connections grpc may have waiting to be accepted on a route's socket.
BACKLOG: Final = 64

_T = TypeVar("_T")


def needs_openssl(ca_pem: bytes) -> bool:
    """Whether a client of the cluster with this CA must use OpenSSL TLS instead of grpcio's.

    True for an Ed25519 CA: upstream's servers, which present Ed25519 certificates, only exist in
    such clusters. The client's own key type does not matter: grpcio signs with an Ed25519 client
    key whenever the server offers Ed25519 (OpenSSL servers, upstream's and this project's, do).
    """
    return isinstance(parse_certificate(ca_pem, what="CA certificate").public_key(), ed25519.Ed25519PublicKey)


def client_ssl_context(
    ca_pem: bytes, key_pem: bytes | None = None, cert_pem: bytes | None = None, *, scratch: Path
) -> ssl.SSLContext:
    """OpenSSL client context: the server verified against ``ca_pem`` as ``nstance-server``, ALPN h2."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(cadata=ca_pem.decode("ascii"))
    ctx.set_alpn_protocols(["h2"])
    if key_pem is not None and cert_pem is not None:
        load_key_pair(ctx, key_pem, cert_pem, scratch=scratch)
    return ctx


def split_target(target: str) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` / ``dns:///host:port`` -> (host, port)."""
    text = target.strip()
    for prefix in ("dns:///", "ipv4:", "ipv6:"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"server address {target!r} is not host:port")
    return host.strip("[]"), int(port)


class _LoopThread:
    """The process's background event loop for routes (a daemon thread, started on first use)."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def run(cls, coro: Coroutine[Any, Any, _T]) -> _T:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="nstance-tls-client", daemon=True).start()
                cls._loop = loop
            loop = cls._loop
        return asyncio.run_coroutine_threadsafe(coro, loop).result(LOOP_CALL_TIMEOUT)


class TlsRoute:
    """A private Unix socket whose connections are carried over OpenSSL TLS to one server."""

    def __init__(
        self, target: str, ca_pem: bytes, key_pem: bytes | None = None, cert_pem: bytes | None = None
    ):
        self.host, self.port = split_target(target)
        self.target = target
        self.directory = private_directory("nstance-tlsc-")
        self.path = self.directory / "grpc.sock"
        self._ssl = client_ssl_context(ca_pem, key_pem, cert_pem, scratch=self.directory)
        self._listener: Listener | None = None
        self.last_error = ""

    @property
    def grpc_target(self) -> str:
        return f"unix:{self.path}"

    @classmethod
    def open(
        cls, target: str, ca_pem: bytes, key_pem: bytes | None = None, cert_pem: bytes | None = None
    ) -> TlsRoute:
        """Create the route and start listening (from any thread)."""
        route = cls(target, ca_pem, key_pem, cert_pem)
        try:
            _LoopThread.run(route._start())
        except BaseException:
            remove_private_directory(route.directory)
            raise
        return route

    async def _start(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(self.path))
            sock.listen(BACKLOG)
        except BaseException:
            sock.close()
            raise
        self._listener = Listener(sock, self._carry, what=f"TLS route to {self.target}")
        self._listener.start()

    async def _carry(self, conn: socket.socket, _host: str) -> None:
        """Carry one grpc connection over its own TLS connection until either side closes."""
        loop = asyncio.get_running_loop()
        local_lost: asyncio.Future[None] = loop.create_future()
        remote_lost: asyncio.Future[None] = loop.create_future()
        # Reading waits until the TLS connection is up: grpc's first bytes are kept by the kernel.
        local = Pipe(on_made=lambda _, transport: transport.pause_reading(), on_lost=local_lost)
        local_transport, _ = await loop.connect_accepted_socket(lambda: local, conn)
        remote_transport: asyncio.Transport | None = None
        try:
            try:
                remote_transport, remote = await loop.create_connection(
                    lambda: Pipe(on_lost=remote_lost),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=SERVER_NAME,
                    ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
                )
            except (OSError, ssl.SSLError, TimeoutError) as exc:
                self.last_error = f"TLS connection to {self.target} failed: {exc}"
                log.warning("%s", self.last_error)
                return
            local.attach(remote)
            remote.attach(local)
            if local.transport is None:  # grpc left while the TLS connection was made
                remote.close()
            else:
                local_transport.resume_reading()
            # Either side closing closes the other (``Pipe.connection_lost``), unsent bytes first.
            await asyncio.wait((local_lost, remote_lost))
        finally:
            # Both are gone by now, unless the route is closing (a cancel): then they go at once.
            carried = [(local_transport, local_lost)]
            if remote_transport is not None:
                carried.append((remote_transport, remote_lost))
            for transport, lost in carried:
                if not lost.done():
                    transport.abort()
            await asyncio.wait([lost for _, lost in carried])

    def close(self) -> None:
        """Stop listening and close every carried connection (from any thread)."""
        with contextlib.suppress(RuntimeError):
            _LoopThread.run(self._close())
        remove_private_directory(self.directory)

    async def _close(self) -> None:
        if self._listener is not None:
            await self._listener.close()


def _plain_options(options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in options if k != "grpc.ssl_target_name_override"]


class ForwardedChannel(grpc.Channel):  # type: ignore[misc]  # grpc ships no types
    """A synchronous channel over a ``TlsRoute``; closing it closes the route."""

    def __init__(self, route: TlsRoute, options: Sequence[tuple[str, Any]]) -> None:
        self.route = route
        self._channel = grpc.insecure_channel(route.grpc_target, options=_plain_options(options))

    def subscribe(self, callback: Any, try_to_connect: bool = False) -> None:
        self._channel.subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Any) -> None:
        self._channel.unsubscribe(callback)

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.unary_unary(*args, **kwargs)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.unary_stream(*args, **kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.stream_unary(*args, **kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.stream_stream(*args, **kwargs)

    def close(self) -> None:
        self._channel.close()
        self.route.close()

    def __enter__(self) -> ForwardedChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ForwardedAioChannel(grpc.aio.Channel):  # type: ignore[misc]  # grpc ships no types
    """A grpc.aio channel over a ``TlsRoute``; closing it closes the route."""

    def __init__(self, route: TlsRoute, options: Sequence[tuple[str, Any]]) -> None:
        self.route = route
        self._channel = grpc.aio.insecure_channel(route.grpc_target, options=_plain_options(options))

    async def __aenter__(self) -> ForwardedAioChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, grace: float | None = None) -> None:
        try:
            await self._channel.close(grace)
        finally:
            await asyncio.to_thread(self.route.close)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self._channel.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self._channel.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._channel.channel_ready()

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.unary_unary(*args, **kwargs)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.unary_stream(*args, **kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.stream_unary(*args, **kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.stream_stream(*args, **kwargs)


def forwarded_channel(
    target: str,
    ca_pem: bytes,
    key_pem: bytes | None = None,
    cert_pem: bytes | None = None,
    *,
    options: Sequence[tuple[str, Any]] = (),
) -> ForwardedChannel:
    """A synchronous gRPC channel to ``target`` over OpenSSL TLS (see module docstring)."""
    return ForwardedChannel(TlsRoute.open(target, ca_pem, key_pem, cert_pem), options)


def forwarded_aio_channel(
    target: str,
    ca_pem: bytes,
    key_pem: bytes | None = None,
    cert_pem: bytes | None = None,
    *,
    options: Sequence[tuple[str, Any]] = (),
) -> ForwardedAioChannel:
    """A grpc.aio channel to ``target`` over OpenSSL TLS (see module docstring).

    Opening the route takes a few milliseconds on the background loop; callers on an event loop
    may call this directly, as they would ``grpc.aio.secure_channel``.
    """
    return ForwardedAioChannel(TlsRoute.open(target, ca_pem, key_pem, cert_pem), options)
