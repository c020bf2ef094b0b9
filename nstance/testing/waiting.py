"""Waiting in tests for state that background tasks or other processes change (no event to await).

``eventually`` polls a check (plain or async) every 50 ms until it is truthy, and fails the test with
``what`` when ``within`` seconds pass first. Time inside the code under test is injected; this wall
clock only bounds how long a test waits for work that runs concurrently with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def eventually(
    check: Callable[[], object | Awaitable[object]], within: float = 20.0, what: str = "condition"
) -> None:
    """Return once ``check()`` is truthy; raise AssertionError naming ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}")
        await asyncio.sleep(0.05)
