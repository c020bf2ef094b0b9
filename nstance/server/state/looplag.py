"""Event-loop lag probe: how late the server's event loop runs a timer, so stalls are visible.

``LagProbe.run`` sleeps ``interval`` seconds in a loop and measures how much later than asked it woke
up. The overshoot is the time some callback held the loop (a blocking call, a long computation, a
garbage collection pass in any thread holding the GIL). Each measurement goes to ``record`` (the
server feeds the ``nstance_event_loop_lag_seconds`` histogram with it); the probe also keeps the
largest lag seen and the number of samples, for benchmarks and tests that assert an upper bound.

A lag is wall time, so a loaded machine's scheduling pauses stretch it as much as real work does. The
probe therefore also reads the loop thread's own CPU clock (``time.thread_time``) at every wake-up:
``max_busy`` is the most CPU time the loop thread spent between two wake-ups, i.e. the longest run of
work the loop itself did without yielding. Being descheduled or waiting for the GIL costs the thread no
CPU time, so ``max_busy`` measures the code, not the machine; tests that guard against work moving
back onto the loop bound it instead of ``max_lag``.

This module only measures: it never changes what runs on the loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

#: Seconds between probes: short enough that a 100 ms stall is always caught, cheap enough to ignore.
DEFAULT_INTERVAL = 0.025


class LagProbe:
    """Measures the event loop's scheduling lag until cancelled."""

    def __init__(
        self,
        *,
        interval: float = DEFAULT_INTERVAL,
        record: Callable[[float], None] | None = None,
        now: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"lag probe interval must be positive (got {interval})")
        self.interval = interval
        self._record = record
        self._now = now
        self._cpu = cpu
        self.max_lag = 0.0
        self.max_busy = 0.0  # most loop-thread CPU seconds between two wake-ups
        self.max_at = 0.0  # when (``now()``) the largest lag ended
        self.samples = 0

    def reset(self) -> None:
        """Forget the largest lag seen so far (a benchmark phase starts)."""
        self.max_lag = 0.0
        self.max_busy = 0.0
        self.max_at = 0.0
        self.samples = 0

    def observe(self, lag: float, busy: float = 0.0) -> None:
        """Account for one measured lag and the loop's CPU time over the same gap (negatives count as 0)."""
        lag = max(lag, 0.0)
        self.max_busy = max(self.max_busy, busy)
        self.samples += 1
        if lag > self.max_lag:
            self.max_lag, self.max_at = lag, self._now()
        if self._record is not None:
            self._record(lag)

    async def run(self) -> None:
        """Probe forever (cancel the task to stop)."""
        while True:
            asked, spent = self._now(), self._cpu()
            await asyncio.sleep(self.interval)
            self.observe(self._now() - asked - self.interval, self._cpu() - spent)
