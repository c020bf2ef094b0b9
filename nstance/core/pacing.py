"""Long loops on the event loop, paced: a turn for everyone else every ``EVERY`` items.

A loop over a shard's 100,000 instances that never awaits holds the event loop for the whole
loop (hundreds of milliseconds on a slow core): health streams, renewals and the election's renewals
wait. ``paced`` yields to the loop after every ``EVERY`` items, which keeps one piece of such a
loop to a few milliseconds. ``release`` does the same for freeing what such a loop read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

#: Items handled between turns given to the rest of the event loop.
EVERY = 1000


async def paced(items: Iterable[T], every: int = EVERY) -> AsyncIterator[T]:
    """The items of ``items``, with ``await asyncio.sleep(0)`` after every ``every`` of them."""
    for n, item in enumerate(items, 1):
        yield item
        if n % every == 0:
            await asyncio.sleep(0)


async def release(items: dict[Any, Any] | list[Any], every: int = EVERY) -> None:
    """Empty ``items`` ``every`` entries at a time, with a turn for the loop in between.

    Dropping the last reference to 100,000 cache rows frees their millions of fields in one C call
    that never lets go of the interpreter: about 150 ms with nothing else running. Emptying the
    container piece by piece frees them in steps the loop can come between. The caller must hold
    the only reference to the entries (otherwise nothing is freed here, and nothing is lost).
    """
    while items:
        if isinstance(items, dict):
            for _ in range(min(every, len(items))):
                items.popitem()
        else:
            del items[-every:]
        await asyncio.sleep(0)
