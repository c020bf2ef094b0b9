"""Writing an instance row through its life: create intent, provider view, health, drain, deletion.

Owns the ``instances`` columns the server changes as a VM is created (the pending row written before
the provider is asked, alone or as a batch), provisioned (provider details and status), reports
health, is drained (start and acknowledgement) and is deleted (soft delete, the outright forget of a
row whose record is gone, and the purge of old tombstones). Each write is one statement whose
changed-row count is returned where a caller decides on it.

Must not read rows for callers (``instances`` does), touch the registration columns (``nonce`` claim,
identity key and certificate: ``agent_registration``) or rebuild rows from object storage
(``instance_restore``).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from nstance.core.errors import AlreadyExists
from nstance.db.models import RECORD_FAILED, RECORD_PENDING, RECORD_PROVISIONED, Instance
from nstance.db.repo._sql import Bind, changed, plain, rowcount
from nstance.db.rows import sqlite_time


def insert_instance(
    session: Session,
    *,
    instance_id: str,
    tenant: str,
    group_key: str,
    kind: str,
    nonce: str,
    now: datetime,
    template: str | None = None,
    on_demand: bool = False,
    subnet_id: str | None = None,
    instance_type: str | None = None,
    infra_config_hash: str | None = None,
    idempotency_token: str | None = None,
    issued_at: datetime | None = None,
) -> Instance:
    """Record an instance in state ``pending`` before the provider is asked to create it.

    Raises AlreadyExists when the id, nonce or idempotency token is already taken; the caller's
    transaction stays usable (the insert runs in a savepoint).
    """
    row = Instance(
        id=instance_id,
        tenant=tenant,
        group_key=group_key,
        kind=kind,
        template=template,
        on_demand=on_demand,
        record_state=RECORD_PENDING,
        idempotency_token=idempotency_token,
        subnet_id=subnet_id,
        instance_type=instance_type,
        infra_config_hash=infra_config_hash,
        nonce=nonce,
        issued_at=issued_at,
        created_at=now,
        updated_at=now,
    )
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError as exc:
        raise AlreadyExists(
            f"instance {instance_id!r}: the id, nonce or idempotency token is already recorded"
        ) from exc
    return row


#: The columns ``insert_instances`` writes, in its parameters' order.
_INSERT_COLUMNS = (
    "id, tenant, group_key, kind, template, nonce, on_demand, subnet_id, instance_type, "
    "infra_config_hash, idempotency_token, issued_at, record_state, created_at, updated_at"
)


def insert_instances(bind: Bind, rows: list[dict[str, Any]], *, now: datetime) -> None:
    """Record many new instances (state ``pending``) in one plain-SQL executemany - the create path's intent.

    Each dict holds ``insert_instance``'s keyword arguments (without ``now``). Raises AlreadyExists if
    any id, nonce or idempotency token is taken; run it in its own transaction
    (``Database.write_connection``), which then inserts none of them. Plain SQL: through the ORM
    session this one statement cost several milliseconds on the way to each create.
    """
    if not rows:
        return
    stamp = sqlite_time(now)
    params = [
        (
            row["instance_id"],
            row["tenant"],
            row["group_key"],
            row["kind"],
            row.get("template"),
            row["nonce"],
            bool(row.get("on_demand", False)),
            row.get("subnet_id"),
            row.get("instance_type"),
            row.get("infra_config_hash"),
            row.get("idempotency_token"),
            sqlite_time(row.get("issued_at")),
            RECORD_PENDING,
            stamp,
            stamp,
        )
        for row in rows
    ]
    marks = ", ".join("?" for _ in range(15))
    sql = f"INSERT INTO instances ({_INSERT_COLUMNS}) VALUES ({marks})"
    try:
        plain(bind).executemany(sql, params)
    except sqlite3.IntegrityError as exc:
        raise AlreadyExists(
            "an instance id, nonce or idempotency token of this batch is already recorded"
        ) from exc


def set_provider_details(
    session: Session,
    instance_id: str,
    *,
    provider_id: str,
    now: datetime,
    provider_status: str | None = None,
    hostname: str | None = None,
    fqdn: str | None = None,
    ip4: str | None = None,
    ip6: str | None = None,
) -> bool:
    """Record what the provider returned for a create; marks the row ``provisioned``.

    Optional fields left as None keep their stored value. Returns False if the instance is unknown.
    """
    values: dict[str, Any] = {
        "provider_id": provider_id,
        "provider_at": now,
        "record_state": RECORD_PROVISIONED,
        "updated_at": now,
    }
    optional = {
        "provider_status": provider_status,
        "hostname": hostname,
        "fqdn": fqdn,
        "ip4": ip4,
        "ip6": ip6,
    }
    values.update({key: value for key, value in optional.items() if value is not None})
    return rowcount(session, update(Instance).where(Instance.id == instance_id).values(**values)) == 1


def set_provider_details_many(bind: Bind, items: list[dict[str, Any]], *, now: datetime) -> None:
    """``set_provider_details`` for many instances as one executemany UPDATE.

    Each item has ``instance_id`` and ``provider_id`` and optionally ``provider_status``, ``hostname``,
    ``fqdn``, ``ip4``, ``ip6`` (None keeps the stored value). Unknown ids are ignored.
    """
    if not items:
        return
    optional = ("provider_status", "hostname", "fqdn", "ip4", "ip6")
    sql = (
        "UPDATE instances SET provider_id = ?, provider_at = ?, record_state = ?, updated_at = ?, "
        + ", ".join(f"{name} = coalesce(?, {name})" for name in optional)
        + " WHERE id = ?"
    )
    stamp = sqlite_time(now)
    params = [
        (
            item["provider_id"],
            stamp,
            RECORD_PROVISIONED,
            stamp,
            *(item.get(name) for name in optional),
            item["instance_id"],
        )
        for item in items
    ]
    plain(bind).executemany(sql, params)


def set_provider_status(bind: Bind, instance_id: str, status: str, *, now: datetime) -> bool:
    """Store the normalised provider status seen at ``now``. Returns False if the instance is unknown."""
    stamp = sqlite_time(now)
    sql = "UPDATE instances SET provider_status = ?, provider_at = ?, updated_at = ? WHERE id = ?"
    return changed(bind, sql, (status, stamp, stamp, instance_id)) == 1


_HEALTH_SQL = (
    "UPDATE instances SET health_at = ?, health = ?, runtime_config_hash = coalesce(?, runtime_config_hash) "
    "WHERE id = ? AND deleted_at IS NULL"
)


def record_health_many(bind: Bind, items: list[dict[str, Any]]) -> None:
    """Store many agents' health reports as one executemany UPDATE (deleted rows are skipped).

    Each item has ``instance_id``, ``health_at``, ``health`` (JSON) and ``runtime_config_hash``
    (None keeps the stored hash).
    """
    if not items:
        return
    params = [
        (
            sqlite_time(item["health_at"]),
            json.dumps(item["health"]),  # what the ORM's JSON type stores (None as JSON null)
            item.get("runtime_config_hash"),
            item["instance_id"],
        )
        for item in items
    ]
    plain(bind).executemany(_HEALTH_SQL, params)


def mark_create_failed(bind: Bind, instance_id: str, *, now: datetime) -> bool:
    """The provider create failed for good: the row no longer counts and the reconciler removes it.

    False, changing nothing, when the row is deleted or its agent has registered: a registration
    proves that the create made a VM after all (its answer was lost), so the row stays and a provider
    listing fills in the VM's id. A registration after this mark is refused
    (``agent_registration.claim_agent_registration``).
    """
    sql = (
        "UPDATE instances SET record_state = ?, updated_at = ? "
        "WHERE id = ? AND deleted_at IS NULL AND registered_at IS NULL"
    )
    return changed(bind, sql, (RECORD_FAILED, sqlite_time(now), instance_id)) == 1


def start_drain(bind: Bind, instance_id: str, *, reason: str, now: datetime, delete_at: datetime) -> bool:
    """Begin draining: the instance stops counting and is deleted on ack or at ``delete_at``.

    Only the first call for an instance takes effect; returns whether this call started the drain.
    """
    stamp = sqlite_time(now)
    sql = (
        "UPDATE instances SET drain_started_at = ?, drain_reason = ?, delete_at = ?, updated_at = ? "
        "WHERE id = ? AND deleted_at IS NULL AND drain_started_at IS NULL"
    )
    return changed(bind, sql, (stamp, reason, sqlite_time(delete_at), stamp, instance_id)) == 1


def acknowledge_drain(bind: Bind, instance_id: str, *, now: datetime) -> bool:
    """Record the operator's drain acknowledgement; False unless the instance is being drained."""
    stamp = sqlite_time(now)
    sql = (
        "UPDATE instances SET drain_acked_at = ?, updated_at = ? "
        "WHERE id = ? AND deleted_at IS NULL AND drain_started_at IS NOT NULL"
    )
    return changed(bind, sql, (stamp, stamp, instance_id)) == 1


def soft_delete(bind: Bind, instance_id: str, *, now: datetime) -> bool:
    """Mark an instance deleted at ``now``; True only if it existed and was not deleted already."""
    stamp = sqlite_time(now)
    sql = "UPDATE instances SET deleted_at = ?, updated_at = ? WHERE id = ? AND deleted_at IS NULL"
    return changed(bind, sql, (stamp, stamp, instance_id)) == 1


def soft_delete_many(bind: Bind, instance_ids: list[str], *, now: datetime) -> None:
    """``soft_delete`` for many instances as one executemany UPDATE (already deleted ones are left)."""
    stamp = sqlite_time(now)
    sql = "UPDATE instances SET deleted_at = ?, updated_at = ? WHERE id = ? AND deleted_at IS NULL"
    plain(bind).executemany(sql, [(stamp, stamp, instance_id) for instance_id in instance_ids])


def forget_instance(bind: Bind, instance_id: str) -> bool:
    """Remove an instance's row outright (no tombstone): its record is gone, which is not a deletion."""
    return changed(bind, "DELETE FROM instances WHERE id = ?", (instance_id,)) == 1


class PurgedInstance(NamedTuple):
    """An instance row removed by ``purge_deleted_before`` (enough to find its object-storage record)."""

    tenant: str
    instance_id: str


def purge_deleted_before(bind: Bind, cutoff: datetime) -> list[PurgedInstance]:
    """Remove rows soft-deleted before ``cutoff`` (their public keys and LB rows go with them)."""
    sql = "DELETE FROM instances WHERE deleted_at IS NOT NULL AND deleted_at < ? RETURNING tenant, id"
    rows = plain(bind).execute(sql, (sqlite_time(cutoff),)).fetchall()
    return sorted(PurgedInstance(tenant, instance_id) for tenant, instance_id in rows)
