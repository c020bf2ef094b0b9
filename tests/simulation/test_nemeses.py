"""The storage nemesis itself: what it damages is what a person later repairs."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest

from nstance.objectstore.memory import MemoryObjectStore
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
