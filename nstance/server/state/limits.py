"""Client-side limits on provider create calls: concurrency, spacing and token buckets.

``max_concurrent_creates`` bounds how many creates are in flight at once; ``create_rate_limit`` (as
upstream) is a minimum spacing between create starts, implemented as a one-token bucket so that a
waiting create holds nothing but its own task — other groups' work, deletes and reads carry on (the Go
server slept inside its single event loop). An optional extra bucket can mirror a cloud's own request
limit so we slow down before the cloud throttles us.

Waiting uses an injected async sleep and the clock's monotonic time, so the simulator and tests run it
on virtual time. No provider calls here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

from nstance.core.clock import Clock
from nstance.core.ratelimit import TokenBucket

Sleep = Callable[[float], Awaitable[None]]


async def take(bucket: TokenBucket, sleep: Sleep, n: float = 1.0) -> None:
    """Wait until ``n`` tokens could be taken from ``bucket``, then take them."""
    while True:
        wait = bucket.try_take(n)
        if wait == 0.0:
            return
        await sleep(wait)


class CreateLimiter:
    """Admission for provider create calls."""

    def __init__(
        self,
        *,
        clock: Clock,
        max_concurrent: int,
        min_spacing: timedelta = timedelta(0),
        bucket: TokenBucket | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        self._semaphore = asyncio.Semaphore(max_concurrent)
        self._token_lock = asyncio.Lock()
        spacing = min_spacing.total_seconds()
        self._spacing = TokenBucket(1, 1.0 / spacing, clock) if spacing > 0 else None
        self._bucket = bucket
        self._sleep = sleep
        self.max_concurrent = max_concurrent
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        """Creates currently admitted."""
        return self._in_flight

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one create slot for the duration of the ``async with``."""
        async with self._semaphore:
            if self._spacing is not None or self._bucket is not None:
                # One waiter at a time polls the buckets, in arrival order: without this every waiter
                # wakes at each refill and all but one go back to sleep (a thundering herd).
                async with self._token_lock:
                    if self._spacing is not None:
                        await take(self._spacing, self._sleep)
                    if self._bucket is not None:
                        await take(self._bucket, self._sleep)
            self._in_flight += 1
            try:
                yield
            finally:
                self._in_flight -= 1
