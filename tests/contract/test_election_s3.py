"""Leader election against a real S3 API (moto_server): conditional create, takeover, renewal, release.

The unit tests prove the algorithm on the in-memory and file stores; this suite proves the S3 requests
it relies on (PutObject with If-None-Match / If-Match, DeleteObject with If-Match) behave the same
way over HTTP. Time is a ManualClock, so nothing here sleeps.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from nstance.config.cluster import LeaderElectionConfig
from nstance.core.clock import ManualClock
from nstance.objectstore.s3 import S3ObjectStore
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.server.leadership.election import Elector

S3StoreFactory = Callable[..., S3ObjectStore]
CONFIG = LeaderElectionConfig()  # frequent 5 s, leader_timeout 15 s
KEY = "leader.json"  # relative to the shard scope, as the server uses it


def _elector(store: ScopedObjectStore, clock: ManualClock, name: str) -> Elector:
    return Elector(store, KEY, elector_id=name, address=f"{name}:8991", config=CONFIG, clock=clock)


async def test_two_servers_racing_on_s3_get_exactly_one_leader(s3_store_factory: S3StoreFactory) -> None:
    bucket = s3_store_factory()
    store = ScopedObjectStore(bucket, "shard/zone-a/")
    clock = ManualClock()
    a, b = _elector(store, clock, "a"), _elector(store, clock, "b")

    await asyncio.gather(a.step(), b.step())
    clock.advance(1.0)
    await asyncio.gather(a.step(), b.step())

    assert [a.is_leader(), b.is_leader()].count(True) == 1
    winner = "a" if a.is_leader() else "b"
    doc = json.loads(bucket.get("shard/zone-a/leader.json")[0])
    assert (doc["leaderID"], doc["leaderAddr"]) == (winner, f"{winner}:8991")
    for e in (a, b):
        info = e.leader()
        assert info is not None
        assert info.leader_id == winner


async def test_stale_lock_on_s3_is_taken_over_and_the_old_leader_loses(
    s3_store_factory: S3StoreFactory,
) -> None:
    store = ScopedObjectStore(s3_store_factory(), "shard/zone-a/")
    clock = ManualClock()
    a, b = _elector(store, clock, "a"), _elector(store, clock, "b")
    await a.step()
    await b.step()
    clock.advance(5)
    await a.step()  # renewal with If-Match on S3
    await b.step()
    assert a.is_leader()

    # a stops; b sees the same ETag for leader_timeout and takes over with If-Match.
    for _ in range(3):
        clock.advance(5)
        await b.step()
    clock.advance(1)
    await b.step()
    assert b.is_leader()
    assert not a.is_leader()

    await a.step()  # a's renewal now fails its precondition on S3
    assert not a.is_leader()
    info = a.leader()
    assert info is not None
    assert info.leader_id == "b"


async def test_resign_on_s3_deletes_the_lock_conditionally(s3_store_factory: S3StoreFactory) -> None:
    bucket = s3_store_factory()
    store = ScopedObjectStore(bucket, "cluster/")
    clock = ManualClock()
    a, b = _elector(store, clock, "a"), _elector(store, clock, "b")
    await a.step()
    await b.step()

    await a.resign()
    assert not bucket.exists("cluster/leader.json")
    await b.step()
    clock.advance(1)
    await b.step()
    assert b.is_leader()


async def test_lockfile_on_s3_round_trips_through_a_fresh_reader(s3_store_factory: S3StoreFactory) -> None:
    store = ScopedObjectStore(s3_store_factory(), "shard/zone-b/")
    clock = ManualClock()
    a = _elector(store, clock, "a")
    await a.step()

    reader = _elector(store, clock, "reader")
    await reader.step()
    info = reader.leader()
    assert info is not None
    assert (info.leader_id, info.address) == ("a", "a:8991")
    own = a.leader()
    assert own is not None
    assert info.etag == own.etag, "the ETag S3 returns on GET matches the one returned on PUT"
