"""Coalescing small writes into few jobs of a worker thread (group commit).

Each hand-over to a worker thread and back costs the event loop the GIL for a while (the woken
thread takes it), which under load cost more than the one-row SQLite statement itself. A
``WriteBatcher`` keeps at most one job in flight: the items submitted while the loop runs its
current callbacks, and all those submitted while the previous job ran, go to ``write_many`` as one
list, in one job of the given executor (the shard's single database writer for the registration
claims; the loop's default executor for the registrations' record writes to a local store), and each
caller gets the result at its position. ``write_many`` decides the transaction (normally one for the
whole list); if it raises, every caller of that batch gets the exception. A lone write is sent at
once, so waiting for a running job costs a caller no more than the job it would otherwise have queued
behind.

Measured with ``bench/registration.py`` before the in-flight rule: 1,001 claims went out in 994 jobs
(one per loop turn), each about 2 ms of the writer's time, mostly spent waiting for the GIL; the
queue behind them made the claim 34 ms of a registration's 63 ms (median).

A caller that is cancelled while waiting gets nothing, but its item may already be in a running
batch: as with a single ``run_in_executor`` call, cancellation does not undo a write.
This module must not know what is written.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class WriteBatcher(Generic[T, R]):
    """Runs ``write_many`` on ``executor`` (None: the loop's default one) for the items submitted in
    one loop turn (see above)."""

    def __init__(self, executor: Executor | None, write_many: Callable[[list[T]], Sequence[R]]) -> None:
        self._executor = executor
        self._write_many = write_many
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._running = False  # a job is in the executor; what is submitted meanwhile waits for it
        #: Batches handed to the executor so far, and the items in them (for tests and metrics).
        self.batches = 0
        self.items = 0

    async def submit(self, item: T) -> R:
        """Queue ``item`` for the next batch and wait for its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, future))
        if len(self._pending) == 1 and not self._running:
            loop.call_soon(self._flush, loop)
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._running or not self._pending:
            return
        batch, self._pending = self._pending, []
        self._running = True
        self.batches += 1
        self.items += len(batch)
        try:
            job = loop.run_in_executor(self._executor, self._write_many, [item for item, _ in batch])
        except RuntimeError as exc:  # the executor was shut down: this batch fails, nothing waits for it
            self._running = False
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        job.add_done_callback(functools.partial(self._done, batch, loop))

    def _done(
        self,
        batch: list[tuple[T, asyncio.Future[R]]],
        loop: asyncio.AbstractEventLoop,
        job: asyncio.Future[Sequence[R]],
    ) -> None:
        self._running = False
        self._settle(batch, job)
        if self._pending:  # submitted while the job ran: the next batch, after this loop turn
            loop.call_soon(self._flush, loop)

    @staticmethod
    def _settle(batch: list[tuple[T, asyncio.Future[R]]], job: asyncio.Future[Sequence[R]]) -> None:
        if job.cancelled():  # the executor was shut down before the job ran
            for _, future in batch:
                future.cancel()
            return
        error = job.exception()
        results = job.result() if error is None else ()
        if error is None and len(results) != len(batch):
            error = RuntimeError(f"write_many returned {len(results)} results for {len(batch)} items")
        for i, (_, future) in enumerate(batch):
            if future.done():  # its caller was cancelled
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(results[i])
