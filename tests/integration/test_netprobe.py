"""``tls_connect`` gives None, and leaves nothing open, when the server will not finish a handshake.

The server here accepts and then resets (or closes) the connection, as the per-address caps do.
Under load that reset can reach the client between its ``connect()`` and its TLS wrap; the client
context below makes that order certain: a wrap of a socket that is already connected waits until
the server has dropped it.
"""

from __future__ import annotations

import gc
import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from nstance.testing.netprobe import tls_connect


class _WrapsAfterTheDrop(ssl.SSLContext):
    """A client context whose wrap of a connected socket waits until the server has dropped it."""

    dropped: threading.Event

    def wrap_socket(self, sock: socket.socket, *args: Any, **kwargs: Any) -> ssl.SSLSocket:  # type: ignore[override]
        try:
            sock.getpeername()
        except OSError:
            pass  # not connected yet: nothing to wait for
        else:
            assert self.dropped.wait(10)
        return super().wrap_socket(sock, *args, **kwargs)


@pytest.fixture(params=["reset", "close"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, _WrapsAfterTheDrop]]:
    """A listener that accepts one connection and resets (or closes) it before any handshake."""
    listener = socket.create_server(("127.0.0.1", 0))
    ctx = _WrapsAfterTheDrop(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.dropped = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        if request.param == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
        ctx.dropped.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", ctx
    finally:
        listener.close()
        thread.join(10)


def test_a_connection_the_server_drops_is_none_and_closed(server: tuple[str, _WrapsAfterTheDrop]) -> None:
    addr, ctx = server
    assert tls_connect(addr, ctx, timeout=10) is None
    assert ctx.dropped.wait(10)  # None because the server dropped it, not for another reason
    gc.collect()  # a socket left open warns here, and the suite turns warnings into errors


def test_a_refused_connection_is_none() -> None:
    with socket.create_server(("127.0.0.1", 0)) as bound:
        port = bound.getsockname()[1]
    ctx = ssl.create_default_context()
    assert tls_connect(f"127.0.0.1:{port}", ctx, timeout=10) is None
    gc.collect()
