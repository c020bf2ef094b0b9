"""The drain coordinator: one task per instance event, each running the drain steps.

Per shard a WatchInstances stream (``streams.keep_stream``; the server sends the drains in progress
on connect, then live events). Each event is dispatched to a task of its own keyed by instance ID, so a
long drain never holds up other instances or shards:

* ``pending_deletion``: ``STEPS``; for an instance whose task is running, nothing (a duplicate); for
  an instance whose drain already finished, ``ACKNOWLEDGE_AGAIN_STEPS`` (idempotent on the server),
  never a second drain.
* ``deleted``: the running drain, unless already acknowledged, is cancelled (draining further is
  pointless), and ``DELETED_STEPS`` run, again from the top after an API failure (with backoff, at most
  ``CLEANUP_ATTEMPTS`` times).

A shard removed from the config stops its drains. Finished drains are remembered ``FINISHED_MEMORY``
seconds. Must not: start a second drain for one instance, or raise for shard or API trouble (``run``
ends only when cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final

from google.protobuf.empty_pb2 import Empty

from nstance.core.steps import run_steps
from nstance.operator.context import OperatorContext
from nstance.operator.drain.reasons import STATUS_DELETED, STATUS_PENDING_DELETION
from nstance.operator.drain.rules import event_deadline
from nstance.operator.drain.state import DeletedState, DrainLedger, DrainState
from nstance.operator.drain.steps import ACKNOWLEDGE_AGAIN_STEPS, DELETED_STEPS, STEPS
from nstance.operator.drain_machines import MachineIndex, machine_index_for
from nstance.operator.kube import KubeError
from nstance.operator.objectlog import ObjectLogger
from nstance.operator.streams import ShardStreams
from nstance.rpc import operator_pb2

log = logging.getLogger(__name__)

FINISHED_MEMORY: Final = 3600.0
"""Seconds a finished drain is remembered (a later event for it is only acknowledged again)."""
CLEANUP_ATTEMPTS: Final = 6
"""Runs of the ``deleted`` steps when the API server fails (with backoff between them)."""


class DrainCoordinator:
    """Follows WatchInstances on every shard and drains Nodes; ``run`` until cancelled."""

    def __init__(self, ctx: OperatorContext, *, machines: MachineIndex | None = None) -> None:
        self._ctx = ctx
        self._streams = ShardStreams(ctx)
        self._backoff = self._streams.backoff
        self._machines, self._own_machines = machine_index_for(ctx, machines)
        self._ledger = DrainLedger()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._task_shard: dict[str, str] = {}
        self._cleanups: dict[str, asyncio.Task[None]] = {}
        self._connected: set[str] = set()
        self.duplicates_ignored = 0
        """Events for an instance whose drain was running (for example a snapshot after a reconnect)."""

    @property
    def drains_started(self) -> int:
        """How many drains (cordon + evict) this coordinator began; duplicates never count."""
        return self._ledger.started

    def draining(self) -> set[str]:
        """Instance IDs whose drain (or re-acknowledgement) is running now."""
        return {iid for iid, task in self._tasks.items() if not task.done()}

    async def run(self) -> None:
        """Follow every shard's WatchInstances until cancelled; never raises for shard or API trouble."""
        try:
            async with asyncio.TaskGroup() as tasks:
                if self._own_machines:
                    tasks.create_task(self._machines.run(), name="drain:machine-index")
                tasks.create_task(
                    self._streams.follow(
                        self._watch_instances, name="WatchInstances", on_removed=self._shard_removed
                    ),
                    name="drain:instances",
                )
        finally:
            for task in [*self._tasks.values(), *self._cleanups.values()]:
                task.cancel()
            for task in [*self._tasks.values(), *self._cleanups.values()]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def connected_shards(self) -> set[str]:
        """Shards whose WatchInstances stream is established right now (known once the server answered:
        its response headers, usually sent with its first event)."""
        return set(self._connected)

    async def _watch_instances(self, shard: str) -> None:
        async def connected(_shard: str) -> None:
            self._connected.add(shard)

        async def lost(_shard: str, _error: str) -> None:
            self._connected.discard(shard)

        try:
            await self._follow_instances(shard, connected, lost)
        finally:
            self._connected.discard(shard)

    async def _follow_instances(
        self,
        shard: str,
        connected: Callable[[str], Awaitable[None]],
        lost: Callable[[str, str], Awaitable[None]],
    ) -> None:
        await self._streams.keep(
            shard,
            name="WatchInstances",
            open_call=lambda stub: stub.WatchInstances(Empty()),
            on_message=self._instance_event,
            on_lost=lost,
            on_connected=connected,
        )

    async def _shard_removed(self, shard: str) -> None:
        for iid in [iid for iid, owner in self._task_shard.items() if owner == shard]:
            task = self._tasks.get(iid)
            if task is not None and not task.done():
                log.info("instance %s: shard %s was removed from the config; its drain stops", iid, shard)
                task.cancel()

    # --- dispatch ----------------------------------------------------------------------------------

    async def _instance_event(self, shard: str, event: operator_pb2.InstanceEvent) -> None:
        iid = event.instance_id
        if not iid:
            log.warning("shard %s: an instance event without an instance id; ignored", shard)
            return
        self._forget_old()
        if event.status == STATUS_DELETED:
            running = self._tasks.get(iid)
            if running is not None and not running.done() and iid not in self._ledger.acked:
                running.cancel()  # the server deleted it: draining further is pointless
            if iid not in self._cleanups:
                self._spawn(self._cleanups, iid, shard, self._server_deleted(shard, event))
            return
        if event.status != STATUS_PENDING_DELETION:
            log.debug("shard %s: instance %s is %s (%s)", shard, iid, event.status, event.reason)
            return
        running = self._tasks.get(iid)
        if running is not None and not running.done():
            self.duplicates_ignored += 1
            log.info("instance %s: drain already running; duplicate event ignored", iid)
            return
        state = DrainState(
            ctx=self._ctx,
            machines=self._machines,
            ledger=self._ledger,
            shard=shard,
            event=event,
            deadline=event_deadline(event, self._ctx.clock.now(), self._ctx.timings.drain_fallback),
            backoff=self._backoff,
        )
        if iid in self._ledger.finished:
            log.info("instance %s: drained before; acknowledging again", iid)
            self._spawn(self._tasks, iid, shard, run_steps(ACKNOWLEDGE_AGAIN_STEPS, state, _logger(iid)))
            return
        self._spawn(self._tasks, iid, shard, run_steps(STEPS, state, _logger(iid)))

    def _spawn(
        self,
        registry: dict[str, asyncio.Task[None]],
        iid: str,
        shard: str,
        work: Coroutine[Any, Any, Any],
    ) -> None:
        task: asyncio.Task[None] = asyncio.create_task(self._guard(iid, work), name=f"drain:{iid}")
        registry[iid] = task
        if registry is self._tasks:
            self._task_shard[iid] = shard

        def done(finished: asyncio.Task[None]) -> None:
            if registry.get(iid) is finished:
                del registry[iid]
                if registry is self._tasks:
                    self._task_shard.pop(iid, None)

        task.add_done_callback(done)

    async def _guard(self, iid: str, work: Coroutine[Any, Any, Any]) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("instance %s: handling its event failed", iid)

    def _forget_old(self) -> None:
        now = self._ctx.clock.monotonic()
        finished = self._ledger.finished
        for iid in [iid for iid, at in finished.items() if now - at >= FINISHED_MEMORY]:
            del finished[iid]
            self._ledger.acked.discard(iid)

    # --- deleted instances -------------------------------------------------------------------------

    async def _server_deleted(self, shard: str, event: operator_pb2.InstanceEvent) -> None:
        iid = event.instance_id
        for attempt in range(CLEANUP_ATTEMPTS):
            state = DeletedState(
                ctx=self._ctx, machines=self._machines, ledger=self._ledger, shard=shard, event=event
            )
            try:
                await run_steps(DELETED_STEPS, state, _logger(iid))
                return
            except KubeError as exc:
                delay = self._backoff.delay(attempt)
                log.warning(
                    "instance %s: clean-up after deletion failed (%s); retrying in %.1fs", iid, exc, delay
                )
                await asyncio.sleep(delay)
        log.error("instance %s: gave up cleaning up its NstanceMachine after %d tries", iid, CLEANUP_ATTEMPTS)


def _logger(iid: str) -> ObjectLogger:
    """The step runner's logger for one instance's drain (messages start with ``drain of instance``)."""
    return ObjectLogger(log, {"object": f"drain of instance {iid}"})
