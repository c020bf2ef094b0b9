"""Making the cache and the provider agree with the records: at leadership and periodically.

``rebuild_cache`` (on every acquisition of shard leadership) rewrites SQLite from the instance records
in object storage - the records are the durable truth, SQLite only a cache - and finishes deletes that a
previous leader began. ``sync_provider`` (right after, and then every GC cycle) lists the provider's VMs
by cluster/shard tag and reconciles the three views:

* a VM whose record is active but whose row lacks the provider id (crash between create and record
  update) is **adopted**: provider id and status go into the record and the row;
* a VM that no active record explains (created out of band, or by a create that was given up) is an
  **orphan** and is deleted, unless its create is still in flight;
* a provisioned row whose VM is listed as gone, or missing from the listing for longer than
  ``consistency_grace`` (clouds list new VMs late), is marked deleted, so the reconciler replaces it; a
  pending row whose create is not in flight in this process (it was cut off by a crash or a leadership
  change) is retired at once - if its VM appears later after all, it is an orphan by then and is deleted;
* status changes (stopped, suspended, ...) are stored, and the affected groups are returned for reconcile.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from nstance.db import repo
from nstance.db.models import RECORD_FAILED, RECORD_PENDING, RECORD_PROVISIONED, Instance
from nstance.providers.base import GONE_STATUSES, InstanceStatus, ProviderInstance
from nstance.server import records
from nstance.server.context import ShardContext
from nstance.server.instances import InstanceOps
from nstance.server.leadertime import since_term

log = logging.getLogger(__name__)

GroupKey = tuple[str, str]
_PROVIDER_STATUSES = frozenset(s.value for s in InstanceStatus)


@dataclass
class SyncReport:
    """What one provider sync found and did (logged, and asserted by tests)."""

    adopted: list[str] = field(default_factory=list)
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
#: Instances compared between yields to the event loop while the provider's listing is reconciled.
YIELD_EVERY = 1000


@dataclass
class _Rebuilt:
    """What the rebuild learned from the records (accumulated batch by batch)."""

    records: int = 0
    problems: int = 0
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
    for problem in problems:
        log.warning("instance record skipped: %s", problem)
    rows: list[dict[str, Any]] = []
    deleted: list[str] = []
    for rec in found:
        into.seen.add(rec.instance_id)
        into.groups.add((rec.tenant, rec.group))
        if rec.status == "deleted":
            deleted.append(rec.instance_id)
            continue
        values = _row_values(rec)
        values.setdefault("provider_status", None)
        rows.append(values)
        if rec.status == "deleting":
            into.deleting.append(rec.instance_id)
    with ctx.db.session() as session:
        repo.restore_instances(session, rows, keep_stored_if_null=_KEEP_IF_UNSET)
        repo.soft_delete_many(session, deleted, now=now)
    into.records += len(found)
    into.problems += len(problems)


def _live_ids(ctx: ShardContext) -> set[str]:
    with ctx.db.read_session() as session:
        return repo.live_instance_ids(session)


def _finish_rebuild(
    ctx: ShardContext, dropped: list[str], deleting: list[str], now: datetime
) -> list[Instance]:
    """Soft-delete the rows no record explains; the rows of records being deleted (worker thread)."""
    for start in range(0, len(dropped), REBUILD_BATCH):
        with ctx.db.session() as session:
            repo.soft_delete_many(session, dropped[start : start + REBUILD_BATCH], now=now)
    unfinished: list[Instance] = []
    for start in range(0, len(deleting), REBUILD_BATCH):
        with ctx.db.read_session() as session:
            unfinished += repo.get_instances(session, deleting[start : start + REBUILD_BATCH])
    return unfinished


async def rebuild_cache(ctx: ShardContext, ops: InstanceOps) -> set[GroupKey]:
    """Rewrite the SQLite instance rows from the records; finish interrupted deletes.

    The records are read and written in batches of ``REBUILD_BATCH``, each in a worker thread and
    its own transaction: a shard of 100,000 records must not stall the event loop (lease renewals
    and RPCs run there) nor hold the write lock for long. A failed rebuild is simply run again.
    """
    keys = await asyncio.to_thread(records.list_record_keys, ctx.store)
    now = ctx.clock.now()
    rebuilt = _Rebuilt()
    with records.reader_pool(len(keys)) as pool:
        for start in range(0, len(keys), REBUILD_BATCH):
            batch = keys[start : start + REBUILD_BATCH]
            await asyncio.to_thread(_rebuild_batch, ctx, batch, pool, now, rebuilt)
    live = await asyncio.to_thread(_live_ids, ctx)
    in_flight = set(ops.in_flight)  # read on the loop, where it changes
    dropped = sorted(live - rebuilt.seen - in_flight)
    for iid in dropped:
        log.warning("instance %s has no record in object storage; dropping it from the cache", iid)
    unfinished = await asyncio.to_thread(_finish_rebuild, ctx, dropped, rebuilt.deleting, now)
    for row in unfinished:
        log.info("finishing the interrupted delete of %s", row.id)
        await ops.delete_or_hold(row, "delete-resumed")
    log.info("cache rebuilt from %d instance records (%d problems)", rebuilt.records, rebuilt.problems)
    return rebuilt.groups


def _live_rows(ctx: ShardContext) -> dict[str, Instance]:
    with ctx.db.read_session() as session:
        return {row.id: row for row in repo.list_instances(session)}


async def sync_provider(
    ctx: ShardContext, ops: InstanceOps, *, consistency_grace: timedelta = timedelta(seconds=60)
) -> SyncReport:
    """List the provider's VMs for this cluster/shard and reconcile them with the cache (see above)."""
    ctx.fence()
    ident = ctx.identity
    vms = await ctx.provider.list_instances(ident.cluster_id, ident.shard)
    by_instance: dict[str, ProviderInstance] = {vm.instance_id: vm for vm in vms if vm.instance_id}
    report = SyncReport()
    now = ctx.clock.now()
    rows = await asyncio.to_thread(_live_rows, ctx)

    for n, (iid, vm) in enumerate(by_instance.items()):
        if n % YIELD_EVERY == YIELD_EVERY - 1:
            await asyncio.sleep(0)  # a listing of 100,000 VMs must not hold the loop in one piece
        if vm.status in GONE_STATUSES:
            continue
        row = rows.get(iid)
        if row is None or row.record_state == RECORD_FAILED:
            if iid in ops.in_flight:
                continue
            log.warning("VM %s (%s) is not explained by any active record: deleting it", vm.provider_id, iid)
            ctx.fence()
            await ctx.provider.delete_instance(iid, vm.provider_id)
            report.orphans_deleted.append(iid)
            if row is not None:
                with ctx.db.session() as session:
                    repo.soft_delete(session, iid, now=now)
                report.groups.add((row.tenant, row.group_key))
            continue
        if row.provider_id != vm.provider_id:
            log.info("adopting VM %s as instance %s", vm.provider_id, iid)
            await asyncio.to_thread(
                records.update_record,
                ctx.store,
                row.tenant,
                iid,
                provider_instance_id=vm.provider_id,
                status=vm.status.value,
                last_updated=now,
            )
            ops.adopt(iid, vm)
            report.adopted.append(iid)
            report.groups.add((row.tenant, row.group_key))
        elif row.provider_status != vm.status.value:
            with ctx.db.session() as session:
                repo.set_provider_status(session, iid, vm.status.value, now=now)
            report.status_changed.append(iid)
            report.groups.add((row.tenant, row.group_key))

    for n, (iid, row) in enumerate(rows.items()):
        if n % YIELD_EVERY == YIELD_EVERY - 1:
            await asyncio.sleep(0)
        if iid in by_instance and by_instance[iid].status not in GONE_STATUSES:
            continue
        if iid in ops.in_flight:
            continue
        listed_gone = iid in by_instance  # listed with a gone status: no grace, it is gone
        young = since_term(ctx.clock, row.created_at) < consistency_grace
        if row.provider_id is not None and not listed_gone and young:
            continue
        report.gone.append(iid)
        report.groups.add((row.tenant, row.group_key))
        if row.provider_id is None:
            # Its create was cut off (no create of this process is in flight for it). Should the VM
            # show up after all (a cloud that lists new VMs late), it is an orphan and gets deleted.
            await ops.retire_unlaunched(row, "create-interrupted")
        else:
            log.warning("VM %s of instance %s is gone at the provider", row.provider_id, iid)
            await ops.delete_or_hold(row, "gone-at-provider")
    if report.adopted or report.orphans_deleted or report.gone:
        log.info(
            "provider sync: %d adopted, %d orphans deleted, %d gone, %d status changes",
            len(report.adopted),
            len(report.orphans_deleted),
            len(report.gone),
            len(report.status_changed),
        )
    return report
