"""One writer of ``groups.jsonc`` per server: concurrent group edits fold into one compare-and-swap write.

UpsertGroup and DeleteGroup hand their edit (a pure function of the dynamic groups) to
``GroupsWriter.submit``. While a write is in progress further edits queue; the next write applies
every queued edit in order to the current document and stores the result once. Concurrent calls on
one server therefore never race each other on the document's ETag (a burst of 100 pool changes from
the operator used to retry most of its writes and exhaust the retries of some); compare-and-swap
retries remain only for writers on other servers (a handover). An edit that refuses (raises) fails
only its own call; the others of the batch are written. The installed snapshot is replaced once per
write, in the same worker thread (``ConfigState.replace_dynamic`` merges the changed groups), and
``on_change`` is called on the event loop with the resulting change; the disk cache is rewritten
``CACHE_FLUSH_DELAY_S`` later, once for all the writes in between, so it stays off the way from an
edit to the reconcile it causes.
The document is serialised with a ``GroupsText`` kept across writes, so a write encodes only the
entries its edits changed (the whole document is still written: object storage holds one file).

This module must not decide what an edit means (``nstance.config.editing``) and does no I/O on the
event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from nstance.config.groupstext import GroupsText
from nstance.config.schema import DynamicGroups
from nstance.core.ids import GroupKey
from nstance.objectstore.base import ObjectStore
from nstance.server.state.configstate import ConfigChange, ConfigState
from nstance.server.state.context import exit_at_fault_point
from nstance.server.state.dynamic_groups import edit_dynamic_groups

log = logging.getLogger(__name__)

Edit = Callable[[DynamicGroups], DynamicGroups]

#: Seconds from a write to the disk cache's rewrite. The cache is an fsynced copy of the whole
#: document for start-ups without storage: with 10,000 groups it is a megabyte, about 6 ms of CPU to
#: encode, and written at once it took the GIL from the reconcile that the write had just started.
#: Every write within the delay shares one rewrite; an orderly shutdown writes it at once (``flush_now``).
CACHE_FLUSH_DELAY_S = 1.0


@dataclass
class _Batch:
    edits: list[Edit]
    #: The (tenant, group) each edit changes, or None when an edit did not say.
    keys: list[GroupKey | None] = field(default_factory=list)
    outcomes: list[BaseException | None] = field(default_factory=list)
    #: The document the last ``apply`` started from.
    base: DynamicGroups | None = None

    def apply(self, current: DynamicGroups) -> DynamicGroups:
        """Every edit in order; a refusing edit leaves the document as it was and records its error.

        Pure apart from ``outcomes`` and ``base`` (rebuilt on each call: a compare-and-swap retry
        runs it again).
        """
        self.outcomes = []
        self.base = current
        state = current
        for edit in self.edits:
            try:
                state = edit(state)
            except Exception as exc:  # noqa: BLE001 - the error belongs to that edit's caller
                self.outcomes.append(exc)
            else:
                self.outcomes.append(None)
        return state

    def edited(self) -> tuple[DynamicGroups, set[GroupKey]] | None:
        """``(base, keys)``: the last applied document and every group the edits may have changed."""
        if self.base is None or any(key is None for key in self.keys):
            return None
        return self.base, {key for key in self.keys if key is not None}


class GroupsWriter:
    """Serialises and batches this server's edits of ``groups.jsonc`` (see the module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        config: ConfigState,
        on_change: Callable[[ConfigChange], None],
        *,
        fault_point: Callable[[str], None] = exit_at_fault_point,
    ) -> None:
        self._store = store
        self._fault_point = fault_point
        self._config = config
        self._on_change = on_change
        self._queue: list[tuple[Edit, GroupKey | None, asyncio.Future[int]]] = []
        self._task: asyncio.Task[None] | None = None
        self._text = GroupsText()  # used by one worker thread at a time (writes are sequential)
        self.writes = 0  # documents written (or found unchanged), for tests and benchmarks
        self._flush: asyncio.Task[None] | None = None
        self._flush_wanted = False

    async def submit(self, edit: Edit, key: GroupKey | None = None) -> int:
        """Apply ``edit`` in the next write; once it is stored and installed, the number of edits that
        write held (1: this one alone). Raises the edit's error.

        ``key`` is the one group ``edit`` changes, when it changes only one: the snapshot is then
        updated without comparing the other groups.
        """
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append((edit, key, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="groups-writer")
        # A caller that goes away does not withdraw its edit: it is written with the others.
        return await asyncio.shield(future)

    async def _drain(self) -> None:
        while self._queue:
            queued, self._queue = self._queue, []
            batch = _Batch([edit for edit, _, _ in queued], [key for _, key, _ in queued])
            try:
                change = await asyncio.to_thread(self._write, batch)
            except BaseException as exc:  # handed to every caller of the batch
                # Anything else (a crash, a cancellation) also ends this writer: the queued callers
                # get the same error, as they would have had their own call failed that way.
                stop = not isinstance(exc, Exception)
                cancelled = isinstance(exc, asyncio.CancelledError)
                for _, _, future in queued + (self._queue if stop else []):
                    if future.done():
                        continue
                    if cancelled:
                        future.cancel()
                    else:
                        future.set_exception(exc)
                if cancelled:
                    raise
                if stop:
                    self._queue = []
                    return
                continue
            if change is not None:
                self._on_change(change)
            for (_, _, future), outcome in zip(queued, batch.outcomes, strict=True):
                if future.done():
                    continue
                if outcome is None:
                    future.set_result(len(queued))
                else:
                    future.set_exception(outcome)
            if change is not None:
                self._flush_soon()

    def _flush_soon(self) -> None:
        """Have the disk cache written ``CACHE_FLUSH_DELAY_S`` from now, once for every write until then."""
        self._flush_wanted = True
        if self._flush is None or self._flush.done():
            self._flush = asyncio.create_task(self._flush_later(), name="groups-cache-flush")

    async def flush_now(self) -> None:
        """Rewrite the disk copy now if a rewrite is waiting for its delay (an orderly shutdown)."""
        if self._flush is not None:
            self._flush.cancel()  # a rewrite already in its thread finishes; the next one is a no-op
        self._flush_wanted = False
        await asyncio.to_thread(self._config.flush_cache)

    async def _flush_later(self) -> None:
        while self._flush_wanted:
            self._flush_wanted = False
            await asyncio.sleep(CACHE_FLUSH_DELAY_S)
            try:
                await asyncio.to_thread(self._config.flush_cache)
            except Exception:  # the copy is a convenience: storage holds the document
                log.exception("rewriting the disk copy of the shard config failed")

    def _write(self, batch: _Batch) -> ConfigChange | None:
        """One compare-and-swap write of every edit of ``batch``, then the snapshot (worker thread)."""
        snapshot = self._config.snapshot()
        known = (snapshot.dynamic, snapshot.groups_etag or None) if snapshot is not None else None
        dynamic, etag = edit_dynamic_groups(
            self._store,
            batch.apply,
            known=known,
            dump=lambda d: self._text.dump(d, batch.edited()),
            edited=batch.edited,
        )
        self.writes += 1
        self._fault_point("after-groups-write")
        if all(outcome is not None for outcome in batch.outcomes):
            return None  # every edit refused: nothing was written
        return self._config.replace_dynamic(
            dynamic, etag, self._text.dump(dynamic), edited=batch.edited(), defer_cache=True
        )
