"""A level-triggered work queue of keys (one per group) that never drops work.

``add(key)`` marks a key dirty. A dirty key is handed to exactly one worker at a time; marks that arrive
while it is being processed coalesce into one more run after the current one finishes, so a burst of
events costs at most two reconciles and nothing is lost. ``add_after`` schedules a mark (retries with
backoff, drain deadlines, expiry); an earlier schedule for the same key wins over a later one.

There is no capacity limit: the set of keys is bounded by the number of groups. The queue does no work
itself; ``run`` drives a handler with ``workers`` concurrent tasks until ``close``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

log = logging.getLogger(__name__)


class WorkQueue(Generic[K]):
    """Dirty keys, processed one worker per key at a time, FIFO among keys."""

    def __init__(self) -> None:
        self._order: deque[K] = deque()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._redo: set[K] = set()
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._wakeup = asyncio.Condition()
        self._closed = False

    def __len__(self) -> int:
        """Keys waiting to be processed (not counting those in progress)."""
        return len(self._queued)

    @property
    def in_progress(self) -> int:
        return len(self._processing)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def scheduled(self) -> dict[K, float]:
        """Keys with a pending ``add_after`` mark, and when it is due (event-loop time)."""
        return {key: due for key, (due, _) in self._timers.items()}

    def add(self, key: K) -> None:
        """Mark ``key`` dirty now."""
        if self._closed:
            return
        if key in self._processing:
            self._redo.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._order.append(key)
        self._notify()

    def add_after(self, key: K, delay: float) -> None:
        """Mark ``key`` dirty after ``delay`` seconds (keeps an earlier pending schedule)."""
        if self._closed:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        existing = self._timers.get(key)
        if existing is not None:
            if existing[0] <= due:
                return
            existing[1].cancel()
        handle = loop.call_at(due, self._fire, key)
        self._timers[key] = (due, handle)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _notify(self) -> None:
        async def wake() -> None:
            async with self._wakeup:
                self._wakeup.notify_all()

        asyncio.get_running_loop().create_task(wake())

    async def get(self) -> K | None:
        """The next dirty key (now owned by the caller until ``done``), or None once closed."""
        async with self._wakeup:
            while not self._order and not self._closed:
                await self._wakeup.wait()
            if self._closed:
                return None
            key = self._order.popleft()
            self._queued.discard(key)
            self._processing.add(key)
            return key

    def done(self, key: K) -> None:
        """Release ``key``; if it was marked again meanwhile, queue it once more."""
        self._processing.discard(key)
        if key in self._redo:
            self._redo.discard(key)
            self.add(key)

    async def run(self, handler: Callable[[K], Awaitable[None]], *, workers: int) -> None:
        """Process keys with ``workers`` concurrent tasks until ``close``. Handler errors are logged."""

        async def worker() -> None:
            while True:
                key = await self.get()
                if key is None:
                    return
                try:
                    await handler(key)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("work item %r failed", key)
                finally:
                    self.done(key)

        async with asyncio.TaskGroup() as group:
            for _ in range(workers):
                group.create_task(worker())

    async def close(self) -> None:
        """Stop handing out keys and cancel scheduled marks; workers exit after their current key."""
        self._closed = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        async with self._wakeup:
            self._wakeup.notify_all()
