"""The group reconciler: one work-queue key per group, a pure plan, then concurrent provider calls.

``reconcile(key)`` reads the group's wanted state from the config snapshot and its managed instances from
SQLite, asks ``nstance.core.plan.plan_group`` what to do, and does it: deletes and creates of one group
run concurrently (creates are admitted by the shard's ``CreateLimiter``; there is no global lock). A
failed step re-queues the group with exponential backoff and jitter; a drain deadline or expiry age
re-queues it at that time; ``resync`` marks every group dirty periodically, so a missed event costs at
most one resync interval. Only the shard leader reconciles: the check runs at the start of every
reconcile and before every provider call (``ShardContext.fence``). A burst of creates is called off as
soon as the group wants fewer (scaled down or deleted) or this server stops leading (``wanted`` of
``InstanceOps.create_many``); the group is then planned again from what exists.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from datetime import datetime, timedelta

from nstance.config import MergedGroupConfig, infra_hash, legacy_infra_hash
from nstance.core.backoff import Backoff
from nstance.core.ids import GroupKey
from nstance.core.plan import (
    Action,
    GroupPlan,
    PlanInput,
    Reason,
    next_on_demand_wakeup,
    next_wakeup,
    pass_order,
    plan_group,
    plan_on_demand,
)
from nstance.core.workqueue import WorkQueue
from nstance.db import repo
from nstance.db.rows import InstanceRow
from nstance.server.reconcile import members as group_members
from nstance.server.reconcile.create import CreateCancelled, Created
from nstance.server.reconcile.instances import InstanceOps
from nstance.server.reconcile.loadbalancers import RECHECK_AFTER, DeregistrationPending
from nstance.server.reconcile.retire import AdoptionPending
from nstance.server.state.context import ShardContext

log = logging.getLogger(__name__)


#: Drains that are planned rotations (not repairs): they wait until the replacement create succeeded.
ROTATION_REASONS = frozenset({Reason.DRIFT, Reason.ELIGIBLE_EXPIRY, Reason.FORCED_EXPIRY})
#: Groups whose rows are read from SQLite at the same time (worker threads compete with the event loop
#: for the GIL: sixteen concurrent reads of 1,000 rows each stalled the loop for 150 ms).
READ_CONCURRENCY = 2
#: A group whose last read found at most this many rows, and that wants no more, is read on the event
#: loop: well under a millisecond, where the hand-over to a worker thread and back costs more than the
#: read itself whenever the machine is busy (it is on the path from UpsertGroup to the first create).
INLINE_READ_ROWS = 200
#: Groups marked per loop turn by ``enqueue_all``.
ENQUEUE_BATCH = 500
#: One worker in this many may run a resync (background) reconcile: the rest stay free for changes.
BACKGROUND_SHARE = 4
#: Health intervals an agent may miss (while its VM runs) before the instance is replaced.
MISSED_REPORTS = 3


class Reconciler:
    """Keeps every group of the shard at its size while this server leads."""

    def __init__(
        self,
        ctx: ShardContext,
        ops: InstanceOps,
        *,
        workers: int = 16,
        resync_interval: float = 60.0,
        backoff: Backoff | None = None,
    ) -> None:
        self._ctx = ctx
        self._ops = ops
        self._workers = workers
        self._resync_interval = resync_interval
        self._backoff = backoff or Backoff(base=1.0, cap=120.0)
        #: Each group's merged config with its infra hash and legacy infra hash: a resync reconciles
        #: every group every minute, and the config object is replaced only when its config changes.
        self._infra_hashes: dict[GroupKey, tuple[MergedGroupConfig, str, str]] = {}
        self._failures: dict[GroupKey, int] = {}
        self.queue: WorkQueue[GroupKey] = WorkQueue(background_limit=max(1, workers // BACKGROUND_SHARE))
        self._reads = asyncio.Semaphore(READ_CONCURRENCY)
        self._rows_read: dict[GroupKey, int] = {}  # rows each group's last read (or count) found
        self.reconciles = 0
        #: When this leadership began (a reconciler lives for one term): silence is counted from here.
        self.leading_since = ctx.clock.now()
        ops.rejoined.clear()  # times of an earlier leadership's frame: this one counts from its start

    # --- queueing ---------------------------------------------------------------------------

    def enqueue(self, key: GroupKey, *, background: bool = False) -> None:
        """Mark ``key`` for reconcile; ``background`` (the resync) waits behind every other mark."""
        self.queue.add(key, background=background)
        self._ctx.metrics.set_reconcile_queue_depth(len(self.queue))

    def _groups_and_rows(self) -> tuple[list[GroupKey], dict[GroupKey, int]]:
        """Configured groups plus groups that still have managed instances (a removed group drains),
        in ``pass_order``, and the live rows of each group that has any (one aggregate query)."""
        sizes: dict[GroupKey, int] = {}
        snapshot = self._ctx.config.snapshot()
        if snapshot is not None:
            sizes = {key: merged.size for key, merged in snapshot.merged_groups.items()}
        with self._ctx.db.read_connection() as session:
            counted = repo.live_rows_by_group(session)
        managed = {key: count for key, (_, count) in counted.items() if count}
        keys = pass_order(sizes.keys() | managed.keys(), sizes, managed)
        return keys, {key: rows for key, (rows, _) in counted.items()}

    async def enqueue_all(self, *, background: bool = False) -> None:
        """Mark every group for reconcile, the groups short of or over their size first
        (``pass_order``; the instance query runs in a worker thread).

        The periodic resync marks them ``background``: a change to one group (an UpsertGroup, an
        agent gone) is then reconciled before the rest of a 10,000-group resync, not after it. The
        first pass of a leadership is not background: every group needs it as soon as possible.
        """
        keys, rows = await asyncio.to_thread(self._groups_and_rows)
        for key in keys:
            # A group not read yet in this term is sized by the count: after a takeover a small group
            # is then read on the loop at once instead of queueing behind the big groups' reads.
            self._rows_read.setdefault(key, rows.get(key, 0))
        for start in range(0, len(keys), ENQUEUE_BATCH):
            if start:
                await asyncio.sleep(0)  # 10,000 marks in one callback held the loop for a second
            for key in keys[start : start + ENQUEUE_BATCH]:
                self.queue.add(key, background=background)
            self._ctx.metrics.set_reconcile_queue_depth(len(self.queue))

    async def run(self) -> None:
        """Process the queue and resync periodically until ``close``."""
        resync = asyncio.create_task(self._resync_loop())
        try:
            await self.queue.run(self.reconcile, workers=self._workers)
        finally:
            resync.cancel()

    async def _resync_loop(self) -> None:
        while not self.queue.closed:
            await asyncio.sleep(self._resync_interval)
            await self.enqueue_all(background=True)

    async def close(self) -> None:
        await self.queue.close()

    # --- one group --------------------------------------------------------------------------

    def _spec(self, merged: MergedGroupConfig | None) -> PlanInput:
        if merged is None:
            return PlanInput(desired=None)
        snapshot = self._ctx.config.snapshot()
        expiry = snapshot.config.shard.expiry if snapshot is not None else None
        key = (merged.tenant, merged.group)
        known = self._infra_hashes.get(key)
        if known is None or known[0] is not merged:  # a new snapshot's entry: hash it once
            known = self._infra_hashes[key] = (merged, infra_hash(merged), legacy_infra_hash(merged))
        return PlanInput(
            desired=merged.size,
            infra_hash=known[1],
            legacy_infra_hash=known[2],
            drain_timeout=merged.drain_timeout,
            eligible_age=expiry.eligible_age if expiry else None,
            forced_age=expiry.forced_age if expiry else None,
            silence_limit=self._silence_limit(),
            instance_type=merged.instance_type,
            template=merged.template,
        )

    def _silence_limit(self) -> timedelta | None:
        """Three missed health intervals: then a registered agent that went quiet is replaced."""
        snapshot = self._ctx.config.snapshot()
        if snapshot is None:
            return None
        return MISSED_REPORTS * snapshot.config.shard.health_check_interval

    def _silence_counted_from(self) -> datetime:
        """When silence starts to count in this leadership: one missed-report window after it began.

        Agents whose streams hung on the previous leader (stopped, partitioned, its VM gone) find this
        one only when their keepalive gives up (20 s + 10 s), so for one window after a takeover no
        agent can be blamed for not reporting here; after that, a blip shorter than the window never
        makes an agent look silent. (The window should not be shorter than the agents' keepalive.)
        """
        return self.leading_since + (self._silence_limit() or timedelta(0))

    def check_health_after(self, key: GroupKey) -> None:
        """Reconcile ``key`` once the silence limit has passed (an earlier schedule is kept)."""
        limit = self._silence_limit()
        if limit is not None:
            self.queue.add_after(key, limit.total_seconds() + 0.5)

    def _ondemand_age(self) -> timedelta | None:
        snapshot = self._ctx.config.snapshot()
        return snapshot.config.shard.expiry.ondemand_age if snapshot is not None else None

    async def reconcile(self, key: GroupKey) -> None:
        """Bring one group toward its wanted state (level-triggered: safe to call any time)."""
        ctx = self._ctx
        ctx.metrics.set_reconcile_queue_depth(len(self.queue))
        if not ctx.is_leader():
            return
        tenant, group = key
        snapshot = ctx.config.snapshot()
        merged = snapshot.merged(tenant, group) if snapshot is not None else None
        now = ctx.clock.now()  # the leader clock: monotonic within this leadership (``leadertime``)
        seen_since = self._silence_counted_from()
        term = self.leading_since
        read = functools.partial(
            group_members.read_group,
            ctx.db,
            tenant,
            group,
            now=now,
            seen_since=seen_since,
            term=term,
            rejoined=self._ops.rejoined,
            silence_limit=self._silence_limit(),
        )
        last = self._rows_read.get(key)
        if last is not None and max(last, merged.size if merged is not None else 0) <= INLINE_READ_ROWS:
            all_rows, members, on_demand = read()
        else:
            async with self._reads:  # 1,000s of rows: off the loop, and few at a time (the GIL is shared)
                all_rows, members, on_demand = await asyncio.to_thread(read)
        self._rows_read[key] = len(all_rows)
        by_id = {row.id: row for row in all_rows}
        spec = self._spec(merged)
        members = self._ops.brake_silent(key, members, spec.silence_limit, now, self.leading_since)
        plan = plan_group(spec, members, now)
        ondemand_age = self._ondemand_age()
        drain_timeout = merged.drain_timeout if merged is not None else timedelta(0)
        if on_demand:
            extra = plan_on_demand(on_demand, ondemand_age=ondemand_age, drain_timeout=drain_timeout, now=now)
            plan = GroupPlan(
                create=plan.create,
                delete=plan.delete + extra.delete,
                drain=plan.drain + extra.drain,
                serving=plan.serving,
            )
        started = time.perf_counter()
        self.reconciles += 1
        ok = True
        if not plan.empty:
            log.info(
                "reconcile %s/%s: %d serving, size %s -> create %d, delete %d, drain %d",
                tenant,
                group,
                plan.serving,
                spec.desired,
                plan.create,
                len(plan.delete),
                len(plan.drain),
            )
            ok = await self._execute(key, merged, plan, by_id)
        elapsed = time.perf_counter() - started
        ctx.metrics.record_reconcile("ok" if ok else "error")
        if ok:
            self._failures.pop(key, None)
        else:
            attempt = self._failures.get(key, 0)
            self._failures[key] = attempt + 1
            delay = self._backoff.delay(attempt)
            log.info("reconcile %s/%s had errors; retrying in %.1fs", tenant, group, delay)
            self.queue.add_after(key, delay)
        wakes = [next_wakeup(spec, members, now)]
        if on_demand:
            wakes.append(next_on_demand_wakeup(on_demand, ondemand_age=ondemand_age, now=now))
        wake = min((w for w in wakes if w is not None), default=None)
        if wake is not None:
            self.queue.add_after(key, max(0.0, (wake - now).total_seconds()) + 0.5)
        hold_left = self._ops.hold_left(key)
        if hold_left is not None:  # replace the held members as soon as the hold runs out
            self.queue.add_after(key, hold_left + 0.5)
        log.debug("reconcile %s/%s took %.3fs", tenant, group, elapsed)

    async def _execute(
        self,
        key: GroupKey,
        merged: MergedGroupConfig | None,
        plan: GroupPlan,
        rows: dict[str, InstanceRow],
    ) -> bool:
        tenant, group = key
        ops = self._ops
        drain_timeout = merged.drain_timeout if merged is not None else timedelta(0)

        async def delete(action: Action) -> None:
            row = rows[action.instance_id]
            if row.provider_id is None and row.id not in ops.in_flight:
                if not row.vm_unproven:  # registered: a VM runs, known by its tags only for now
                    raise AdoptionPending(
                        f"instance {row.id} ({action.reason}): its agent registered but its VM's provider id "
                        "is not known yet; it is deleted once a provider sync adopts the VM by its tags"
                    )
                await ops.retire_unlaunched(row, action.reason)
            else:
                await ops.delete(row, action.reason)

        created: list[Created | BaseException] = []
        planned_size = merged.size if merged is not None else 0

        def wanted() -> bool:
            """Still leading, and the group still wants at least the size this plan was made for."""
            current = self._ctx.config.merged(tenant, group)
            return (
                not self.queue.closed
                and self._ctx.is_leader()
                and current is not None
                and current.size >= planned_size
            )

        async def create() -> None:
            if merged is not None and plan.create:
                created.extend(await ops.create_many(merged, plan.create, wanted=wanted))

        # Replacements first: a drained instance leaves only once its successor has been asked for.
        results: list[object] = list(
            await asyncio.gather(create(), *(delete(a) for a in plan.delete), return_exceptions=True)
        )
        called_off = any(isinstance(r, CreateCancelled) for r in created)
        created = [r for r in created if not isinstance(r, CreateCancelled)]  # the group wants fewer now
        results.extend(created)
        creates_failed = (
            called_off
            or any(isinstance(r, BaseException) for r in created)
            or isinstance(results[0], BaseException)
        )
        for action in plan.drain:
            if creates_failed and action.reason in ROTATION_REASONS:
                continue  # a planned rotation waits for a successful replacement; retried with backoff
            ops.drain(rows[action.instance_id], action.reason, drain_timeout)
        if plan.drain:
            self.queue.add_after(key, drain_timeout.total_seconds() + 0.5)
        ok = True
        for result in results:
            if isinstance(result, DeregistrationPending | AdoptionPending):
                # A delete that must wait (connections still draining; the VM's id not known until a
                # provider sync adopts it): not an error, looked at again shortly.
                log.info("%s", result)
                self.queue.add_after(key, RECHECK_AFTER)
                continue
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                ok = False
                ops.report_error(tenant, group, "", str(result) or type(result).__name__)
        return ok
