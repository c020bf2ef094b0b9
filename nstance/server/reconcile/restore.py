"""Writing back instance records that vanished while this server leads (each GC cycle).

A leader's cache outlives records deleted under it (by hand, a bad lifecycle rule, a script): without
this, the next leader would find VMs no record explains, and every record update of those instances
(registration, delete) would fail meanwhile. So once per GC cycle the leader lists ``instance/`` (one
LIST) and, for every active cache row whose record is missing, writes the record again from the row -
which knows more than the VM's tags: nonce, registration, certificate, infra hash. The record's
``config`` is the group's current one with the row's template and instance type (what the instance
runs), as for an adopted VM: an adopted row has no infra hash, and the next leader judges its drift
by those two. Rows of creates still being recorded are left alone (in flight, or without a provider
id and younger than ``settle``); the write is create-only, so a record that reappeared is never
overwritten.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from nstance.core import pacing
from nstance.core.errors import AlreadyExists
from nstance.db import repo
from nstance.db.models import RECORD_FAILED
from nstance.db.rows import InstanceRow
from nstance.server.reconcile.instances import InstanceOps
from nstance.server.state import records
from nstance.server.state.context import ShardContext
from nstance.server.state.leadertime import since_term

log = logging.getLogger(__name__)

_MISSING_NONCE = "missing-nonce:"
#: Ids per query when the rows of missing records are read (SQLite caps a statement's parameters).
ID_CHUNK = 500


def record_from_row(row: InstanceRow, ctx: ShardContext) -> records.InstanceRecord:
    """The instance record the cache row describes (``restored_at`` marks it)."""
    now = ctx.clock.now()
    snapshot = ctx.config.snapshot()
    merged = snapshot.merged(row.tenant, row.group_key) if snapshot is not None else None
    return records.InstanceRecord(
        instance_id=row.id,
        tenant=row.tenant,
        group=row.group_key,
        created_at=row.created_at,
        last_updated=now,
        status=row.provider_status or "pending",
        on_demand=row.on_demand,
        subnet_id=row.subnet_id or "",
        provider_instance_id=row.provider_id or "",
        instance_type=row.instance_type or "",
        private_ipv4=row.ip4 or "",
        private_ipv6=row.ip6 or "",
        hostname=row.hostname or "",
        registration_jwt="" if row.nonce.startswith(_MISSING_NONCE) else row.nonce,
        config=records.config_as_run(
            merged, template=row.template or "", instance_type=row.instance_type or ""
        ),
        infra_config_hash=row.infra_config_hash or "",
        registered_at=row.registered_at,
        public_key_pem=row.instance_pub or "",
        cert_serial=row.cert_serial or "",
        cert_expires_at=row.cert_expires_at,
        extra={"restored_at": records.format_time(now)},
    )


def _rows_without_record(ctx: ShardContext, keys: set[str]) -> list[InstanceRow]:
    """The live rows (create not failed) whose record key is not in ``keys``, oldest first (a thread).

    Only their ids are compared first: at 100,000 instances, reading every full row took about a
    second of CPU per GC cycle, to find none missing.
    """
    with ctx.db.read_connection() as conn:
        ids = repo.recorded_instance_ids(conn)
        missing = [iid for tenant, iid in ids if records.record_key(tenant, iid) not in keys]
        rows: list[InstanceRow] = []
        for start in range(0, len(missing), ID_CHUNK):
            rows += repo.get_instances(conn, missing[start : start + ID_CHUNK])
    rows.sort(key=lambda row: (row.created_at, row.id))
    return rows


async def restore_missing_records(ctx: ShardContext, ops: InstanceOps, *, settle: timedelta) -> list[str]:
    """Write back the records of active rows that have none; the instance ids restored."""
    ctx.fence()
    keys = set(await asyncio.to_thread(ctx.store.list, records.RECORD_PREFIX))
    rows = await asyncio.to_thread(_rows_without_record, ctx, keys)
    del keys
    restored: list[str] = []
    async for row in pacing.paced(rows):
        if row.id in ops.in_flight or row.record_state == RECORD_FAILED:
            continue
        if row.provider_id is None and since_term(ctx.clock, row.created_at) < settle:
            continue
        record = record_from_row(row, ctx)
        ctx.fence()
        try:
            await asyncio.to_thread(records.write_record, ctx.store, record, create_only=True)
        except AlreadyExists:
            continue
        log.warning(
            "instance %s of %s/%s had no record: written back from the cache",
            row.id,
            row.tenant,
            row.group_key,
        )
        restored.append(row.id)
    await pacing.release(rows)
    if restored:
        ops.report_error(
            "", "", "", f"{len(restored)} instance records were missing and have been written back"
        )
    return restored
