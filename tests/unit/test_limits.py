"""The create limiter: concurrency bound, token buckets, first come first served without a herd."""

from __future__ import annotations

import asyncio

from nstance.core.clock import ManualClock
from nstance.core.ratelimit import TokenBucket
from nstance.server.state.limits import CreateLimiter


async def test_waiters_are_admitted_in_order_and_sleep_once_each() -> None:
    clock = ManualClock()
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.advance(seconds)
        await asyncio.sleep(0)

    limiter = CreateLimiter(clock=clock, max_concurrent=100, bucket=TokenBucket(1, 10.0, clock), sleep=sleep)
    admitted: list[int] = []

    async def create(i: int) -> None:
        async with limiter.slot():
            admitted.append(i)

    await asyncio.gather(*(create(i) for i in range(10)))
    assert admitted == list(range(10))  # first come, first served
    assert len(sleeps) == 9  # one wait per token, not one per waiter per refill
    assert abs(sum(sleeps) - 0.9) < 1e-6  # 10 tokens from a 1-deep bucket at 10/s


async def test_concurrency_is_bounded() -> None:
    limiter = CreateLimiter(clock=ManualClock(), max_concurrent=3)
    peak = 0

    async def create() -> None:
        nonlocal peak
        async with limiter.slot():
            peak = max(peak, limiter.in_flight)
            await asyncio.sleep(0.001)

    await asyncio.gather(*(create() for _ in range(20)))
    assert peak == 3
