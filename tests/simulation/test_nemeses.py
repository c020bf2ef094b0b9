"""The nemeses themselves: what storage damage leaves is what a person repairs, and a blip stays a blip."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest

from nstance.objectstore.memory import MemoryObjectStore
from nstance.simulation.agents import AgentState
from nstance.simulation.faults import BLIP_MAX, agent_fault
from nstance.simulation.nemeses import DAMAGE, StorageNemeses

if TYPE_CHECKING:
    from nstance.simulation.world import World

KEY = "shard/zone-a/instance/default.019b0000-0000-7000-8000-000000000000-app.json"
GOOD = b'{"instance_id": "app06example"}'


async def test_a_record_damaged_twice_before_its_restore_gets_its_good_bytes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Seed 314159212 of the sweep: the second damage took the first one's garbage for the original,
    # and the "restore" wrote garbage back; the server rightly kept the VM its unreadable record might
    # describe, and the end-state check saw a VM with no live record.
    store = MemoryObjectStore()
    store.put(KEY, GOOD)
    spawned: list[Coroutine[Any, Any, None]] = []
    world = SimpleNamespace(
        seed=1, base_store=store, trace=lambda _line: None, spawn=lambda _o, coro, _n: spawned.append(coro)
    )
    nemesis = StorageNemeses(cast("World", world), "zone-a", drawn=False)
    draws = iter([DAMAGE[0], DAMAGE[2]])  # two different kinds of damage, one after the other
    monkeypatch.setattr(nemesis.rng, "choice", lambda seq: next(draws) if seq is DAMAGE else seq[0])
    nemesis._corrupt_record()
    nemesis._corrupt_record()
    assert store.get(KEY)[0] == DAMAGE[2]

    async def at_once(_delay: float) -> None:
        return None

    monkeypatch.setattr(asyncio, "sleep", at_once)
    for restore in spawned:  # the first restore finds the second damage and leaves it
        await restore
    assert store.get(KEY)[0] == GOOD


def test_a_blip_never_extends_a_blip_that_is_still_running() -> None:
    # Seed 948000217 of a sweep: a second blip landed 10 s into a 12 s one and kept the agent away for
    # 22.7 s, 32 s between two of its reports, past the missed-report window; the server rightly
    # replaced it, and the check (a blip never causes a replacement) blamed the server.
    now = [100.0]
    agent = AgentState(instance_id="app06example", registered=True)
    lines: list[str] = []
    world = SimpleNamespace(
        agents={agent.instance_id: agent},
        clock=SimpleNamespace(monotonic=lambda: now[0]),
        stats=Counter(),
        trace=lines.append,
    )
    rng = random.Random(7)
    agent_fault(cast("World", world), rng, "blip")
    first_end = agent.blip_until
    assert now[0] + 1.0 <= first_end <= now[0] + BLIP_MAX
    now[0] = first_end - 0.5  # still in the first blip
    agent_fault(cast("World", world), rng, "blip")
    assert agent.blip_until == first_end
    assert world.stats["blips"] == 1
    assert lines[-1].endswith("is still in a blip: no second one")
    now[0] = first_end + 0.5  # the agent is back: a new blip may start
    agent_fault(cast("World", world), rng, "blip")
    assert world.stats["blips"] == 2
    assert agent.blip_until > first_end
