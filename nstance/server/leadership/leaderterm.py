"""The tasks of one leadership term, cancelled together the moment leadership is lost.

``LeaderSession.start`` enrols itself (recovery, with its retries) and every loop it starts (reconciler,
GC, config check, image refresh, metrics) in a ``LeaderTerm``. When leadership is lost, ``cancel`` stops
them all at once: none of them runs on until its next iteration or its next fence check. Writes that
were already past their fence are the only ones that can still land, and those are bounded by the
election's margin between the end of our lease and a follower's takeover. At an orderly shutdown
while still leading, the tasks instead get ``shard.shutdown_timeout`` to finish (``LeaderSession.stop``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class LeaderTerm:
    """A set of tasks that live and die with one leadership term."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` as a task of this term."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.enrol(task)
        return task

    def enrol(self, task: asyncio.Task[Any] | None) -> None:
        """Make an existing task (e.g. the one running recovery) part of this term."""
        if task is None or task.done():
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def tasks(self) -> list[asyncio.Task[Any]]:
        """The term's tasks that have not finished, in no particular order."""
        return [t for t in self._tasks if not t.done()]

    def cancel(self) -> list[asyncio.Task[Any]]:
        """Cancel every task of the term except the caller; return the ones cancelled."""
        current = asyncio.current_task()
        cancelled = [t for t in self.tasks() if t is not current]
        for task in cancelled:
            task.cancel()
        return cancelled
