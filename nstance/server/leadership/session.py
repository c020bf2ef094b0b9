"""The leader session: what this server runs while it leads its shard, and how it starts and stops.

On acquiring leadership ``start`` moves the leader address here (``leadernet``), rebuilds the cache
from the records, syncs with the provider and resolves the config's images (``images``) - retried
with backoff until it succeeds or leadership is lost - then starts the reconciler, the GC loop, the
config check, the instance metrics and the image refresh, all as tasks of one ``LeaderTerm``. On
losing leadership every one of those tasks (recovery included) is cancelled at once; at an orderly
shutdown while still leading, in-flight provider calls - each of which records its own outcome - get
``shard.shutdown_timeout`` to finish. Either way it then releases the leader address. Leadership
starts a new frame of the shard's ``LeaderClock`` (``leadertime``). A corrupt cache found while
leading is repaired by stepping down and leading again (``CacheRepair``).

The Operator API is not here (``nstance.server.shard``): the shard owns one session and hands it the
one thing it needs back, ``on_config_change``, called with each change the config check finds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable

from nstance.core.backoff import Backoff
from nstance.core.errors import NstanceError
from nstance.core.ids import GroupKey
from nstance.db import repo
from nstance.db.quarantine import is_corruption
from nstance.server.leadership.leadernet import LeaderAddress
from nstance.server.leadership.leaderterm import LeaderTerm
from nstance.server.reconcile.cacherepair import CacheRepair
from nstance.server.reconcile.gc import gc_cycle
from nstance.server.reconcile.images import ImageService
from nstance.server.reconcile.instances import InstanceOps
from nstance.server.reconcile.reconciler import Reconciler
from nstance.server.reconcile.recovery import rebuild_cache, sync_provider
from nstance.server.state.confighealth import report_config
from nstance.server.state.configstate import ConfigChange
from nstance.server.state.context import ShardContext

log = logging.getLogger(__name__)

#: Seconds between refreshes of the per-group instance gauges.
METRICS_INTERVAL = 5.0
#: Seconds between the leader's checks of the config documents' ETags (two HEAD requests each).
CONFIG_CHECK_INTERVAL = 30.0


class LeaderSession:
    """Starts and stops the leader's work; between the two, the current term's reconciler."""

    def __init__(
        self,
        ctx: ShardContext,
        ops: InstanceOps,
        *,
        on_config_change: Callable[[ConfigChange], None],
        on_recovered: Callable[[], Awaitable[None]] | None = None,
        resync_interval: float = 60.0,
        metrics_interval: float = METRICS_INTERVAL,
    ) -> None:
        self.ctx = ctx
        self.ops = ops
        self._on_config_change = on_config_change
        #: Called once per leadership when the cache has been rebuilt (the agents check their sessions).
        self._on_recovered = on_recovered
        self._resync_interval = resync_interval
        self._metrics_interval = metrics_interval
        self.images = ImageService(ctx)
        self.leader_net = LeaderAddress(ctx)
        self.reconciler: Reconciler | None = None
        self._leader_tasks: list[asyncio.Task[None]] = []
        #: Every task of the current leadership (recovery included): cancelled together when it is lost.
        self._term = LeaderTerm()
        self._address_task: asyncio.Task[None] | None = None
        self._lead_lock = asyncio.Lock()
        self.leading = False
        self.cache_repair = CacheRepair(
            ctx, stop_leading=self.stop, start_leading=self.start, set_hold=ops.set_hold
        )
        with contextlib.suppress(RuntimeError):  # no running loop: attached when leadership starts
            self.cache_repair.attach()

    def enqueue(self, keys: Iterable[GroupKey]) -> None:
        """Mark groups for reconcile (no-op while not leading)."""
        if self.reconciler is not None:
            for key in keys:
                self.reconciler.enqueue(key)

    def health_deadline(self, key: GroupKey) -> None:
        """Reconcile ``key`` when an agent that just registered could first count as silent."""
        if self.reconciler is not None:
            self.reconciler.check_health_after(key)

    async def start(self) -> None:
        """Recover state and start the reconciler and GC (called when leadership is acquired).

        The recovery runs as a task of the leadership term, so losing leadership cancels it at once;
        this then returns normally (a cancellation of the caller itself still propagates).
        """
        recovery = self._term.start(self._recover_and_lead(), "recovery")
        try:
            await recovery
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            log.info("leadership lost during recovery")

    async def _recover_and_lead(self) -> None:
        async with self._lead_lock:
            if self.leading:
                return
            ctx = self.ctx
            self.cache_repair.attach()
            ctx.leader_clock.restart()
            log.info("shard %s: leading; rebuilding the cache from object storage", ctx.identity.shard)
            if self._address_task is None or self._address_task.done():
                self._address_task = self._term.start(self.leader_net.hold(), "leader-network")
            backoff = Backoff(base=1.0, cap=30.0)
            attempt = 0
            while True:
                if not ctx.is_leader():
                    log.info("leadership lost during recovery")
                    await self._release_address()
                    return
                try:
                    # Fresh from storage or not at all: a stale copy may miss acknowledged group changes.
                    try:
                        await asyncio.to_thread(
                            functools.partial(ctx.config.load, True, require_storage=True)
                        )
                    finally:
                        report_config(ctx, ctx.config.fault)
                    groups = await rebuild_cache(ctx, self.ops)
                    report = await sync_provider(ctx, self.ops)
                    groups |= report.groups
                    await self.images.refresh()  # creates need Image.<name> before the first reconcile
                    if self._on_recovered is not None:
                        await self._on_recovered()
                    break
                except Exception as exc:
                    if not isinstance(exc, (NstanceError, OSError)) and not is_corruption(exc):
                        raise
                    if is_corruption(exc):  # a damaged cache cannot be rebuilt in place: start a new one
                        await asyncio.to_thread(ctx.db.replace_corrupt_file)
                    delay = backoff.delay(attempt)
                    attempt += 1
                    log.error("recovery failed: %s; retrying in %.1fs", exc, delay)
                    await asyncio.sleep(delay)
            reconciler = Reconciler(ctx, self.ops, resync_interval=self._resync_interval)
            self.reconciler = reconciler
            self.leading = True
            ctx.metrics.set_leader("shard", True)
            self._leader_tasks = [
                self._term.start(reconciler.run(), "reconciler"),
                self._term.start(self._gc_loop(reconciler), "gc"),
                self._term.start(self._metrics_loop(), "metrics"),
                self._term.start(self._config_loop(), "config"),
                self._term.start(self.images.run(), "images"),
            ]
            await reconciler.enqueue_all()
            for key in groups:
                reconciler.enqueue(key)

    async def stop(self, grace: float | None = None) -> None:
        """Stop reconciling and GC.

        Leadership lost: every task of the term (recovery included) is cancelled at once. Still leading
        (an orderly shutdown): in-flight steps get ``grace`` seconds to finish, then are cancelled.
        """
        lost = not self.ctx.is_leader()
        if lost or not self.leading:
            self._term.cancel()  # before taking the lock, which a running recovery holds
        async with self._lead_lock:
            if not self.leading:
                await self._release_address()
                return
            self.leading = False
            self.ctx.metrics.set_leader("shard", False)
            timeout = grace
            if timeout is None:
                snapshot = self.ctx.config.snapshot()
                timeout = snapshot.config.shard.shutdown_timeout.total_seconds() if snapshot else 10.0
            if lost:
                timeout = 0.0
            if self.reconciler is not None:
                await self.reconciler.close()
            tasks, self._leader_tasks = self._leader_tasks, []
            for task in tasks:
                if lost or task.get_name() in ("gc", "metrics", "images", "config"):
                    task.cancel()
            _done, pending = await asyncio.wait(tasks, timeout=max(timeout, 0.01))
            for task in pending:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if pending:
                log.warning("%d in-flight tasks were cancelled after %.1fs", len(pending), timeout)
            try:
                await asyncio.wait_for(self.ops.followups.flush(), timeout=max(timeout, 0.01))
            except TimeoutError:
                log.warning(
                    "%d instance records not finished within %.1fs; the next leader adopts those VMs by tag",
                    self.ops.followups.pending,
                    timeout,
                )
            self.reconciler = None
            await self.ops.lbs.close()
            await self._release_address()
            log.info("shard %s: no longer leading", self.ctx.identity.shard)

    async def _release_address(self) -> None:
        task, self._address_task = self._address_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.leader_net.release()

    async def _gc_loop(self, reconciler: Reconciler) -> None:
        while True:
            snapshot = self.ctx.config.snapshot()
            interval = snapshot.config.shard.garbage_collection.interval.total_seconds() if snapshot else 60.0
            if interval <= 0:
                return
            await asyncio.sleep(interval)
            try:
                report = await gc_cycle(self.ctx, self.ops)
            except NstanceError as exc:
                log.warning("gc cycle failed: %s", exc)
                continue
            except Exception:
                log.exception("gc cycle failed unexpectedly; the next cycle runs as usual")
                continue
            for key in report.groups:
                reconciler.enqueue(key)

    async def _config_loop(self) -> None:
        """Pick up config.jsonc and groups.jsonc changes nobody told this leader about.

        RefreshConfig and this server's own group edits apply at once; this covers the rest: an
        upload without a refresh, or a groups.jsonc write whose answer was lost (it may have landed
        although the call failed). Unchanged ETags cost two HEAD requests and nothing else.
        """
        while True:
            await asyncio.sleep(CONFIG_CHECK_INTERVAL)
            try:
                change = await asyncio.to_thread(self.ctx.config.load)
            except NstanceError as exc:
                log.warning("config check failed (keeping the current config): %s", exc)
                continue
            finally:
                report_config(self.ctx, self.ctx.config.fault)
            if change.updated:
                log.info("config changed in object storage; applying it")
                self._on_config_change(change)

    async def standby_config_loop(self) -> None:
        """On a standby, check the config documents as the leader does, to report a broken one.

        The standby's view follows storage (its reads stay current), and ``/health``, the metrics and
        ``WatchErrors`` say when the stored config is broken, empty or gone. While leading, the
        leader's own check (``_config_loop``) does this instead.
        """
        while True:
            await asyncio.sleep(CONFIG_CHECK_INTERVAL)
            if self.leading:
                continue
            try:
                await asyncio.to_thread(self.ctx.config.load)
            except NstanceError as exc:
                log.warning("config check failed (keeping the current config): %s", exc)
            finally:
                report_config(self.ctx, self.ctx.config.fault)

    async def _metrics_loop(self) -> None:
        while True:
            await asyncio.to_thread(self._update_instance_metrics)  # an aggregate over every row
            await asyncio.sleep(self._metrics_interval)

    def _update_instance_metrics(self) -> None:
        with self.ctx.db.read_connection() as session:
            counts = repo.count_instances(session)
        self.ctx.metrics.set_instances(counts)
