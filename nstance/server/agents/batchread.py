"""Point reads that arrive together are answered by one bulk read in a worker thread.

When thousands of agents reconnect at once (a new leader, a network blip), each of their streams
needs its instance row before anything else. Read one at a time on the event loop, those reads ran in
the same loop turn and held it for seconds; read one at a time in threads, each would cost a thread
hand-off. ``BatchReader.get`` queues the key and waits; one task per burst gives the other callers
of the same loop turn a chance to queue theirs, then reads up to ``max_batch`` keys per call of
``read_many`` in a worker thread until the queue is empty. Every caller gets its own value (None when
``read_many`` did not return the key), or the error of the bulk read its key was part of.

This module only batches: what is read, and from where, is ``read_many``'s business.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: Keys per bulk read: one query with this many parameters, short enough to share the GIL fairly.
MAX_BATCH = 500


class BatchReader(Generic[K, V]):
    """Coalesces concurrent ``get`` calls into bulk ``read_many`` calls (see the module docstring)."""

    def __init__(self, read_many: Callable[[list[K]], Mapping[K, V]], *, max_batch: int = MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1 (got {max_batch})")
        self._read_many = read_many
        self._max_batch = max_batch
        self._waiting: dict[K, list[asyncio.Future[V | None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self.reads = 0  # bulk reads made, for tests

    async def get(self, key: K) -> V | None:
        """The value of ``key`` (None if there is none), read together with other keys asked for now."""
        future: asyncio.Future[V | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append(future)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="batch-read")
        return await future

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # the rest of this loop turn's callers queue their keys first
        while self._waiting:
            keys = list(self._waiting)[: self._max_batch]
            waiters = {key: self._waiting.pop(key) for key in keys}
            self.reads += 1
            try:
                found = await asyncio.to_thread(self._read_many, keys)
            except asyncio.CancelledError:  # the loop is shutting down: nobody gets an answer
                for futures in [*waiters.values(), *self._waiting.values()]:
                    for future in futures:
                        future.cancel()
                self._waiting.clear()
                raise
            except Exception as exc:  # noqa: BLE001 - handed to every caller of this batch
                for futures in waiters.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(exc)
                continue
            for key, futures in waiters.items():
                value = found.get(key)
                for future in futures:
                    if not future.done():
                        future.set_result(value)
