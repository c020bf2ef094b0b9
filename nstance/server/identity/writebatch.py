"""Coalescing small writes made in one event-loop turn into one job of the database writer thread.

Each hand-over to a worker thread and back costs the event loop the GIL for a while (the woken
thread takes it), which under load cost more than the one-row SQLite statement itself. A
``WriteBatcher`` collects the items submitted while the loop runs its current callbacks and hands
them to ``write_many`` as one list, in one job of the given executor (the shard's single database
writer), and gives each caller the result at its position. ``write_many`` decides the transaction
(normally one for the whole list); if it raises, every caller of that batch gets the exception.

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
    """Runs ``write_many`` on ``executor`` for the items submitted in one loop turn (see above)."""

    def __init__(self, executor: Executor, write_many: Callable[[list[T]], Sequence[R]]) -> None:
        self._executor = executor
        self._write_many = write_many
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        #: Batches handed to the executor so far, and the items in them (for tests and metrics).
        self.batches = 0
        self.items = 0

    async def submit(self, item: T) -> R:
        """Queue ``item`` for the next batch and wait for its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, future))
        if len(self._pending) == 1:
            loop.call_soon(self._flush, loop)
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._pending = self._pending, []
        self.batches += 1
        self.items += len(batch)
        job = loop.run_in_executor(self._executor, self._write_many, [item for item, _ in batch])
        job.add_done_callback(functools.partial(self._settle, batch))

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
