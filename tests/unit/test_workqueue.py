"""The level-triggered work queue: coalescing, one worker per key, nothing dropped.

No test pauses for the queue: each waits until the queue is idle (nothing queued, nothing in progress),
from which no further run can come without a new mark.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nstance.core.backoff import Backoff
from nstance.core.workqueue import WorkQueue
from nstance.testing.waiting import eventually


def idle(queue: WorkQueue[Any]) -> bool:
    return len(queue) == 0 and queue.in_progress == 0


async def test_marks_during_processing_coalesce_into_one_more_run() -> None:
    queue: WorkQueue[str] = WorkQueue()
    runs: list[str] = []
    gate = asyncio.Event()

    async def handler(key: str) -> None:
        runs.append(key)
        if len(runs) == 1:
            for _ in range(50):
                queue.add(key)  # a burst while the first run is in progress
            gate.set()
            await asyncio.sleep(0.01)

    queue.add("g")
    task = asyncio.create_task(queue.run(handler, workers=4))
    await gate.wait()
    await eventually(lambda: len(runs) == 2 and idle(queue), within=10, what="the second run to finish")
    await queue.close()
    await task
    assert runs == ["g", "g"]


async def test_a_key_is_never_processed_by_two_workers_at_once() -> None:
    queue: WorkQueue[int] = WorkQueue()
    active: set[int] = set()
    overlaps = 0
    done = 0

    async def handler(key: int) -> None:
        nonlocal overlaps, done
        if key in active:
            overlaps += 1
        active.add(key)
        await asyncio.sleep(0.001)
        active.discard(key)
        done += 1

    task = asyncio.create_task(queue.run(handler, workers=8))
    for i in range(200):
        queue.add(i % 5)
        await asyncio.sleep(0)
    await eventually(lambda: idle(queue), within=10, what="the queue to be idle")
    await queue.close()
    await task
    assert overlaps == 0
    assert done >= 5


async def test_no_key_is_dropped_under_load() -> None:
    queue: WorkQueue[int] = WorkQueue()
    seen: set[int] = set()
    all_seen = asyncio.Event()

    async def handler(key: int) -> None:
        seen.add(key)
        if len(seen) == 5000:
            all_seen.set()

    for i in range(5000):
        queue.add(i)
    task = asyncio.create_task(queue.run(handler, workers=3))
    await asyncio.wait_for(all_seen.wait(), 10)
    await queue.close()
    await task
    assert seen == set(range(5000))


async def test_add_after_keeps_the_earliest_schedule_and_handler_errors_do_not_stop_workers() -> None:
    queue: WorkQueue[str] = WorkQueue()
    seen: list[str] = []

    async def handler(key: str) -> None:
        seen.append(key)
        if key == "boom":
            raise RuntimeError("handler failed")

    task = asyncio.create_task(queue.run(handler, workers=1))
    queue.add("boom")
    now = asyncio.get_running_loop().time()
    queue.add_after("later", 10.0)
    queue.add_after("later", 0.05)  # earlier wins
    queue.add_after("later", 5.0)  # and stays
    assert list(queue.scheduled) == ["later"]
    assert queue.scheduled["later"] < now + 5.0
    await eventually(lambda: seen == ["boom", "later"] and idle(queue), within=10, what="the scheduled run")
    assert queue.scheduled == {}, "a later schedule is still pending"
    await queue.close()
    await task
    assert seen == ["boom", "later"]


def test_backoff_grows_caps_and_jitters_within_bounds() -> None:
    import random

    backoff = Backoff(base=1.0, cap=8.0, jitter=0.25, rng=random.Random(1))
    delays = [backoff.delay(n) for n in range(6)]
    for n, d in enumerate(delays):
        raw = min(8.0, 2.0**n)
        assert raw <= d <= raw * 1.25


async def test_background_keys_wait_behind_every_other_key() -> None:
    # A resync of many groups is queued in the background; a group changed meanwhile goes first,
    # also when it was already waiting as part of the resync.
    queue: WorkQueue[str] = WorkQueue()
    runs: list[str] = []
    for i in range(5):
        queue.add(f"resync-{i}", background=True)
    queue.add("changed")
    queue.add("resync-3")  # marked again by an event: moves ahead of the resync
    queue.add("changed", background=True)  # already waiting in front: stays there
    assert len(queue) == 6

    async def handler(key: str) -> None:
        runs.append(key)

    task = asyncio.create_task(queue.run(handler, workers=1))
    await eventually(lambda: len(runs) == 6, within=10, what="every key processed")
    await queue.close()
    await task
    assert runs == ["changed", "resync-3", "resync-0", "resync-1", "resync-2", "resync-4"]


async def test_at_most_background_limit_background_keys_run_at_once() -> None:
    queue: WorkQueue[str] = WorkQueue(background_limit=1)
    running: set[str] = set()
    most = 0
    runs: list[str] = []
    release = asyncio.Event()

    async def handler(key: str) -> None:
        nonlocal most
        running.add(key)
        most = max(most, len(running))
        runs.append(key)
        if key.startswith("resync"):
            await release.wait()
        running.discard(key)

    for i in range(3):
        queue.add(f"resync-{i}", background=True)
    task = asyncio.create_task(queue.run(handler, workers=4))
    await eventually(lambda: runs == ["resync-0"], within=10, what="the first background key")
    queue.add("changed")  # three workers are idle: it runs now, beside the background one
    await eventually(lambda: runs == ["resync-0", "changed"], within=10, what="the changed key")
    release.set()
    await eventually(lambda: len(runs) == 4, within=10, what="the other background keys, one at a time")
    await queue.close()
    await task
    assert runs == ["resync-0", "changed", "resync-1", "resync-2"]
    assert most == 2  # one background key and the changed one; never two background keys


def test_background_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="background_limit"):
        WorkQueue[str](background_limit=0)


async def test_cancel_drops_a_pending_schedule_but_not_a_mark_made() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("later", 60.0)
    queue.add_after("both", 60.0)
    queue.add("both")
    assert queue.keys == {"later", "both"}
    queue.cancel("later")
    queue.cancel("both")
    queue.cancel("never-scheduled")
    assert queue.scheduled == {}
    assert queue.keys == {"both"}
    assert len(queue) == 1
    await queue.close()


async def test_rerun_pending_tells_a_handler_it_was_marked_during_its_run() -> None:
    queue: WorkQueue[str] = WorkQueue()
    seen: list[tuple[bool, bool, set[str]]] = []

    async def handler(key: str) -> None:
        before = queue.rerun_pending(key)
        if not seen:
            queue.add(key)  # a mark while in progress
        seen.append((before, queue.rerun_pending(key), queue.keys))

    queue.add("g")
    task = asyncio.create_task(queue.run(handler, workers=1))
    await eventually(lambda: len(seen) == 2 and idle(queue), within=10, what="the second run to finish")
    await queue.close()
    await task
    assert seen == [(False, True, {"g"}), (False, False, {"g"})]
    assert queue.keys == set()
