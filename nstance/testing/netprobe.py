"""Raw TCP and TLS probes for tests that throw malformed traffic at a server's ports.

``exchange`` writes bytes to a port the way a broken or hostile client does (all at once, or in
dribbles with pauses, slowloris style), then reads until the server closes the connection and
returns what it sent back; a server that does not close within ``within`` seconds fails the
probe with ``ProbeTimeout``, and ``on_write`` tells a test how far a dribbling client has got.
``client_hello`` is a genuine TLS ClientHello record (made with the ``ssl`` module, never sent
anywhere by it) to send before garbage; ``tls_exchange`` completes a real TLS handshake (optionally
with a client certificate) and then writes bytes inside the tunnel. ``tls_connect`` is the blocking
form for tests that hold connections open: a finished handshake, or None when the server refused,
reset or closed the connection.

Used by the security, integration and compatibility suites; nothing in the product imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


class ProbeTimeout(AssertionError):
    """The server kept the connection open (without closing it) longer than the probe allows."""


def _host_port(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


async def _drain_until_closed(reader: asyncio.StreamReader, within: float, what: str) -> bytes:
    received = bytearray()
    try:
        async with asyncio.timeout(within):
            while chunk := await reader.read(65536):
                received += chunk
    except TimeoutError:
        raise ProbeTimeout(f"{what}: still open after {within:g}s ({len(received)} bytes received)") from None
    except (ConnectionError, ssl.SSLError):
        pass  # a reset or a TLS alert closes the connection as surely as a FIN
    return bytes(received)


async def exchange(
    addr: str,
    chunks: bytes | Sequence[bytes],
    *,
    pause: float = 0.0,
    half_close: bool = False,
    within: float = 10.0,
    on_write: Callable[[int], None] | None = None,
) -> bytes:
    """Send ``chunks`` to ``addr`` (``pause`` seconds apart), read until the server closes, return it.

    ``on_write(n)`` is called once the ``n``-th chunk has been handed to the socket.

    With ``half_close`` the write side is shut after the last chunk (a client that says it is done);
    without it the server must decide on its own to close. Writes the server refuses by closing are
    not an error: the probe then only reports what was received.
    """
    parts = [chunks] if isinstance(chunks, bytes) else list(chunks)
    host, port = _host_port(addr)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        with contextlib.suppress(ConnectionError):
            for index, chunk in enumerate(parts):
                if index and pause:
                    await asyncio.sleep(pause)
                writer.write(chunk)
                await writer.drain()
                if on_write is not None:
                    on_write(index + 1)
            if half_close and writer.can_write_eof():
                writer.write_eof()
        return await _drain_until_closed(reader, within, f"{addr} after {len(parts)} write(s)")
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


def client_hello(server_name: str = "nstance-server", alpn: Sequence[str] = ("h2",)) -> bytes:
    """The bytes of a real TLS ClientHello for ``server_name`` (nothing is sent by this function)."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(list(alpn))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def tls_context(
    ca_pem: bytes, *, cert_pem: bytes | None = None, key_pem: bytes | None = None
) -> ssl.SSLContext:
    """A client context trusting ``ca_pem``, offering ALPN ``h2``, with an optional client identity."""
    context = ssl.create_default_context(cadata=ca_pem.decode("ascii"))
    context.set_alpn_protocols(["h2"])
    if cert_pem is not None and key_pem is not None:
        with tempfile.TemporaryDirectory() as tmp:  # the ssl module loads identities from files only
            cert, key = Path(tmp, "identity.crt"), Path(tmp, "identity.key")
            cert.write_bytes(cert_pem)
            key.write_bytes(key_pem)
            context.load_cert_chain(cert, key)
    return context


async def tls_exchange(
    addr: str,
    context: ssl.SSLContext,
    data: bytes,
    *,
    server_name: str = "nstance-server",
    within: float = 10.0,
) -> bytes:
    """Complete a TLS handshake with ``addr``, send ``data`` inside it, read until the server closes."""
    host, port = _host_port(addr)
    reader, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname=server_name)
    try:
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            writer.write(data)
            await writer.drain()
        return await _drain_until_closed(reader, within, f"{addr} (inside TLS)")
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


def tls_connect(
    addr: str,
    context: ssl.SSLContext,
    *,
    server_name: str | None = "nstance-server",
    source: str | None = None,
    timeout: float = 20.0,
) -> ssl.SSLSocket | None:
    """A blocking TLS connection to ``addr`` (from ``source``) whose handshake finished, else None.

    None when the server refused, reset or closed the connection before the handshake finished, and
    then nothing is left open. The socket is wrapped before it connects, never after: wrapping a
    connected socket that the server has already reset raises from inside ``ssl.SSLSocket``'s
    constructor, and the half-built socket, which owns the descriptor by then, is never closed.
    """
    host, port = _host_port(addr)
    raw = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        raw.settimeout(timeout)
        if source is not None:
            raw.bind((source, 0))
        conn = context.wrap_socket(raw, server_hostname=server_name, do_handshake_on_connect=False)
    finally:
        raw.close()  # a successful wrap detached it, so this closes only a socket the wrap never took
    try:
        conn.connect((host, port))
        conn.do_handshake()
    except OSError:  # ssl.SSLError included
        conn.close()
        return None
    except BaseException:
        conn.close()
        raise
    return conn
