"""A level-triggered work queue of keys that never drops work: the server's reconciler (one key per
group) and every operator controller (one key per object) run on it.

``add(key)`` marks a key dirty. A dirty key is handed to exactly one worker at a time; marks that arrive
while it is being processed coalesce into one more run after the current one finishes, so a burst of
events costs at most two reconciles and nothing is lost. ``add_after`` schedules a mark (retries with
backoff, drain deadlines, expiry); an earlier schedule for the same key wins over a later one, and
``cancel`` drops a pending schedule (the operator does so when a mark now replaces a delayed run).

Keys marked with ``background=True`` (the periodic resync of every group) wait behind every other
dirty key: with 10,000 groups a resync queues 10,000 keys, and a group whose size was just changed
must not wait for all of them. A background key marked again without ``background`` moves ahead.
Strict priority: background keys run when no other key is waiting (foreground marks coalesce per
key, so they cannot outrun the workers for long), and at most ``background_limit`` of them at a
time, so a changed group finds an idle worker and the CPU is not taken by a resync in full swing.

There is no capacity limit: the set of keys is bounded by the number of groups (or objects). The queue
does no work itself; ``run`` drives a handler with ``workers`` concurrent tasks until ``close``, or a
caller drives ``get``/``done`` itself (the operator's controller queue, which adds triggers, failure
backoff and requeue-after on top).
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

    def __init__(self, *, background_limit: int | None = None) -> None:
        """``background_limit``: most background keys in progress at once (None: no limit)."""
        if background_limit is not None and background_limit < 1:
            raise ValueError(f"background_limit must be at least 1 (got {background_limit})")
        self._background_limit = background_limit
        self._processing_background: set[K] = set()
        #: Waiting keys in order, foreground and background; an entry counts only while its ticket
        #: is the key's current one in ``_queued`` (a key moved ahead leaves a stale entry behind).
        self._order: deque[tuple[int, K]] = deque()
        self._background: deque[tuple[int, K]] = deque()
        #: Waiting key -> (ticket, background).
        self._queued: dict[K, tuple[int, bool]] = {}
        self._tickets = 0
        self._wake: asyncio.Task[None] | None = None
        self._processing: set[K] = set()
        #: Keys marked while in progress -> whether every such mark was a background one.
        self._redo: dict[K, bool] = {}
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

    @property
    def keys(self) -> set[K]:
        """Every key the queue still owes a run: waiting, in progress or scheduled."""
        return set(self._queued) | self._processing | set(self._timers)

    def rerun_pending(self, key: K) -> bool:
        """Whether ``key``, now in progress, was marked again (``done`` queues it once more)."""
        return key in self._redo

    def add(self, key: K, *, background: bool = False) -> None:
        """Mark ``key`` dirty now; ``background`` keys wait until no other key does."""
        if self._closed:
            return
        if key in self._processing:
            self._redo[key] = self._redo.get(key, True) and background
            return
        queued = self._queued.get(key)
        if queued is not None and (background or not queued[1]):
            return
        self._tickets += 1
        self._queued[key] = (self._tickets, background)
        (self._background if background else self._order).append((self._tickets, key))
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

    def cancel(self, key: K) -> None:
        """Drop ``key``'s pending ``add_after`` mark, if any (a mark already made stays)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _notify(self) -> None:
        async def wake() -> None:
            async with self._wakeup:
                self._wakeup.notify_all()

        # One wake-up per burst: it runs after every mark made before it (10,000 marks, one task).
        if self._wake is None or self._wake.done():
            self._wake = asyncio.get_running_loop().create_task(wake())

    def _pop(self) -> K | None:
        """The next waiting key, foreground first; None when none may be handed out now."""
        limit = self._background_limit
        lanes = [self._order]
        if limit is None or len(self._processing_background) < limit:
            lanes.append(self._background)
        for lane in lanes:
            while lane:
                ticket, key = lane.popleft()
                queued = self._queued.get(key)
                if queued is not None and queued[0] == ticket:
                    del self._queued[key]
                    if lane is self._background:
                        self._processing_background.add(key)
                    return key
        return None

    async def get(self) -> K | None:
        """The next dirty key (now owned by the caller until ``done``), or None once closed."""
        async with self._wakeup:
            while True:
                if self._closed:
                    return None
                key = self._pop()
                if key is not None:
                    self._processing.add(key)
                    return key
                await self._wakeup.wait()

    def done(self, key: K) -> None:
        """Release ``key``; if it was marked again meanwhile, queue it once more."""
        self._processing.discard(key)
        if key in self._processing_background:
            self._processing_background.discard(key)
            if self._background:
                self._notify()  # a background slot is free: a waiting worker may take the next key
        background = self._redo.pop(key, None)
        if background is not None:
            self.add(key, background=background)

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
