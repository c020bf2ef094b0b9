"""Reading the ``instances`` table: lookups, listings and counts, all plain SQL returning ``InstanceRow``.

The reconciler's, GC's and provider sync's listings and every per-request instance lookup run here,
on a ``Bind`` (a Session or a plain read connection); a deleted row is returned only where a function
says so. Listings are oldest first (``created_at``, then ``id``), which the scale-down victim order
and the tests rely on.

Must not write: every change to an instance row lives in ``instance_lifecycle``, ``instance_restore``
or ``agent_registration``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from nstance.db.models import INACTIVE_PROVIDER_STATUSES, RECORD_FAILED
from nstance.db.repo._sql import Bind, plain
from nstance.db.rows import INSTANCES, InstanceRow, SyncRow, sqlite_time


def _instances(bind: Bind, where: str, params: tuple[Any, ...] = ()) -> list[InstanceRow]:
    """Instance rows matching ``where`` (plain SQL, with its ORDER BY), as ``InstanceRow``."""
    cursor = plain(bind).execute(f"SELECT {INSTANCES.columns} FROM instances WHERE {where}", params)
    return [INSTANCES.row(values) for values in cursor.fetchall()]


def get_instance(bind: Bind, instance_id: str) -> InstanceRow | None:
    """The instance row with this id (deleted rows included), or None."""
    found = _instances(bind, "id = ?", (instance_id,))
    return found[0] if found else None


def get_instance_by_nonce(bind: Bind, nonce: str) -> InstanceRow | None:
    """The instance row created with this registration JWT, or None."""
    found = _instances(bind, "nonce = ?", (nonce,))  # unique
    return found[0] if found else None


_ACTIVE = "deleted_at IS NULL AND (provider_status IS NULL OR provider_status NOT IN ({}))".format(
    ", ".join(f"'{status}'" for status in INACTIVE_PROVIDER_STATUSES)
)
_OLDEST_FIRST = " ORDER BY created_at, id"


def list_active_instances(
    bind: Bind,
    *,
    tenant: str | None = None,
    group_key: str | None = None,
    managed_only: bool = False,
    after: tuple[datetime, str] | None = None,
    limit: int | None = None,
) -> list[InstanceRow]:
    """Instances not deleted and not being deleted by the provider, oldest first.

    ``managed_only`` leaves out on-demand instances (the reconciler counts only managed ones).
    ``after`` (``created_at``, ``id`` of the last row of a previous page) and ``limit`` read one page.
    """
    where = _ACTIVE
    params: tuple[Any, ...] = ()
    if tenant is not None:
        where += " AND tenant = ?"
        params += (tenant,)
    if group_key is not None:
        where += " AND group_key = ?"
        params += (group_key,)
    if managed_only:
        where += " AND on_demand = 0"
    if after is not None:
        # A row value: SQLite seeks to it in the (tenant[, group_key], created_at, id) index, so a page
        # costs its own rows, not a scan and sort of everything before it.
        where += " AND (created_at, id) > (?, ?)"
        params += (sqlite_time(after[0]), after[1])
    where += _OLDEST_FIRST
    if limit is not None:
        where += " LIMIT ?"
        params += (limit,)
    return _instances(bind, where, params)


def awaiting_drain_ack(bind: Bind, *, tenant: str) -> list[InstanceRow]:
    """A tenant's active instances that are draining and whose drain is not acknowledged yet, oldest
    first (what WatchInstances announces to a new watcher): the filter runs in SQLite, so a shard of
    100,000 instances builds rows only for the few that drain."""
    where = f"{_ACTIVE} AND tenant = ? AND drain_started_at IS NOT NULL AND drain_acked_at IS NULL"
    return _instances(bind, where + _OLDEST_FIRST, (tenant,))


def list_instances(bind: Bind, *, include_deleted: bool = False) -> list[InstanceRow]:
    """Every instance row (deleted ones only when asked), oldest first."""
    where = "1" if include_deleted else "deleted_at IS NULL"
    return _instances(bind, where + _OLDEST_FIRST)


def list_unregistered_instances(bind: Bind) -> list[InstanceRow]:
    """Live rows whose agent has not registered, oldest first: the only ones a GC timeout can end."""
    return _instances(bind, "deleted_at IS NULL AND registered_at IS NULL" + _OLDEST_FIRST)


def recorded_instance_ids(bind: Bind) -> list[tuple[str, str]]:
    """(tenant, id) of every live row whose create was not marked failed: the rows that need a record."""
    sql = "SELECT tenant, id FROM instances WHERE deleted_at IS NULL AND record_state != ?"
    return plain(bind).execute(sql, (RECORD_FAILED,)).fetchall()


def get_instances(bind: Bind, instance_ids: list[str]) -> list[InstanceRow]:
    """The rows with these ids (unknown ids are left out), oldest first."""
    if not instance_ids:
        return []
    unique = list(dict.fromkeys(instance_ids))
    marks = ", ".join("?" for _ in unique)
    return _instances(bind, f"id IN ({marks}){_OLDEST_FIRST}", tuple(unique))


def live_instance_ids(bind: Bind) -> set[str]:
    """The ids of every instance row not soft-deleted (one column, no row objects)."""
    return {iid for (iid,) in plain(bind).execute("SELECT id FROM instances WHERE deleted_at IS NULL")}


def unlaunched_on_demand_tombstones(bind: Bind) -> set[str]:
    """The ids of soft-deleted on-demand rows that never had a provider id (no VM was known for them)."""
    sql = "SELECT id FROM instances WHERE deleted_at IS NOT NULL AND on_demand AND provider_id IS NULL"
    return {iid for (iid,) in plain(bind).execute(sql)}


def live_provider_ids(bind: Bind) -> dict[str, str | None]:
    """Instance id -> provider id (None before its create returned) of every row not soft-deleted.

    Two columns, no row objects: the provider sync keeps this for 100,000 instances while it lists.
    """
    sql = "SELECT id, provider_id FROM instances WHERE deleted_at IS NULL"
    return dict(plain(bind).execute(sql).fetchall())


def sync_rows(bind: Bind) -> dict[str, SyncRow]:
    """Instance id -> the columns the provider sync compares, of every row, soft-deleted ones included."""
    sql = (
        "SELECT id, tenant, group_key, provider_id, provider_status, deleted_at IS NOT NULL, record_state "
        "FROM instances"
    )
    return {
        iid: SyncRow(tenant, group, provider_id, status, bool(deleted), state)
        for iid, tenant, group, provider_id, status, deleted, state in plain(bind).execute(sql).fetchall()
    }


def serving_provider_ids(
    bind: Bind, *, tenant: str, group_key: str | None = None
) -> dict[str, list[str | None]]:
    """Group -> the provider ids (None before the create returned) of its serving managed instances.

    Serving: active, not on demand, not draining, its record not failed (what GroupStatus counts).
    Two columns, no row objects: ListGroups asks this of every instance of a tenant.
    """
    sql = (
        f"SELECT group_key, provider_id FROM instances WHERE {_ACTIVE} AND tenant = ? AND on_demand = 0 "
        f"AND drain_started_at IS NULL AND record_state != '{RECORD_FAILED}'"
    )
    params: tuple[str, ...] = (tenant,)
    if group_key is not None:
        sql += " AND group_key = ?"
        params += (group_key,)
    found: dict[str, list[str | None]] = {}
    for group, provider_id in plain(bind).execute(sql, params).fetchall():
        found.setdefault(group, []).append(provider_id)
    return found


def count_instances(bind: Bind) -> dict[tuple[str, str, str], int]:
    """Live instances counted by (tenant, group, state) with one aggregate query (for metrics)."""
    sql = (
        "SELECT tenant, group_key, CASE WHEN drain_started_at IS NOT NULL THEN 'draining' "
        f"WHEN record_state = '{RECORD_FAILED}' THEN 'failed' ELSE coalesce(provider_status, 'pending') END "
        "AS state, count(*) FROM instances WHERE deleted_at IS NULL GROUP BY tenant, group_key, state"
    )
    return {(t, g, str(st)): int(n) for t, g, st, n in plain(bind).execute(sql).fetchall()}


def live_rows_by_group(bind: Bind) -> dict[tuple[str, str], tuple[int, int]]:
    """(tenant, group) of every group with a live instance: (its live rows, the managed ones among them)."""
    sql = (
        "SELECT tenant, group_key, count(*), sum(on_demand = 0) FROM instances WHERE deleted_at IS NULL "
        "GROUP BY tenant, group_key"
    )
    return {(t, g): (int(n), int(managed)) for t, g, n, managed in plain(bind).execute(sql).fetchall()}
