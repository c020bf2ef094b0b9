"""Making the cache and the provider agree with the records: at leadership and periodically.

``rebuild_cache`` (on every acquisition of shard leadership) rewrites SQLite from the instance records
in object storage - the records are the durable truth, SQLite only a cache - and finishes deletes that a
previous leader began. An unreadable record is reported (log, ``WatchErrors``, a metric, ``/health``)
and keeps claiming its VM; a deleted one leaves a tombstone row, so its VM, should it reappear, is
known to be an orphan (but an on-demand tombstone that no record backs and that never had a VM here is
dropped: the operator may have retried that id on another leader). ``sync_provider`` (right after,
and then every GC cycle) lists the provider's VMs by cluster/shard tag and reconciles the three views:

* a VM whose record is active but whose row lacks the provider id (crash between create and record
  update) is **adopted**: provider id and status go into the record and the row;
* a VM that no active record explains is judged by ``claims``: kept and reported when an unreadable
  record may describe it; **adopted from its tags** (a record is rebuilt, see ``adoption``) when no
  record mentions it at all; deleted as an **orphan** only when its tags say it is ours and its record
  or row says it should not exist (its create failed or was given up, or it was deleted) - and no more
  than the brake allows per group per interval (``brake``); a VM whose create is in flight is left be;
* a provisioned row whose VM is listed as gone, or missing from the listing for longer than
  ``consistency_grace`` (clouds list new VMs late), is marked deleted, so the reconciler replaces it; a
  pending row whose create is not in flight in this process (it was cut off by a crash or a leadership
  change) is retired at once - if its VM appears later after all, it is an orphan by then and is deleted -
  unless its agent has registered: then its VM existed, a listing normally shows it (and it is adopted),
  and only one that still lacks it after ``consistency_grace`` retires the row (``gone-at-provider``: a
  leader deleted that VM but could not write the record, whose rebuild brought the row back);
  Only rows that existed, with the create state they had, when the listing began are judged by it;
* status changes (stopped, suspended, ...) are stored, and the affected groups are returned for reconcile.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from nstance.core import gcpause, pacing
from nstance.core.errors import InvalidArgument
from nstance.core.ids import GroupKey
from nstance.db import repo
from nstance.db.models import RECORD_FAILED, RECORD_PENDING, RECORD_PROVISIONED
from nstance.db.rows import InstanceRow
from nstance.objectstore.base import ObjectNotFound
from nstance.providers.base import GONE_STATUSES, InstanceStatus, ProviderInstance
from nstance.server.reconcile import adoption, brake, claims
from nstance.server.reconcile.instances import InstanceOps
from nstance.server.state import records
from nstance.server.state.context import ShardContext
from nstance.server.state.leadertime import since_term

log = logging.getLogger(__name__)

_PROVIDER_STATUSES = frozenset(s.value for s in InstanceStatus)


@dataclass
class SyncReport:
    """What one provider sync found and did (logged, and asserted by tests)."""

    adopted: list[str] = field(default_factory=list)
    adopted_from_tags: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    orphans_deleted: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    status_changed: list[str] = field(default_factory=list)
    groups: set[GroupKey] = field(default_factory=set)


def _row_values(rec: records.InstanceRecord) -> dict[str, Any]:
    status = rec.status
    record_state = RECORD_PROVISIONED if rec.provider_instance_id else RECORD_PENDING
    if status == "failed":
        record_state = RECORD_FAILED
    config = rec.config or {}
    values: dict[str, Any] = {
        "id": rec.instance_id,
        "tenant": rec.tenant,
        "group_key": rec.group,
        "kind": rec.instance_id[:3],
        "template": config.get("template"),
        "on_demand": rec.on_demand,
        "record_state": record_state,
        "idempotency_token": rec.instance_id,
        "subnet_id": rec.subnet_id or None,
        "instance_type": rec.instance_type or None,
        "provider_id": rec.provider_instance_id or None,
        "hostname": rec.hostname or None,
        "ip4": rec.private_ipv4 or None,
        "ip6": rec.private_ipv6 or None,
        "nonce": rec.registration_jwt or f"missing-nonce:{rec.instance_id}",
        "registered_at": rec.registered_at,
        "instance_pub": rec.public_key_pem or None,
        "cert_serial": rec.cert_serial or None,
        "cert_expires_at": rec.cert_expires_at,
        "infra_config_hash": rec.infra_config_hash or None,
        "created_at": rec.created_at,
        "updated_at": rec.last_updated or rec.created_at,
        "deleted_at": None,
    }
    if rec.provider_instance_id and status in _PROVIDER_STATUSES:
        values["provider_status"] = status
    return values


#: Rows per transaction when the cache is rebuilt: each batch is one executemany in a worker thread,
#: short enough that other writers (health reports, registrations) get the write lock in between.
REBUILD_BATCH = 2000
#: Columns of ``_row_values`` a record may leave unset, keeping the row's stored value.
_KEEP_IF_UNSET = ("provider_status",)


def _cache_row(rec: records.InstanceRecord) -> dict[str, Any]:
    """``_row_values`` with every column ``restore_instances`` writes (``provider_status`` None when
    the record has none, so that the stored one is kept)."""
    return {"provider_status": None, **_row_values(rec)}


def refresh_rows(bind: repo.Bind, recs: list[records.InstanceRecord]) -> None:
    """Write the cache rows of ``recs`` as the rebuild writes them: the record's word on every column
    it holds (registration and addresses among them); the provider status where the record has none
    and the ephemeral health and drain columns keep their stored values."""
    repo.restore_instances(bind, [_cache_row(rec) for rec in recs], keep_stored_if_null=_KEEP_IF_UNSET)


@dataclass
class _Rebuilt:
    """What the rebuild learned from the records (accumulated batch by batch)."""

    read: int = 0
    problems: list[records.RecordProblem] = field(default_factory=list)
    deleting: list[str] = field(default_factory=list)  # ids of records whose delete was interrupted
    seen: set[str] = field(default_factory=set)
    groups: set[GroupKey] = field(default_factory=set)


def _rebuild_batch(
    ctx: ShardContext, keys: list[str], pool: Executor | None, now: datetime, into: _Rebuilt
) -> None:
    """Read one batch of records and write it into the cache in one transaction (a worker thread).

    Only one batch of records is alive at a time, so a rebuild of 100,000 records neither holds them
    all in memory nor hands the garbage collector a heap that grows with the fleet.
    """
    found, problems = records.read_records(ctx.store, keys, pool=pool)
    rows: list[dict[str, Any]] = []
    deleted: dict[str, records.InstanceRecord] = {}
    for rec in found:
        into.seen.add(rec.instance_id)
        into.groups.add((rec.tenant, rec.group))
        if rec.status == "deleted":
            deleted[rec.instance_id] = rec
            continue
        rows.append(_cache_row(rec))
        if rec.status == "deleting":
            into.deleting.append(rec.instance_id)
    with ctx.db.write_connection() as session:
        existing = {row.id for row in repo.get_instances(session, list(deleted))} if deleted else set()
        for iid, rec in deleted.items():
            if iid not in existing:  # a tombstone: a VM of this instance that shows up is an orphan
                rows.append({**_cache_row(rec), "deleted_at": rec.last_updated})
        repo.restore_instances(session, rows, keep_stored_if_null=_KEEP_IF_UNSET)
        repo.soft_delete_many(session, sorted(existing), now=now)
    into.read += len(found)
    into.problems += problems


def _rows_to_check(ctx: ShardContext) -> tuple[set[str], set[str]]:
    """The ids of the live rows, and of the on-demand tombstones that never had a VM (one read)."""
    with ctx.db.read_connection() as session:
        return repo.live_instance_ids(session), repo.unlaunched_on_demand_tombstones(session)


def _finish_rebuild(ctx: ShardContext, dropped: list[str], deleting: list[str]) -> list[InstanceRow]:
    """Forget the rows no record explains; the rows of records being deleted (worker thread)."""
    for start in range(0, len(dropped), REBUILD_BATCH):
        with ctx.db.write_connection() as session:
            for iid in dropped[start : start + REBUILD_BATCH]:
                repo.forget_instance(session, iid)
    unfinished: list[InstanceRow] = []
    for start in range(0, len(deleting), REBUILD_BATCH):
        with ctx.db.read_connection() as session:
            unfinished += repo.get_instances(session, deleting[start : start + REBUILD_BATCH])
    return unfinished


async def rebuild_cache(ctx: ShardContext, ops: InstanceOps) -> set[GroupKey]:
    """Rewrite the SQLite instance rows from the records; finish interrupted deletes.

    The records are read and written in batches of ``REBUILD_BATCH``, each in a worker thread and
    its own transaction: a shard of 100,000 records must not stall the event loop (lease renewals
    and RPCs run there) nor hold the write lock for long. A failed rebuild is simply run again.
    """
    # Record writes an earlier term still owed: this rebuild reads every record as it now is.
    ops.owed.forget()
    ops.retirer.held.clear()  # so are the held deletes it marked: each is marked again when held
    keys = await asyncio.to_thread(records.list_record_keys, ctx.store)
    now = ctx.clock.now()
    rebuilt = _Rebuilt()
    with records.reader_pool(ctx.store, len(keys)) as pool:
        for start in range(0, len(keys), REBUILD_BATCH):
            batch = keys[start : start + REBUILD_BATCH]
            await asyncio.to_thread(_rebuild_batch, ctx, batch, pool, now, rebuilt)
    report_unreadable(ctx, ops, rebuilt.problems)
    live, unlaunched = await asyncio.to_thread(_rows_to_check, ctx)
    in_flight = set(ops.in_flight)  # read on the loop, where it changes
    claimed = {problem.instance_id for problem in rebuilt.problems if problem.instance_id}
    dropped = sorted(live - rebuilt.seen - in_flight - claimed)
    for iid in dropped:
        # A vanished record is missing state, not a deletion: no tombstone, so a VM of this
        # instance is adopted from its tags rather than deleted as an orphan.
        log.warning("instance %s has no record in object storage; forgetting its cache row", iid)
    # Likewise a tombstone that no record backs, of an on-demand instance this server never knew a VM
    # of (its create failed, before or at the provider, in an earlier leadership here). The operator
    # retries an on-demand id, perhaps on another leader: a VM with this id now is that retry's, and
    # only a record could say it should not exist (sim seed 971000969: kept, it deleted that VM).
    for iid in sorted(unlaunched - rebuilt.seen - claimed):
        log.info("on-demand instance %s: no record backs its tombstone; forgetting it", iid)
        dropped.append(iid)
    unfinished = await asyncio.to_thread(_finish_rebuild, ctx, dropped, rebuilt.deleting)
    for row in unfinished:
        log.info("finishing the interrupted delete of %s", row.id)
        ops.retirer.held.add(row.id)  # its record says "deleting" already: a hold writes nothing
        await ops.delete_or_hold(row, "delete-resumed")
    log.info("cache rebuilt from %d instance records (%d problems)", rebuilt.read, len(rebuilt.problems))
    return rebuilt.groups


async def sync_provider(
    ctx: ShardContext, ops: InstanceOps, *, consistency_grace: timedelta = timedelta(seconds=60)
) -> SyncReport:
    """List the provider's VMs for this cluster/shard and reconcile them with the cache (see above).

    The listing and the rows are alive only in ``_sync_provider``'s frame, which is gone when it
    returns: the collector is held off until then (``gcpause``), so it never walks them.
    """
    with gcpause.paused():
        return await _sync_provider(ctx, ops, consistency_grace)


def _index_listing(vms: list[ProviderInstance]) -> dict[str, ProviderInstance]:
    """The listed VMs by Nstance instance id (those without one are not ours to judge)."""
    return {vm.instance_id: vm for vm in vms if vm.instance_id}


async def _sync_provider(ctx: ShardContext, ops: InstanceOps, consistency_grace: timedelta) -> SyncReport:
    ctx.fence()
    ident = ctx.identity
    # What existed before the listing began: only those rows can be judged by it. A create that starts
    # or finishes while the listing runs is not in it, and must not be taken for gone or interrupted.
    # Every map of 100,000 entries below is built in a worker thread, not on the event loop.
    in_flight_before = set(ops.in_flight)
    before = await ops.read_provider_ids()  # instance id -> provider id, of every live row
    in_flight_before |= ops.in_flight  # a create that began during the read is not judged either
    vms = await ctx.provider.list_instances(ident.cluster_id, ident.shard)
    by_instance = await asyncio.to_thread(_index_listing, vms)
    del vms
    report = SyncReport()
    now = ctx.clock.now()
    rows = await ops.read_sync_rows()
    snapshot = ctx.config.snapshot()
    limits = ops.brake_limits()
    held: dict[GroupKey, int] = {}

    async for iid, vm in pacing.paced(by_instance.items()):  # 100,000 VMs: not in one piece
        if vm.status in GONE_STATUSES:
            continue
        cached = rows.get(iid)
        if cached is None or cached.deleted or cached.record_state == RECORD_FAILED:
            if iid in ops.in_flight:
                continue
            vm = adoption.with_tenant(vm, snapshot)
            decision = claims.decide(
                vm,
                cluster_id=ident.cluster_id,
                shard=ident.shard,
                disclaimed=cached is not None,
                unreadable=ops.unreadable,
            )
            key = (cached.tenant, cached.group_key) if cached is not None else (vm.tenant, vm.group)
            if decision.verdict is claims.Verdict.ORPHAN:
                if not ops.budget.take(brake.ORPHANS, key, iid, ctx.clock.monotonic(), limits):
                    held[key] = held.get(key, 0) + 1
                    continue
                log.warning("VM %s (%s) is an orphan (%s): deleting it", vm.provider_id, iid, decision.why)
                ctx.fence()
                await ctx.provider.delete_instance(iid, vm.provider_id)
                report.orphans_deleted.append(iid)
                if cached is not None:
                    with ctx.db.write_connection() as session:
                        repo.soft_delete(session, iid, now=now)
                    report.groups.add(key)
            elif decision.verdict is claims.Verdict.ADOPT:
                record = adoption.adopted_record(vm, snapshot, ctx)
                if await adoption.write_adopted(ctx, record):
                    log.warning("VM %s (%s) has no record: %s", vm.provider_id, iid, decision.why)
                    with ctx.db.session() as session:
                        repo.restore_instance(session, **_row_values(record))
                    report.adopted_from_tags.append(iid)
                    report.groups.add(key)
            elif decision.verdict is not claims.Verdict.FOREIGN:
                report.kept.append(iid)
                ops.set_hold(
                    f"unexplained-vms {iid}",
                    f"VM {vm.provider_id} ({iid}) is kept: {decision.why}",
                    tenant=vm.tenant,
                    group=vm.group,
                )
            continue
        if cached.provider_id != vm.provider_id:
            log.info("adopting VM %s as instance %s", vm.provider_id, iid)
            await asyncio.to_thread(
                records.update_record,
                ctx.store,
                cached.tenant,
                iid,
                provider_instance_id=vm.provider_id,
                status=vm.status.value,
                last_updated=now,
            )
            ops.adopt(iid, vm)
            report.adopted.append(iid)
            report.groups.add((cached.tenant, cached.group_key))
        elif cached.provider_status != vm.status.value:
            with ctx.db.write_connection() as session:
                repo.set_provider_status(session, iid, vm.status.value, now=now)
            report.status_changed.append(iid)
            report.groups.add((cached.tenant, cached.group_key))
    await pacing.release(rows)  # 100,000 rows freed at once held the loop for 150 ms
    kept = set(report.kept)
    for topic in [t for t in ops.holds.topics("unexplained-vms ") if t.split(" ", 1)[1] not in kept]:
        ops.set_hold(topic, None)
    for key in {*held, *ops.budget.keys(brake.ORPHANS)}:
        count = held.get(key)
        reason = (
            f"{count} orphan VMs wait: at most {limits.max_deletions} orphan deletions per {limits.interval} "
            "per group"
            if count
            else None
        )
        ops.set_hold(f"{brake.ORPHANS} {key[0]}/{key[1]}", reason, tenant=key[0], group=key[1])

    async for iid, prev_provider_id in pacing.paced(before.items()):
        if iid in by_instance and by_instance[iid].status not in GONE_STATUSES:
            continue
        if iid in in_flight_before or iid in ops.in_flight:
            continue
        if iid in ops.retirer.deleting:
            continue  # our own delete is running: its VM is gone because of it, and it finishes the row
        with ctx.db.read_connection() as session:
            row = repo.get_instance(session, iid)  # fresh: awaits above may have changed it
        if row is None or row.deleted_at is not None:
            continue
        if prev_provider_id is None and row.provider_id is not None:
            continue  # its create finished after the listing began: the listing cannot show it
        listed_gone = iid in by_instance  # listed with a gone status: no grace, it is gone
        young = since_term(ctx.clock, row.created_at) < consistency_grace
        if row.provider_id is not None and not listed_gone and young:
            continue
        if row.provider_id is None and not row.vm_unproven and not listed_gone and young:
            continue  # its agent registered, so its VM existed: a listing this soon may not show it yet
        report.gone.append(iid)
        report.groups.add((row.tenant, row.group_key))
        if row.provider_id is None:
            # Its create was cut off (no create of this process is in flight for it), or its registered
            # VM has been missing from the listings for the whole grace. Should the VM show up after
            # all (a cloud that lists new VMs late), it is an orphan and gets deleted.
            await ops.retire_unlaunched(row, "create-interrupted" if row.vm_unproven else "gone-at-provider")
        else:
            log.warning("VM %s of instance %s is gone at the provider", row.provider_id, iid)
            await ops.delete_or_hold(row, "gone-at-provider")
    if report.adopted or report.orphans_deleted or report.gone or report.adopted_from_tags:
        log.info(
            "provider sync: %d adopted, %d adopted from tags, %d orphans deleted, %d gone, %d status changes",
            len(report.adopted),
            len(report.adopted_from_tags),
            len(report.orphans_deleted),
            len(report.gone),
            len(report.status_changed),
        )
    await pacing.release(by_instance)
    await pacing.release(before)
    return report


def report_unreadable(ctx: ShardContext, ops: InstanceOps, problems: list[records.RecordProblem]) -> None:
    """Log and report each unreadable record (it keeps claiming its VM); hold while any remain."""
    ops.unreadable = list(problems)
    ctx.metrics.set_unreadable_records(len(problems))
    for problem in problems:
        log.error("unreadable instance record (its VM is kept, not deleted): %s", problem)
        ops.report_error(problem.tenant, "", problem.instance_id, f"unreadable instance record: {problem}")
    ops.set_hold(
        "unreadable-records",
        f"{len(problems)} instance records cannot be read; the VMs they may describe are kept until each "
        "is repaired or removed"
        if problems
        else None,
    )


async def recheck_unreadable(ctx: ShardContext, ops: InstanceOps) -> set[GroupKey]:
    """Read the unreadable records again (each GC cycle); those repaired go back into the cache.

    A repaired record of an active instance restores its cache row (its VM is managed again); a
    removed one stops claiming anything (its VM, if any, is adopted from its tags by the next sync).
    Returns the groups whose instances came back.
    """
    if not ops.unreadable:
        return set()
    still: list[records.RecordProblem] = []
    cleared: list[str] = []
    groups: set[GroupKey] = set()
    for problem in ops.unreadable:
        try:
            data, _ = await asyncio.to_thread(ctx.store.get, problem.key)
        except ObjectNotFound:
            cleared.append(problem.key)
            continue
        try:
            rec = records.decode_record(data, problem.key)
        except InvalidArgument:
            still.append(problem)
            continue
        if (rec.tenant, rec.instance_id) != (problem.tenant, problem.instance_id):
            still.append(problem)
            continue
        if rec.status not in ("deleted", "failed"):
            # A live row was left as it was when the record could not be read: it may be behind the
            # record (another leader registered the agent meanwhile), so it takes the record's word too.
            with ctx.db.session() as session:
                existing = repo.get_instance(session, rec.instance_id)
                refresh_rows(session, [rec])
                groups.add((rec.tenant, rec.group))
                if existing is None or existing.deleted_at is not None:
                    ops.rejoined[rec.instance_id] = ctx.clock.now()
        log.info("instance record %s is readable again", problem.key)
        cleared.append(problem.key)
    if cleared:
        ops.unreadable = still
        ctx.metrics.set_unreadable_records(len(still))
        if not still:
            ops.set_hold("unreadable-records", None)
    return groups
