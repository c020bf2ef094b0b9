"""Holding off the cyclic collector through a bulk pass (``gcpause``) and pacing long loops (``pacing``)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from nstance.core import gcpause, pacing
from nstance.testing.waiting import eventually


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    """Every test starts and ends with automatic collection on, as the server runs."""
    gc.enable()
    yield
    assert gcpause._State.depth == 0
    gc.enable()


def test_collection_is_off_inside_and_back_on_after() -> None:
    with gcpause.paused():
        assert not gc.isenabled()
        with gcpause.paused():  # nested: the inner end does not turn it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_error_in_the_block_still_turns_collection_back_on() -> None:
    with pytest.raises(ValueError, match="boom"), gcpause.paused():
        raise ValueError("boom")
    assert gc.isenabled()


def test_collection_that_was_off_stays_off() -> None:
    gc.disable()
    with gcpause.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_no_collection_runs_while_a_bulk_pass_holds_many_containers() -> None:
    collections: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        with gcpause.paused():
            bulk = [[n] for n in range(100_000)]  # 100,000 tracked lists: many thresholds' worth
            del bulk
            during = list(collections)
        assert during == []
        gc.collect(0)
        assert collections  # the callback does see collections once they run
    finally:
        gc.callbacks.remove(seen)


async def test_a_block_that_runs_too_long_gets_collection_back_before_it_ends() -> None:
    with gcpause.paused(max_pause_s=0.05):
        assert not gc.isenabled()
        await eventually(gc.isenabled, within=10, what="collection back on after the time limit")
    assert gc.isenabled()
    assert gcpause._State.timer is None


async def test_the_time_limit_is_cancelled_when_the_block_ends_in_time() -> None:
    with gcpause.paused(max_pause_s=60):
        assert gcpause._State.timer is not None
    assert gcpause._State.timer is None
    assert gc.isenabled()


async def test_paced_keeps_order_and_gives_the_loop_a_turn_every_n_items() -> None:
    turns: list[int] = []
    handled: list[int] = []

    async def other() -> None:
        while True:
            turns.append(len(handled))
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)  # the other task has had its first turn
    try:
        async for item in pacing.paced(range(2500), every=1000):
            handled.append(item)
    finally:
        task.cancel()
    assert handled == list(range(2500))
    # Besides its first turn, the other task ran after items 1,000 and 2,000 only.
    assert turns == [0, 1000, 2000]


async def test_release_empties_a_dict_and_a_list_a_piece_at_a_time() -> None:
    sizes: list[tuple[int, int]] = []
    rows = {n: [n] for n in range(2500)}
    listing = [[n] for n in range(1500)]

    async def other() -> None:
        while True:
            sizes.append((len(rows), len(listing)))
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    try:
        await pacing.release(rows, every=1000)
        await pacing.release(listing, every=1000)
    finally:
        task.cancel()
    assert rows == {}
    assert listing == []
    assert sizes == [(2500, 1500), (1500, 1500), (500, 1500), (0, 1500), (0, 500), (0, 0)]
