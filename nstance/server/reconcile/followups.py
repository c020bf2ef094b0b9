"""Record follow-ups: the provider's answer written into the instance record after a create, off the hot path.

A create writes its intent (row + ``pending`` record) before the provider call; that order is what makes
it crash-safe. The second record write - provider id, addresses, status - is bookkeeping: the SQLite
cache gets those details at once (the API and the planner read the cache), and if the process dies
before the record is updated, the next leader finds the VM by its tags and adopts it
(``recovery.sync_provider``). So during a burst of creates the follow-up writes wait until the burst
is over, up to ``max_defer`` seconds, and the CPU they would cost goes to intents and provider calls
first. On a two-core machine that is the difference between scaling out at the provider's pace and
queueing behind our own record writes (``bench/scale_out.py``).

A follow-up replaces the record with If-Match on the intent's ETag; if someone else wrote it meanwhile
(a registration, a delete) it merges only the provider fields and leaves a status that is no longer
``pending`` alone. Writes are fenced: once leadership is lost the queue is dropped, and the new leader
learns the same facts from the provider listing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from nstance.core.errors import NotFound, NstanceError, Unavailable
from nstance.objectstore.base import ObjectStore, PreconditionFailed
from nstance.server.state import records

log = logging.getLogger(__name__)

#: Longest a follow-up waits for a burst of creates to end before it is written anyway (seconds).
MAX_DEFER = 5.0
#: Follow-up writes in flight at once.
PARALLEL = 8


@dataclass(frozen=True, slots=True)
class FollowUp:
    """One record to finish: ``record`` with the provider's fields filled, ``etag`` of the intent."""

    record: records.InstanceRecord
    etag: str
    queued_at: float


def merge_provider_fields(
    current: records.InstanceRecord, finished: records.InstanceRecord
) -> records.InstanceRecord:
    """``current`` with the provider fields of ``finished``; the status only if still ``pending``."""
    status = finished.status if current.status == "pending" else current.status
    return dataclasses.replace(
        current,
        provider_instance_id=finished.provider_instance_id,
        private_ipv4=finished.private_ipv4 or current.private_ipv4,
        private_ipv6=finished.private_ipv6 or current.private_ipv6,
        hostname=finished.hostname or current.hostname,
        status=status,
        last_updated=max(current.last_updated, finished.last_updated),
    )


class RecordFollowUps:
    """A queue of record follow-ups, written when no burst is running or when they are ``max_defer`` old.

    ``busy`` says whether creates are in progress; ``fence`` raises when this process may no longer
    act for the shard. Call ``wake`` when ``busy`` may have turned false.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        busy: Callable[[], bool],
        fence: Callable[[], None],
        max_defer: float = MAX_DEFER,
        parallel: int = PARALLEL,
    ) -> None:
        self._store = store
        self._busy = busy
        self._fence = fence
        self._max_defer = max_defer
        self._parallel = max(1, parallel)
        self._queue: deque[FollowUp] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._writing = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def pending(self) -> int:
        """Follow-ups queued or being written."""
        return len(self._queue) + self._writing

    def add(self, record: records.InstanceRecord, etag: str) -> None:
        """Queue ``record`` (provider fields filled) to replace the intent written with ``etag``."""
        loop = asyncio.get_running_loop()
        self._queue.append(FollowUp(record, etag, loop.time()))
        self._idle.clear()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="record-follow-ups")

    def wake(self) -> None:
        """Re-check now whether queued follow-ups may be written."""
        self._wake.set()

    async def flush(self) -> None:
        """Write everything queued now, whatever ``busy`` says (shutdown, leadership hand-over)."""
        while self._queue:
            await self._write_batch(len(self._queue))
        await self._idle.wait()

    async def settled(self) -> None:
        """Return once nothing is queued or being written."""
        await self._idle.wait()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            if self._busy():
                wait = self._queue[0].queued_at + self._max_defer - loop.time()
                if wait > 0:
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait):
                            await self._wake.wait()
                    continue
                due = sum(1 for f in self._queue if f.queued_at + self._max_defer <= loop.time())
            else:
                due = len(self._queue)
            await self._write_batch(max(1, due))

    async def _write_batch(self, count: int) -> None:
        """Take the ``count`` oldest follow-ups and write them, ``parallel`` at a time."""
        batch = [self._queue.popleft() for _ in range(min(count, len(self._queue)))]
        self._writing += len(batch)
        try:
            gate = asyncio.Semaphore(self._parallel)

            async def one(f: FollowUp) -> None:
                async with gate:
                    try:
                        await asyncio.to_thread(self._write, f)
                    except Exception:
                        log.exception(
                            "instance %s: record follow-up failed unexpectedly", f.record.instance_id
                        )

            await asyncio.gather(*(one(f) for f in batch))
        finally:
            self._writing -= len(batch)
            if not self._queue and not self._writing:
                self._idle.set()

    def _write(self, f: FollowUp) -> None:
        """Write one follow-up (in a worker thread); failures are logged, the VM is adopted by tag later."""
        r = f.record
        try:
            self._fence()
        except Unavailable:
            log.info("instance %s: leadership lost, its record is left to the next leader", r.instance_id)
            return
        try:
            try:
                records.write_record_if_match(self._store, r, f.etag)
            except PreconditionFailed:
                records.modify_record(
                    self._store, r.tenant, r.instance_id, lambda cur: merge_provider_fields(cur, r)
                )
        except NotFound:
            log.info("instance %s: its record is gone (deleted meanwhile); nothing to finish", r.instance_id)
        except NstanceError as exc:
            log.warning(
                "instance %s: created as %s but the record update failed: %s; it is adopted by tag later",
                r.instance_id,
                r.provider_instance_id,
                exc,
            )
