"""A ``TlsRoute`` that closes while grpc connects to it closes that connection too.

asyncio's own servers leak a connection accepted in the loop turn before ``Server.close()`` (CPython
gh-109564: the transport is built a turn later, its constructor fails an assertion once the server is
closed, and the failure is swallowed), which the garbage collector reported once as an unclosed
transport on a route's socket. The connection here is made on the route's loop and the route closed
after 0 to 7 further turns, which covers every turn an accept can be in flight.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import warnings

import pytest

from nstance.pki.ca import create_ca
from nstance.pki.tlsclient import TlsRoute, _LoopThread


def _connect_and_close(turns: int) -> None:
    """Connect to a fresh route, then close it ``turns`` loop turns later, on the route's own loop."""
    ca = create_ca(key_type="ed25519")
    route = TlsRoute.open("127.0.0.1:1", ca.cert_pem)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    async def connect_then_close() -> None:
        client.connect(str(route.path))  # in the listen backlog at once
        for _ in range(turns):
            await asyncio.sleep(0)
        await route._close()  # on the route's loop, so the turn it lands in is known

    try:
        _LoopThread.run(connect_then_close())
    finally:
        route.close()
        client.close()


@pytest.mark.parametrize("turns", range(8))
def test_a_connection_arriving_as_the_route_closes_is_closed_with_it(turns: int) -> None:
    _connect_and_close(turns)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, f"closed {turns} loop turns after the connect: {leaks}"
