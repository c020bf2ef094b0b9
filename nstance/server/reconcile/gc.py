"""Garbage collection on the shard leader, one cycle every ``garbage_collection.interval``.

A cycle, in order: delete instances that never registered within ``registration_timeout`` (their
nonce has expired, so they never can); retire pre-inserted rows whose provider create never completed;
write the ``deleted`` or ``failed`` status owed to records whose write failed when it was decided
(``owedstatus``); re-list the provider (``recovery.sync_provider``) so VMs stopped, terminated or
created out of band are noticed without a leadership change (after writing back records that vanished
under this leader: ``restore``; and reading unreadable ones again); purge deleted instances' rows and
records once they are older than ``deleted_record_retention``. It returns the groups it touched so the
reconciler can backfill. Ages that decide a deletion are counted on the leader's clock from the start
of this leadership at the earliest (``leadertime``), so a wall-clock step never makes a booting VM look
abandoned.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from nstance.core import gcpause, pacing
from nstance.core.ids import GroupKey
from nstance.core.plan import Reason
from nstance.db import repo
from nstance.db.models import RECORD_PENDING
from nstance.server.reconcile.instances import InstanceOps
from nstance.server.reconcile.recovery import recheck_unreadable, sync_provider
from nstance.server.reconcile.restore import restore_missing_records
from nstance.server.state import records
from nstance.server.state.context import ShardContext
from nstance.server.state.leadertime import since_term

log = logging.getLogger(__name__)


@dataclass
class GcReport:
    """What one cycle did."""

    dangling: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    purged: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)  # records given the status they were owed
    groups: set[GroupKey] = field(default_factory=set)


async def gc_cycle(ctx: ShardContext, ops: InstanceOps) -> GcReport:
    """Run one garbage-collection cycle (leader only; raises Unavailable when leadership is lost).

    It reads every row more than once: the interpreter's collector waits until the cycle's frames
    are gone (``gcpause``), and every loop over the rows gives the event loop turns (``pacing``).
    """
    with gcpause.paused():
        return await _gc_cycle(ctx, ops)


async def _gc_cycle(ctx: ShardContext, ops: InstanceOps) -> GcReport:
    ctx.fence()
    snapshot = ctx.config.snapshot()
    if snapshot is None:
        return GcReport()
    gc_cfg = snapshot.config.shard.garbage_collection
    stale_after = 2 * snapshot.config.shard.request_timeout
    now = ctx.clock.now()
    report = GcReport()
    rows = await ops.read_unregistered_rows()  # both timeouts below are for agents not registered
    async for row in pacing.paced(rows):
        if row.id in ops.in_flight:
            continue
        age = since_term(ctx.clock, row.created_at)  # monotonic within this leadership
        if row.vm_unproven and row.record_state == RECORD_PENDING and age > stale_after:
            await ops.retire_unlaunched(row, Reason.STALE_PRE_INSERT)
            report.stale.append(row.id)
            report.groups.add((row.tenant, row.group_key))
        elif (
            row.provider_id is not None
            and row.registered_at is None
            and row.health_at is None  # an adopted instance's agent reports without registering again
            and row.drain_started_at is None
            and age > gc_cfg.registration_timeout
        ):
            log.warning(
                "instance %s never registered within %s: deleting it", row.id, gc_cfg.registration_timeout
            )
            await ops.delete_or_hold(row, Reason.REGISTRATION_TIMEOUT)
            report.dangling.append(row.id)
            report.groups.add((row.tenant, row.group_key))

    await pacing.release(rows)

    report.rewritten = await ops.owed.retry()
    report.restored = await restore_missing_records(ctx, ops, settle=stale_after)
    report.groups |= await recheck_unreadable(ctx, ops)
    synced = await sync_provider(ctx, ops)
    report.groups |= synced.groups

    with ctx.db.write_connection() as session:
        purged = repo.purge_deleted_before(session, now - gc_cfg.deleted_record_retention)
    for item in purged:
        ctx.fence()
        await asyncio.to_thread(records.delete_record, ctx.store, item.tenant, item.instance_id)
        report.purged.append(item.instance_id)
    if report.dangling or report.stale or report.purged:
        log.info(
            "gc: %d dangling deleted, %d stale pre-inserts retired, %d deleted records purged",
            len(report.dangling),
            len(report.stale),
            len(report.purged),
        )
    return report
