"""A simulated server's task that dies with its process (``SimCrash``) is not reported as an error."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from nstance.simulation.servers import CURRENT, Gate, Incarnation, SimCrash, task_factory


def test_a_task_ended_by_its_servers_crash_is_not_an_unretrieved_exception() -> None:
    reported: list[dict[str, Any]] = []
    loop = asyncio.new_event_loop()
    loop.set_task_factory(task_factory)
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    inc = Incarnation(server="s1", number=1, gate=Gate("s1#1"))

    async def dies() -> None:
        inc.gate.alive = False  # as a crash at a fault point does
        raise SimCrash(inc.name)

    async def fails() -> None:
        raise RuntimeError("a real bug")

    async def main() -> None:
        CURRENT.set(inc)
        for coro in (fails(), dies()):
            task = asyncio.get_running_loop().create_task(coro)
            await asyncio.wait([task])
            del task

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    gc.collect()
    # The crash is the simulated process dying, not news; a live server's failure is still reported.
    assert [type(c.get("exception")) for c in reported] == [RuntimeError]
