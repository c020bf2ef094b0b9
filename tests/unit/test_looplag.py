"""The event-loop lag probe: a callback that holds the loop shows up as lag, and is exported."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from nstance.server.state.looplag import LagProbe
from nstance.server.state.metrics import Metrics
from nstance.testing.waiting import eventually


async def test_a_blocking_callback_is_measured_and_recorded() -> None:
    metrics = Metrics()
    probe = LagProbe(interval=0.01, record=metrics.observe_event_loop_lag)
    task = asyncio.create_task(probe.run())
    try:
        await eventually(lambda: probe.samples >= 2, within=10)
        time.sleep(0.3)  # noqa: ASYNC251 - holds the loop, as a blocking call on it would
        await eventually(lambda: probe.max_lag >= 0.25, within=10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    text = metrics.render().decode()
    assert "nstance_event_loop_lag_seconds_count" in text
    assert 'nstance_event_loop_lag_seconds_bucket{le="0.1"}' in text


def test_reset_forgets_the_largest_lag_and_negative_lag_counts_as_zero() -> None:
    seen: list[float] = []
    probe = LagProbe(record=seen.append)
    probe.observe(0.5)
    probe.observe(-0.001)
    assert (probe.max_lag, probe.samples, seen) == (0.5, 2, [0.5, 0.0])
    probe.reset()
    assert (probe.max_lag, probe.samples) == (0.0, 0)


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        LagProbe(interval=0)


async def test_busy_counts_the_loops_own_cpu_work_and_not_time_it_spent_descheduled() -> None:
    # A blocking sleep holds the loop (lag) without using CPU (no busy): what a loaded machine's
    # scheduling pause looks like to the probe. A spin on the loop is both.
    probe = LagProbe(interval=0.01)
    task = asyncio.create_task(probe.run())
    try:
        await eventually(lambda: probe.samples >= 2, within=10)
        time.sleep(0.3)  # noqa: ASYNC251 - off-CPU stall on the loop
        await eventually(lambda: probe.max_lag >= 0.25, within=10)
        assert probe.max_busy < 0.15
        spin_until = time.thread_time() + 0.3
        while time.thread_time() < spin_until:  # on-CPU work on the loop
            pass
        await eventually(lambda: probe.max_busy >= 0.25, within=10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_reset_forgets_the_most_busy_gap() -> None:
    probe = LagProbe()
    probe.observe(0.2, busy=0.1)
    probe.observe(0.0, busy=-0.001)
    assert probe.max_busy == 0.1
    probe.reset()
    assert probe.max_busy == 0.0
