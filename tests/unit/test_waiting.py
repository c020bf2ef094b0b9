"""The tests' one way to wait for a condition: the value it returns, and what its failure says."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from nstance.testing.waiting import eventually, eventually_sync


async def test_returns_the_first_truthy_result_of_a_plain_or_async_check() -> None:
    calls = 0

    def third_time() -> list[int]:
        nonlocal calls
        calls += 1
        return [calls] if calls == 3 else []

    assert await eventually(third_time, every=0.001) == [3]

    async def ready() -> str:
        await asyncio.sleep(0)
        return "ready"

    assert await eventually(ready) == "ready"


async def test_a_timeout_names_what_was_awaited_the_last_value_seen_and_the_log() -> None:
    described = 0
    live: list[str] = []

    def what() -> str:
        nonlocal described
        described += 1
        return "three instances"

    with pytest.raises(AssertionError) as failed:
        await eventually(lambda: live, within=0.1, every=0.01, what=what, log=lambda: "server said no")
    message = str(failed.value)
    assert message.startswith("timed out after 0.1s waiting for three instances; last saw: []")
    assert message.endswith("\n--- log ---\nserver said no")
    assert described == 1  # read only for the failure


async def test_a_false_check_is_not_quoted() -> None:
    with pytest.raises(AssertionError, match=r"^timed out after 0.05s waiting for condition$"):
        await eventually(lambda: False, within=0.05, every=0.01)


async def test_ignored_errors_mean_not_yet_and_the_last_one_is_named() -> None:
    calls = 0

    def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionRefusedError("not listening yet")
        return "up"

    assert await eventually(flaky, every=0.001, ignoring=ConnectionError) == "up"

    def refused() -> bool:
        raise ConnectionRefusedError("still not listening")

    with pytest.raises(
        AssertionError, match=r"last error: ConnectionRefusedError\('still not listening'\)"
    ) as failed:
        await eventually(refused, within=0.05, every=0.01, ignoring=(ConnectionError, KeyError))
    assert isinstance(failed.value.__cause__, ConnectionRefusedError)


async def test_other_errors_end_the_wait_at_once() -> None:
    def broken() -> bool:
        raise KeyError("group")

    started = time.monotonic()
    with pytest.raises(KeyError):
        await eventually(broken, within=10, ignoring=ConnectionError)
    assert time.monotonic() - started < 5


async def test_an_async_check_that_hangs_is_cut_off_at_the_deadline() -> None:
    async def hangs() -> bool:
        await asyncio.Event().wait()
        return True

    with pytest.raises(AssertionError, match=r"waiting for an answer \(its last check was still running\)$"):
        await eventually(hangs, within=0.1, what="an answer")


async def test_a_wake_event_rechecks_at_once_instead_of_at_the_next_poll() -> None:
    changed = asyncio.Event()
    state: list[str] = []

    async def change() -> None:
        await asyncio.sleep(0.01)
        state.append("done")
        changed.set()

    task = asyncio.create_task(change())
    started = time.monotonic()
    # A poll interval longer than the pytest timeout: only the event can end this wait in time.
    assert await eventually(lambda: list(state), within=300, every=300, wake=changed) == ["done"]
    assert time.monotonic() - started < 60
    await task


async def test_a_change_while_an_async_check_runs_is_not_lost() -> None:
    changed = asyncio.Event()
    state = {"ready": False}

    async def check() -> bool:
        seen = state["ready"]
        if not seen:  # the change lands while this check is still in flight
            state["ready"] = True
            changed.set()
        await asyncio.sleep(0)
        return seen

    started = time.monotonic()
    assert await eventually(check, within=300, every=300, wake=changed) is True
    assert time.monotonic() - started < 60


def test_the_sync_variant_returns_the_value_from_another_thread() -> None:
    box: list[str] = []
    writer = threading.Timer(0.02, box.append, args=("written",))
    writer.start()
    try:
        assert eventually_sync(lambda: list(box), every=0.005) == ["written"]
    finally:
        writer.join()


def test_the_sync_variant_fails_like_the_async_one() -> None:
    with pytest.raises(AssertionError) as failed:
        eventually_sync(lambda: 0, within=0.05, every=0.01, what="a count", log=lambda: "tail")
    assert str(failed.value) == "timed out after 0.05s waiting for a count; last saw: 0\n--- log ---\ntail"

    def missing() -> str:
        raise FileNotFoundError("identity.crt")

    with pytest.raises(AssertionError, match="last error: FileNotFoundError"):
        eventually_sync(missing, within=0.05, every=0.01, ignoring=OSError)
