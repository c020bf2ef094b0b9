"""A create's intent: the SQLite row and the pending record are both written before the provider call.

The two writes run at the same time (neither needs the other). Whichever fails, no VM is asked for:
a record the provider never saw is marked failed when the cache refused its row, and a row whose
record was not written is soft-deleted. The next reconcile creates the group's instances afresh.
(In-process leader on the sim provider, as in test_shard_cloud_features.)
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from shard_helpers import claim_registration, no_sleep
from test_shard_cloud_features import Harness, RecordingSim

from nstance.core.clock import ManualClock
from nstance.core.errors import Unavailable
from nstance.db import repo
from nstance.objectstore.memory import MemoryObjectStore
from nstance.providers.base import (
    CreateRequest,
    ProviderInstance,
    ProviderInvalidRequest,
    ProviderUnavailable,
)
from nstance.server.reconcile.create import Creator
from nstance.server.reconcile.gc import gc_cycle
from nstance.server.state import records
from nstance.server.state.events import InstanceEventData
from nstance.testing.waiting import eventually

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.db.close()


async def _statuses(h: Harness) -> list[str]:
    await h.shard.ops.followups.flush()  # the provider's answer reaches the records after the burst
    found, problems = records.list_records(h.store)
    assert not problems
    return sorted(r.status for r in found)


async def test_a_batch_the_cache_refuses_asks_for_no_vm_and_marks_its_records_failed(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: Creator, rows: list[dict[str, Any]], now: datetime) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(Creator, "_insert_rows", refuse)
    await h.reconcile()
    assert h.vms.requests == []
    assert h.rows() == []
    assert await _statuses(h) == ["failed", "failed"]  # written at the same time as the refused rows
    assert not h.shard.ops.in_flight

    monkeypatch.undo()
    await h.reconcile()
    assert len(h.vms.requests) == 2
    assert len(h.rows()) == 2
    assert await _statuses(h) == ["failed", "failed", "running", "running"]


async def test_a_record_that_cannot_be_written_leaves_no_row_and_asks_for_no_vm(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = MemoryObjectStore.put_if_match

    def refuse_instances(self: MemoryObjectStore, key: str, data: bytes, etag: str | None) -> str:
        if "/instance/" in f"/{key}":
            raise Unavailable("object storage is unreachable")
        return original(self, key, data, etag)

    monkeypatch.setattr(MemoryObjectStore, "put_if_match", refuse_instances)
    await h.reconcile()
    assert h.vms.requests == []
    assert h.rows() == []  # written at the same time, then soft-deleted
    assert not h.shard.ops.in_flight

    monkeypatch.undo()
    await h.reconcile()
    assert len(h.vms.requests) == 2
    assert await _statuses(h) == ["running", "running"]


async def test_a_failed_status_the_record_could_not_take_is_written_by_the_next_gc_cycle(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The create path's half of simulation seed 925256116 (a retirement's half is in test_shard_gc.py):
    a create the provider refused marks its row failed at once, but the record's ``failed`` could not be
    written then; nothing else would look at that record again in this leadership."""
    original = MemoryObjectStore.put_if_match

    def refuse_failed(self: MemoryObjectStore, key: str, data: bytes, etag: str | None) -> str:
        if "/instance/" in f"/{key}" and b'"status":"failed"' in data:
            raise Unavailable("object storage is unreachable")
        return original(self, key, data, etag)

    monkeypatch.setattr(MemoryObjectStore, "put_if_match", refuse_failed)
    h.vms.fail_next("create_instance", ProviderInvalidRequest("sim: the request is invalid"), times=2)
    await h.reconcile()
    assert h.vms.calls["create_instance"] == 2
    assert [r.record_state for r in h.rows()] == ["failed", "failed"]  # the cache has it at once
    assert await _statuses(h) == ["pending", "pending"]  # the failed status did not land
    ids = sorted(r.instance_id for r in records.list_records(h.store)[0])
    assert sorted(h.shard.ops.owed.owed) == ids
    assert await h.shard.ops.owed.retry() == []  # storage still refuses: still owed
    assert sorted(h.shard.ops.owed.owed) == ids
    monkeypatch.undo()
    assert sorted(await h.shard.ops.owed.retry()) == ids  # what the next GC cycle does first
    assert await _statuses(h) == ["failed", "failed"]
    assert h.shard.ops.owed.owed == {}


async def test_a_registered_instance_whose_provider_id_never_reached_its_record_is_adopted_not_retired(
    tmp_path: Path,
) -> None:
    """Simulation seed 977000442: the record follow-up with the provider id failed (a 409), the agent
    registered anyway, and the leader then rebuilt its cache from the record while the cloud did not list
    the new VM yet. The row looked like a create cut off before the provider call: recovery retired it
    (and GC would have, as a stale pre-insert), and the serving VM was deleted as an orphan once listed.
    An instance whose agent registered has a VM: it waits for the listing, which adopts it."""
    clock = ManualClock()
    h = Harness(
        tmp_path,
        size=1,
        clock=clock,
        sim=RecordingSim(clock=clock, sleep=no_sleep, not_found_after_create=30),
    )
    try:
        await h.shard.start_leading()
        await eventually(lambda: len(h.rows()) == 1 and h.rows()[0].provider_id, within=10, what="the VM")
        await h.shard.stop_leading(grace=1)
        row = h.rows()[0]
        # What the failed follow-up left: the pending intent, then the registration written onto it.
        records.modify_record(
            h.store,
            "default",
            row.id,
            lambda rec: dataclasses.replace(
                rec, provider_instance_id="", status="pending", registered_at=clock.now(), cert_serial="01"
            ),
        )
        clock.advance(5)  # the VM is 5 s old: the cloud does not list it yet
        await h.shard.start_leading()  # the cache is rebuilt from the records
        assert [r.id for r in h.rows()] == [row.id]
        assert h.vms.calls["delete_instance"] == 0
        clock.advance(65)  # listed now, and older than a stale pre-insert (2 x request_timeout): a GC cycle
        await gc_cycle(h.ctx, h.shard.ops)
        assert h.vms.calls["delete_instance"] == 0
        assert h.rows()[0].provider_id == row.provider_id  # adopted from the listing
        assert await _statuses(h) == ["running"]
    finally:
        await h.shard.stop_leading(grace=1)


class _RegisteredMeanwhile(RecordingSim):
    """Every create attempt makes the VM (one, by idempotency token) and then loses its answer; the agent
    of that VM registers while the first lost answer is on its way back."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.register: Callable[[str], object] = lambda instance_id: None

    async def create_instance(self, request: CreateRequest) -> ProviderInstance:
        try:
            return await super().create_instance(request)
        except ProviderUnavailable:
            self.register(request.instance_id)
            raise


def _claim(h: Harness, instance_id: str) -> bool:
    with h.db.session() as session:
        row = repo.get_instance(session, instance_id)
        assert row is not None
        return claim_registration(session, row, h.clock.now())


async def test_a_create_whose_answer_was_lost_keeps_its_instance_when_the_agent_registered(
    tmp_path: Path,
) -> None:
    """Simulation seed 526609107: every attempt of a create lost its answer, though the first made the
    VM, and the VM's agent registered meanwhile. The leader still marked the row failed and retired
    it: the healthy VM, its record saying it never existed, was deleted as an orphan by the next
    listing. A registration proves the VM: the row stays, and the listing adopts the VM."""
    clock = ManualClock()
    sim = _RegisteredMeanwhile(clock=clock, sleep=no_sleep)
    h = Harness(tmp_path, size=1, clock=clock, sim=sim)
    try:
        sim.register = lambda instance_id: _claim(h, instance_id)
        sim.fail_next(
            "create_instance", ProviderUnavailable("sim: response lost"), times=4, after_effect=True
        )
        await h.reconcile()
        assert sim.calls["create_instance"] == 4  # every attempt lost its answer
        assert len(h.live()) == 1  # one VM all the same
        [row] = h.rows()
        assert row.registered_at is not None
        assert row.record_state != "failed"
        assert await _statuses(h) == ["pending"]  # not failed: the registration wrote its own part
        await h.reconcile()
        assert sim.calls["create_instance"] == 4  # the registered instance counts: no replacement
        assert sim.calls["delete_instance"] == 0
        await gc_cycle(h.ctx, h.shard.ops)  # the listing adopts the VM by its tags
        assert sim.calls["delete_instance"] == 0
        [row] = h.rows()
        assert row.provider_id in h.live()
    finally:
        h.db.close()


async def test_a_registered_instance_without_a_provider_id_is_deleted_once_its_vm_is_adopted(
    tmp_path: Path,
) -> None:
    """Simulation seed 986002470: the cache row of a registered instance had no provider id (its record,
    repaired after damage, was written back into the row without the id its follow-up never stored),
    and its group was deleted. The reconciler took the row for a create cut off before the provider
    call and retired it without one; the next listing then deleted the healthy VM as an orphan, with
    no drain and no instance event saying why. A registered instance has a VM: its delete waits until a
    listing has adopted the VM by its tags, and then deletes it as any other member."""
    clock = ManualClock()
    sim = _RegisteredMeanwhile(clock=clock, sleep=no_sleep)
    h = Harness(tmp_path, size=1, clock=clock, sim=sim)
    events: list[InstanceEventData] = []
    h.ctx.events.instances.publish = events.append  # type: ignore[method-assign, assignment]
    try:
        sim.register = lambda instance_id: _claim(h, instance_id)
        sim.fail_next(
            "create_instance", ProviderUnavailable("sim: response lost"), times=4, after_effect=True
        )
        await h.reconcile()
        [row] = h.rows()
        assert (row.provider_id, row.registered_at is not None) == (None, True)
        h.size = 0
        h.write_config()
        h.state.load()
        await h.reconcile()
        assert sim.calls["delete_instance"] == 0
        assert [r.id for r in h.rows()] == [row.id]  # not retired: its VM runs
        assert len(h.live()) == 1
        await gc_cycle(h.ctx, h.shard.ops)  # the listing adopts the VM by its tags
        assert sim.calls["delete_instance"] == 0
        [row_now] = h.rows()
        assert row_now.provider_id in h.live()
        await h.reconcile()
        assert sim.calls["delete_instance"] == 1
        assert h.live() == set()
        assert h.rows() == []
        assert [(e.status, e.reason, e.provider_id) for e in events] == [
            ("deleting", "scale-down", row_now.provider_id),
            ("deleted", "scale-down", row_now.provider_id),
        ]
    finally:
        h.db.close()


async def test_an_agent_cannot_register_once_its_create_was_marked_failed(h: Harness) -> None:
    """The other order: the failure was decided first. The VM is an orphan the listing deletes; its
    agent must not join the cluster before that."""
    lost = ProviderUnavailable("sim: response lost")
    h.vms.fail_next("create_instance", lost, times=8, after_effect=True)  # every attempt of both creates
    await h.reconcile()
    rows = {row.id: row for row in h.rows()}
    assert [row.record_state for row in rows.values()] == ["failed", "failed"]
    assert not any(_claim(h, instance_id) for instance_id in rows)
    assert all(row.registered_at is None for row in h.rows())
