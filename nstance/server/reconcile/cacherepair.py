"""Recovering from a corrupt SQLite cache without a person: step down, replace the file, lead again.

The cache is only a copy of object storage (plus ephemeral health and drain state), so when a
session reports corruption (``Database.on_corrupt``, from any thread) the leader stops leading - no
decision is taken from a damaged view - moves the file aside (``Database.replace_corrupt_file``: it
is kept, not deleted), and, if it still holds the lease, leads again, which rebuilds the cache from
the records and the provider. While this runs ``/health`` says so; a standby only replaces the file.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from nstance.server.state.context import ShardContext

log = logging.getLogger(__name__)

TOPIC = "sqlite-cache"


class CacheRepair:
    """Watches the shard's Database for corruption and repairs it (one repair at a time)."""

    def __init__(
        self,
        ctx: ShardContext,
        *,
        stop_leading: Callable[[], Awaitable[None]],
        start_leading: Callable[[], Awaitable[None]],
        set_hold: Callable[[str, str | None], None],
    ) -> None:
        self._ctx = ctx
        self._stop_leading = stop_leading
        self._start_leading = start_leading
        self._set_hold = set_hold
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self.repairs = 0

    def attach(self) -> None:
        """Start watching (call from the event loop)."""
        self._loop = asyncio.get_running_loop()
        self._ctx.db.on_corrupt = self.notice

    def notice(self, exc: BaseException) -> None:
        """The cache is corrupt (any thread): schedule a repair unless one is running."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(
            self._schedule, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        )

    def _schedule(self, why: str) -> None:
        if self._task is not None and not self._task.done():
            return
        self._task = asyncio.get_running_loop().create_task(self.repair(why), name="cache-repair")

    async def repair(self, why: str) -> None:
        """Step down, move the corrupt file aside, start an empty one, lead again if still elected."""
        self._set_hold(TOPIC, f"the SQLite cache is corrupt ({why}); rebuilding it from object storage")
        log.error("sqlite cache corrupt (%s): stepping down to rebuild it from object storage", why)
        try:
            await self._stop_leading()
            await asyncio.to_thread(self._ctx.db.replace_corrupt_file)
            self.repairs += 1
            if self._ctx.is_leader():
                await self._start_leading()
        except Exception as exc:  # noqa: BLE001 - reported; the next corrupt read schedules another try
            log.error("sqlite cache repair failed: %s", exc)
            return
        self._set_hold(TOPIC, None)
        log.info("sqlite cache rebuilt")
