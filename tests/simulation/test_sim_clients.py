"""The simulation's clients (agents, operator) fail a call the way real gRPC clients do.

When the server serving a call crashes or stops the task that served it, a real client's call fails
(UNAVAILABLE) and the client carries on with its retries. A simulated client that died with the
server instead would sit "alive" forever without registering or reporting, and the simulation would
then blame the server for replacing it (issue 14: seed 104729085, an agent whose registration was
cut off by a crash at the after-registration-claim fault point).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from nstance.providers.base import ProviderUnavailable
from nstance.simulation.world import World


def _world() -> Any:
    return SimpleNamespace(leader=lambda: SimpleNamespace(name="s1#1"))


async def test_a_call_cut_off_by_the_server_fails_instead_of_ending_the_client() -> None:
    async def served(_inc: object) -> None:
        inner = asyncio.ensure_future(asyncio.sleep(3600))  # a task of the serving server
        asyncio.get_running_loop().call_soon(inner.cancel)  # ... which the server's crash cancels
        await inner

    with pytest.raises(ProviderUnavailable, match="s1#1 dropped the call"):
        await World.call_leader(_world(), served)


async def test_stopping_the_client_itself_still_stops_it() -> None:
    started = asyncio.Event()

    async def served(_inc: object) -> None:
        started.set()
        await asyncio.sleep(3600)

    call = asyncio.ensure_future(World.call_leader(_world(), served))
    await started.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
