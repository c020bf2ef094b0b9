"""Record follow-ups: provider ids reach the record after a burst, without clobbering newer writes."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

from nstance.core.errors import Unavailable
from nstance.objectstore.memory import MemoryObjectStore
from nstance.server.reconcile.followups import RecordFollowUps
from nstance.server.state.records import (
    InstanceRecord,
    delete_record,
    read_record,
    update_record,
    write_record,
)
from nstance.testing.waiting import eventually

KNOWN_ID = "knc06bgm7733st2576nx5jht4ecjw"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def pending() -> InstanceRecord:
    return InstanceRecord(instance_id=KNOWN_ID, tenant="default", group="web", created_at=T0, last_updated=T0)


def finished(record_status: str = "running") -> InstanceRecord:
    return dataclasses.replace(
        pending(),
        provider_instance_id="i-0abc",
        status=record_status,
        private_ipv4="10.0.0.7",
        hostname="ip-10-0-0-7",
        last_updated=T0 + timedelta(seconds=2),
    )


def stored(store: MemoryObjectStore) -> InstanceRecord:
    found = read_record(store, "default", KNOWN_ID)
    assert found is not None
    return found[0]


async def settle(queue: RecordFollowUps) -> None:
    async with asyncio.timeout(5):
        await queue.settled()


def allowed() -> None:
    return None


async def test_follow_ups_wait_while_creates_run_and_are_written_when_the_burst_ends() -> None:
    store = MemoryObjectStore()
    etag = write_record(store, pending(), create_only=True)
    busy = True
    looks = 0

    def burst() -> bool:
        nonlocal looks
        looks += 1
        return busy

    queue = RecordFollowUps(store, busy=burst, fence=allowed, max_defer=60)
    queue.add(finished(), etag)
    # Once the queue has looked at the burst it waits (looking again only when woken): counted looks,
    # not a pause, show that it held the write back.
    await eventually(lambda: looks >= 1, within=5, what="the queue to look at the burst")
    queue.wake()  # woken while creates still run: it looks again and keeps waiting
    await eventually(lambda: looks >= 2, within=5, what="the queue to look again")
    assert stored(store).provider_instance_id == ""
    assert queue.pending == 1
    busy = False
    queue.wake()
    await settle(queue)
    record = stored(store)
    assert record.provider_instance_id == "i-0abc"
    assert record.status == "running"
    assert record.private_ipv4 == "10.0.0.7"


async def test_a_follow_up_is_written_after_max_defer_even_if_the_burst_goes_on() -> None:
    store = MemoryObjectStore()
    etag = write_record(store, pending(), create_only=True)
    queue = RecordFollowUps(store, busy=lambda: True, fence=allowed, max_defer=0.05)
    queue.add(finished(), etag)
    await settle(queue)
    assert stored(store).provider_instance_id == "i-0abc"


async def test_a_record_changed_meanwhile_gets_the_provider_fields_and_keeps_its_newer_status() -> None:
    store = MemoryObjectStore()
    etag = write_record(store, pending(), create_only=True)
    update_record(store, "default", KNOWN_ID, status="deleting")  # a delete raced the follow-up
    queue = RecordFollowUps(store, busy=lambda: False, fence=allowed)
    queue.add(finished(), etag)
    await settle(queue)
    record = stored(store)
    assert record.status == "deleting"
    assert record.provider_instance_id == "i-0abc"


async def test_a_record_deleted_meanwhile_is_not_recreated() -> None:
    store = MemoryObjectStore()
    etag = write_record(store, pending(), create_only=True)
    delete_record(store, "default", KNOWN_ID)
    queue = RecordFollowUps(store, busy=lambda: False, fence=allowed)
    queue.add(finished(), etag)
    await settle(queue)
    assert read_record(store, "default", KNOWN_ID) is None


async def test_after_leadership_is_lost_follow_ups_are_dropped_not_written() -> None:
    store = MemoryObjectStore()
    etag = write_record(store, pending(), create_only=True)

    def lost() -> None:
        raise Unavailable("this server is no longer the shard leader")

    queue = RecordFollowUps(store, busy=lambda: False, fence=lost)
    queue.add(finished(), etag)
    await settle(queue)
    assert stored(store).provider_instance_id == ""
    assert stored(store).status == "pending"


async def test_flush_writes_everything_at_once_even_during_a_burst() -> None:
    store = MemoryObjectStore()
    etag = write_record(store, pending(), create_only=True)
    queue = RecordFollowUps(store, busy=lambda: True, fence=allowed, max_defer=60)
    queue.add(finished(), etag)
    await queue.flush()
    assert queue.pending == 0
    assert stored(store).provider_instance_id == "i-0abc"
