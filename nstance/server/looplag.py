"""Event-loop lag probe: how late the server's event loop runs a timer, so stalls are visible.

``LagProbe.run`` sleeps ``interval`` seconds in a loop and measures how much later than asked it woke
up. The overshoot is the time some callback held the loop (a blocking call, a long computation, a
garbage collection pass in any thread holding the GIL). Each measurement goes to ``record`` (the
server feeds the ``nstance_event_loop_lag_seconds`` histogram with it); the probe also keeps the
largest lag seen and the number of samples, for benchmarks and tests that assert an upper bound.

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
    ) -> None:
        if interval <= 0:
            raise ValueError(f"lag probe interval must be positive (got {interval})")
        self.interval = interval
        self._record = record
        self._now = now
        self.max_lag = 0.0
        self.max_at = 0.0  # when (``now()``) the largest lag ended
        self.samples = 0

    def reset(self) -> None:
        """Forget the largest lag seen so far (a benchmark phase starts)."""
        self.max_lag = 0.0
        self.max_at = 0.0
        self.samples = 0

    def observe(self, lag: float) -> None:
        """Account for one measured lag (negative values, from clock granularity, count as 0)."""
        lag = max(lag, 0.0)
        self.samples += 1
        if lag > self.max_lag:
            self.max_lag, self.max_at = lag, self._now()
        if self._record is not None:
            self._record(lag)

    async def run(self) -> None:
        """Probe forever (cancel the task to stop)."""
        while True:
            asked = self._now()
            await asyncio.sleep(self.interval)
            self.observe(self._now() - asked - self.interval)
