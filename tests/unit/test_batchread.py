"""``BatchReader``: gets issued together become one bulk read in a worker thread, each caller its value."""

from __future__ import annotations

import asyncio
import threading

import pytest

from nstance.server.agents.batchread import BatchReader


async def test_concurrent_gets_are_read_in_bulk_off_the_loop() -> None:
    calls: list[list[int]] = []
    threads: set[int] = set()

    def read_many(keys: list[int]) -> dict[int, str]:
        calls.append(keys)
        threads.add(threading.get_ident())
        return {k: f"v{k}" for k in keys if k % 7}  # multiples of 7 do not exist

    reader: BatchReader[int, str] = BatchReader(read_many, max_batch=40)
    keys = [*range(100), 3, 3]  # the same key asked for three times
    values = await asyncio.gather(*(reader.get(k) for k in keys))
    assert values == [None if k % 7 == 0 else f"v{k}" for k in keys]
    assert [len(c) for c in calls] == [40, 40, 20]  # distinct keys, at most max_batch per read
    assert threading.get_ident() not in threads
    assert reader.reads == 3
    assert await reader.get(5) == "v5"  # a later get starts a new read
    assert reader.reads == 4


async def test_a_failed_bulk_read_fails_only_its_own_callers() -> None:
    def read_many(keys: list[int]) -> dict[int, int]:
        if 1 in keys:
            raise OSError("disk I/O error")
        return {k: k for k in keys}

    reader: BatchReader[int, int] = BatchReader(read_many, max_batch=2)
    results = await asyncio.gather(*(reader.get(k) for k in (0, 1, 2, 3)), return_exceptions=True)
    assert isinstance(results[0], OSError)
    assert isinstance(results[1], OSError)
    assert results[2:] == [2, 3]


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        BatchReader(lambda keys: {}, max_batch=0)
