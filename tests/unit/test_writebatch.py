"""WriteBatcher: writes submitted in one loop turn reach the writer as one job, each caller its result."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from nstance.server.identity.writebatch import WriteBatcher


async def test_writes_of_one_loop_turn_share_one_job_and_each_gets_its_result() -> None:
    jobs: list[tuple[list[int], str]] = []

    def write_many(items: list[int]) -> list[int]:
        jobs.append((items, threading.current_thread().name))
        return [item * 10 for item in items]

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="writer") as writer:
        batcher: WriteBatcher[int, int] = WriteBatcher(writer, write_many)
        first = await asyncio.gather(*(batcher.submit(i) for i in range(5)))
        second = await batcher.submit(7)
    assert first == [0, 10, 20, 30, 40]
    assert second == 70
    assert [items for items, _ in jobs] == [[0, 1, 2, 3, 4], [7]]
    assert all(name.startswith("writer") for _, name in jobs)
    assert (batcher.batches, batcher.items) == (2, 6)


async def test_a_failing_batch_fails_each_of_its_callers_and_the_next_batch_runs() -> None:
    calls = 0

    def write_many(items: list[str]) -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("disk I/O error")
        return [item.upper() for item in items]

    with ThreadPoolExecutor(max_workers=1) as writer:
        batcher: WriteBatcher[str, str] = WriteBatcher(writer, write_many)
        results = await asyncio.gather(batcher.submit("a"), batcher.submit("b"), return_exceptions=True)
        assert [str(r) for r in results] == ["disk I/O error", "disk I/O error"]
        assert await batcher.submit("c") == "C"


async def test_a_cancelled_caller_does_not_disturb_the_others() -> None:
    release = threading.Event()

    def write_many(items: list[int]) -> list[int]:
        release.wait(10)
        return items

    with ThreadPoolExecutor(max_workers=1) as writer:
        batcher: WriteBatcher[int, int] = WriteBatcher(writer, write_many)
        gone = asyncio.ensure_future(batcher.submit(1))
        kept = asyncio.ensure_future(batcher.submit(2))
        await asyncio.sleep(0)
        gone.cancel()
        release.set()
        assert await kept == 2
        with pytest.raises(asyncio.CancelledError):
            await gone


async def test_a_result_count_mismatch_is_an_error_not_a_wrong_answer() -> None:
    with ThreadPoolExecutor(max_workers=1) as writer:
        batcher: WriteBatcher[int, int] = WriteBatcher(writer, lambda items: items[:1])
        results = await asyncio.gather(batcher.submit(1), batcher.submit(2), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)


async def test_writes_submitted_while_a_job_runs_go_out_together_in_the_next_job() -> None:
    """Group commit: with one job in the writer, the next loop turns' writes wait and share one job."""
    started, release = threading.Event(), threading.Event()
    jobs: list[list[int]] = []

    def write_many(items: list[int]) -> list[int]:
        jobs.append(items)
        started.set()
        release.wait(10)
        return items

    with ThreadPoolExecutor(max_workers=1) as writer:
        batcher: WriteBatcher[int, int] = WriteBatcher(writer, write_many)
        first = asyncio.ensure_future(batcher.submit(0))
        await asyncio.to_thread(started.wait, 10)
        later = []
        for i in range(1, 6):  # five loop turns while the first job runs
            later.append(asyncio.ensure_future(batcher.submit(i)))
            await asyncio.sleep(0)
        release.set()
        assert await first == 0
        assert await asyncio.gather(*later) == [1, 2, 3, 4, 5]
    assert jobs == [[0], [1, 2, 3, 4, 5]]
    assert (batcher.batches, batcher.items) == (2, 6)


async def test_a_writer_that_was_shut_down_fails_the_batch_instead_of_leaving_it_waiting() -> None:
    writer = ThreadPoolExecutor(max_workers=1)
    writer.shutdown()
    batcher: WriteBatcher[int, int] = WriteBatcher(writer, lambda items: items)
    with pytest.raises(RuntimeError, match="shutdown"):
        await asyncio.wait_for(batcher.submit(1), 5)
