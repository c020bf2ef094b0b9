"""A level-triggered work queue per controller: which objects need a reconcile, and when.

kopf watches the API server and calls our event handlers; the handlers only *mark* an object's key
(namespace, name) here. A small pool of workers takes keys and runs the controller's reconcile, which
reads the live object and runs its steps. The queue guarantees what a controller needs to be correct
under bursts and restarts:

* a key is queued at most once (bursts of events coalesce into one reconcile);
* one key is never reconciled by two workers at once; a key marked while it is being reconciled is
  run again right after (no change is lost);
* a reconcile may ask to run again after a delay (``Requeue``); the earliest pending delay wins and
  an immediate mark replaces it;
* a reconcile that raises is retried with exponential backoff (and logged), never dropped;
* ``observe`` marks a key only when the object's *trigger* (for example its generation and deletion
  state) differs from the last one seen, so an object's own status writes do not cause reconciles.

The keys themselves live in the level-triggered queue every program shares
(``nstance.core.workqueue``): coalescing, one worker per key, delayed marks. This module adds what a
controller needs on top: triggers, failure backoff, requeue-after, ``wait_idle``, names and logging.

We use this instead of kopf's change handlers because kopf supports a single finalizer name per
operator, while each Nstance kind has its own (wire-compatible with upstream); kopf still does the
listing, watching, reconnecting and the admission webhook.

Must not: talk to Kubernetes or shards, or know what a reconcile does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field

from nstance.core import workqueue
from nstance.core.backoff import Backoff

Key = tuple[str, str]
"""(namespace, name) of the object to reconcile ("" namespace for cluster-scoped objects)."""

Reconcile = Callable[[Key], Awaitable[float | None]]
"""Reconcile one key; return seconds until it should run again, or None."""

log = logging.getLogger(__name__)


@dataclass
class WorkQueue:
    """Keys waiting for a reconcile, run by ``workers`` tasks once ``start`` is called."""

    name: str
    reconcile: Reconcile
    workers: int = 4
    backoff: Backoff = field(default_factory=lambda: Backoff(base=0.5, cap=30.0))
    expected: tuple[type[BaseException], ...] = ()
    """Failures logged without a traceback (API refusals and the like); others are logged with one."""

    def __post_init__(self) -> None:
        self._keys: workqueue.WorkQueue[Key] = workqueue.WorkQueue()
        self._seen: dict[Key, Hashable] = {}
        self._failures: dict[Key, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._idle = asyncio.Event()
        self._idle.set()
        self.reconciles = 0
        """Reconciles run so far (for tests and metrics)."""

    # --- marking ------------------------------------------------------------------------------

    def enqueue(self, key: Key, after: float = 0.0) -> None:
        """Reconcile ``key`` now (``after`` = 0) or after ``after`` seconds (earliest request wins).

        A mark now replaces a pending delayed run."""
        if after > 0:
            self._keys.add_after(key, after)
            return
        self._keys.cancel(key)
        self._keys.add(key)

    def observe(self, key: Key, trigger: Hashable) -> None:
        """Enqueue ``key`` if ``trigger`` differs from the last one observed for it."""
        if key in self._seen and self._seen[key] == trigger:
            return
        self._seen[key] = trigger
        self.enqueue(key)

    def forget(self, key: Key) -> None:
        """The object is gone: drop its trigger, backoff and pending delayed run."""
        self._seen.pop(key, None)
        self._failures.pop(key, None)
        self._keys.cancel(key)

    # --- running ------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Keys queued, running or waiting for a delayed run."""
        return len(self._keys.keys)

    @property
    def busy(self) -> bool:
        """Whether a key is queued or being reconciled now."""
        return bool(len(self._keys) or self._keys.in_progress)

    async def wait_idle(self) -> None:
        """Return once nothing is queued or running (delayed runs do not count)."""
        while self.busy:
            self._idle.clear()
            await self._idle.wait()

    def start(self) -> None:
        if self._tasks:
            return
        for index in range(self.workers):
            self._tasks.append(asyncio.create_task(self._work(), name=f"{self.name}-worker-{index}"))

    async def stop(self) -> None:
        await self._keys.close()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            key = await self._keys.get()
            if key is None:
                return
            try:
                await self._run(key)
            finally:
                self._keys.done(key)
                if not self.busy:
                    self._idle.set()

    async def _run(self, key: Key) -> None:
        """Reconcile ``key`` once and decide when it runs again: at once when it was marked meanwhile
        (a pending delayed run is dropped), else after the delay it asked for or its failure backoff."""
        after: float | None = None
        try:
            self.reconciles += 1
            after = await self.reconcile(key)
            self._failures.pop(key, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            attempt = self._failures.get(key, 0)
            self._failures[key] = attempt + 1
            after = self.backoff.delay(attempt)
            log.warning(
                "%s %s/%s: reconcile failed (%s: %s); retrying in %.1fs",
                self.name,
                key[0],
                key[1],
                type(exc).__name__,
                exc,
                after,
                exc_info=not isinstance(exc, self.expected) or log.isEnabledFor(logging.DEBUG),
            )
        if self._keys.rerun_pending(key):
            self._keys.cancel(key)  # ``done`` queues it again now
        elif after is not None:
            self.enqueue(key, after)
