"""A deposed shard server changes nothing, and a wall-clock step on the leader decides nothing.

In-process shard (real SQLite, in-memory object store, sim provider, injected clock), driven without
gRPC. The first tests are the class behind "a deposed server writes": once leadership is lost, no
path may write an instance record or mutate the provider - not a recovery that is retrying, not a
provider sync whose listing came back after the loss. The last ones are the class behind "time
replaces instances": a 30-minute or 2-hour wall-clock step on the leader must not make an agent look
silent, a drain due, or a booting VM abandoned.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from test_shard_gc import KEY, Harness

from nstance.core.errors import Unavailable
from nstance.db import repo
from nstance.providers.base import ProviderInstance
from nstance.server.leadership import session as session_module
from nstance.server.reconcile.gc import gc_cycle
from nstance.server.reconcile.recovery import sync_provider
from nstance.server.state.fencing import NotLeader
from nstance.testing.waiting import eventually


class WriteLog:
    """Counts the writes that reach the object store behind the shard's fenced handle."""

    def __init__(self, h: Harness) -> None:
        self.writes: list[str] = []
        for name in ("put", "put_if_match", "delete"):
            original = getattr(h.store, name)

            def wrapped(key: str, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                self.writes.append(key)
                return _original(key, *args, **kwargs)

            setattr(h.store, name, wrapped)


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path, size=2)
    yield harness
    harness.db.close()


class HourBackoff:
    """A recovery backoff that waits an hour: only cancellation ends such a wait."""

    def __init__(self, **_: Any) -> None:
        pass

    def delay(self, attempt: int) -> float:
        return 3600.0


async def test_a_recovery_that_is_retrying_stops_at_once_when_leadership_is_lost(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_module, "Backoff", HourBackoff)
    failures = 0

    def unavailable(prefix: str = "") -> list[str]:
        nonlocal failures
        failures += 1
        raise Unavailable("simulated 503 listing the records")

    h.store.list = unavailable  # type: ignore[method-assign]
    log = WriteLog(h)
    recovery = asyncio.create_task(h.shard.start_leading())
    await eventually(lambda: failures >= 1, what="the first failed recovery attempt")

    h.leader.leading = False
    await asyncio.wait_for(h.shard.stop_leading(), timeout=10.0)  # not after the hour-long backoff

    await asyncio.wait_for(recovery, timeout=5.0)  # start_leading returns: its recovery was cancelled
    assert not h.shard.leading
    assert failures == 1  # it did not retry after the loss
    assert log.writes == []


async def test_a_listing_that_returns_after_the_loss_adopts_nothing(h: Harness) -> None:
    await h.reconcile()  # two instances, rows with provider ids, records written
    await h.shard.ops.followups.settled()
    rows = h.rows()
    with h.db.session() as session:  # as after a crash between the create and its record update
        for row in rows:
            repo.set_provider_details_many(
                session,
                [{"instance_id": row.id, "provider_id": None, "provider_status": None}],
                now=h.clock.now(),
            )
    original = h.sim.list_instances

    async def list_then_lose(cluster_id: str, shard: str) -> list[ProviderInstance]:
        vms = await original(cluster_id, shard)
        h.leader.leading = False  # the renewal failed while the listing was in flight
        return vms

    h.sim.list_instances = list_then_lose  # type: ignore[method-assign]
    before = {row.id: h.record(row.id) for row in rows}
    log = WriteLog(h)

    with pytest.raises(NotLeader):
        await sync_provider(h.ctx, h.shard.ops)

    assert log.writes == []
    assert {row.id: h.record(row.id) for row in rows} == before


async def test_no_provider_mutation_or_record_write_gets_past_a_lost_lease(h: Harness) -> None:
    await h.reconcile()
    await h.shard.ops.followups.settled()
    log = WriteLog(h)
    live = dict(h.live())
    h.leader.leading = False
    row = h.rows()[0]

    with pytest.raises(NotLeader):
        await h.shard.ops.delete_or_hold(row, "operator-request")
    with pytest.raises(NotLeader):
        await h.ctx.provider.delete_instance(row.id, row.provider_id or "")
    with pytest.raises(NotLeader):
        await gc_cycle(h.ctx, h.shard.ops)
    assert h.live() == live
    assert log.writes == []


@pytest.mark.parametrize("step", [timedelta(minutes=30), timedelta(hours=2), timedelta(hours=-2)])
async def test_a_wall_clock_step_on_the_leader_replaces_drains_and_collects_nothing(
    h: Harness, step: timedelta
) -> None:
    h.ctx.leader_clock.restart()  # leadership starts
    await h.reconcile()
    rows = h.rows()
    registered = rows[0]
    with h.db.session() as session:  # one agent registered and reports; the other VM still boots
        now = h.ctx.clock.now()
        repo.mark_registered_atomically(
            session, nonce=registered.nonce, public_key_pem="k", cert_serial=1, cert_expires_at=now, now=now
        )
        item = {"instance_id": registered.id, "health_at": now, "health": {}, "runtime_config_hash": None}
        repo.record_health_many(session, [item])
    h.clock.advance(timedelta(seconds=5))
    h.clock.step_wall(step)  # NTP steps the leader's wall clock; its monotonic clock does not move
    h.clock.advance(timedelta(seconds=5))
    assert h.ctx.clock.now() - now == timedelta(seconds=10)

    await h.reconcile()
    report = await gc_cycle(h.ctx, h.shard.ops)

    after = {row.id: row for row in h.rows()}
    assert set(after) == {row.id for row in rows}, "an instance was replaced"
    assert all(row.drain_started_at is None for row in after.values()), "an instance is draining"
    assert report.dangling == []
    assert report.stale == []
    assert len(h.live()) == 2
    assert (registered.tenant, registered.group_key) == KEY
