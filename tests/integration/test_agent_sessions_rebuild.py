"""An agent session opened before the leader rebuilt its cache is checked against the rebuilt cache.

A server that steps down and leads again (a corrupt cache repaired, a lease won back) keeps its agents'
sessions, which were opened against the cache as it was. Found by the simulation (seed 913000122, a
health stream accepted for an instance the leader no longer held): an instance whose record had become
unreadable was left out of the rebuilt cache, yet its agent went on reporting through the old session.
Now the rebuilt cache is the judge: such a stream ends at its next message and a new one is refused,
while the streams of instances the cache still holds carry on untouched.
(In-process leader on the sim provider, as in test_shard_cloud_features.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_shard_cloud_features import Harness

from nstance.core.errors import NotFound
from nstance.server.agents.hub import HealthReport
from nstance.server.state import records
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(60)


def _stream(iid: str, gate: asyncio.Event) -> AsyncIterator[HealthReport]:
    async def reports() -> AsyncIterator[HealthReport]:
        yield HealthReport(instance_id=iid, count=1)
        await gate.wait()
        yield HealthReport(instance_id=iid, count=2)

    return reports()


async def test_a_stream_the_rebuilt_cache_has_no_row_for_ends_and_others_carry_on(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.shard.start_leading()
    try:
        await eventually(lambda: len(h.rows()) == 2, within=10, what="the group's two instances")
        gone, kept = (row.id for row in h.rows())
        gate = asyncio.Event()
        streams = {
            iid: asyncio.create_task(h.shard.agents.health(iid, _stream(iid, gate))) for iid in (gone, kept)
        }
        await eventually(
            lambda: all(h.shard.agents.connected(iid) for iid in streams), within=10, what="both streams open"
        )
        # One record becomes unreadable, then the cache is found corrupt: the leader steps down, starts an
        # empty cache and leads again, rebuilding it from the records (what CacheRepair does).
        h.store.put(records.record_key("default", gone), b"{not json")
        await h.shard.stop_leading(grace=1)
        h.db.replace_corrupt_file()
        await h.shard.start_leading()
        assert h.shard.leading

        gate.set()
        with pytest.raises(NotFound):
            await streams[gone]
        await streams[kept]  # ended by its reports running out, not refused
        with pytest.raises(NotFound):
            await h.shard.agents.health(gone, _stream(gone, gate))
        await h.shard.agents.health(kept, _stream(kept, gate))
    finally:
        await h.shard.stop_leading(grace=1)
        h.db.close()
