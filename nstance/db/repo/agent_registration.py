"""An agent's identity on its ``instances`` row: the single-use registration claim, its undo, renewal.

Owns the registration columns (``registered_at``, ``instance_pub``, ``cert_serial``,
``cert_expires_at``) and the addresses an agent reports about itself. Single use rests on one
conditional statement whose affected-row count (or ``RETURNING`` row) is checked, never on
read-then-write: ``mark_registered_atomically`` and ``claim_agent_registration`` are safe when any
number of threads or processes race on the same nonce, ``unmark_registered`` undoes only the
caller's own claim (guarded by its serial), and ``replace_agent_certificate`` is a compare-and-swap
on the current serial.

Must not create, drain or delete instances (``instance_lifecycle``) and must not relax a guard into a
read followed by a write.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import update
from sqlalchemy.orm import Session

from nstance.db.models import RECORD_FAILED, Instance
from nstance.db.repo._sql import Bind, changed, normalize_serial, rowcount
from nstance.db.rows import sqlite_time


def mark_registered_atomically(
    session: Session,
    *,
    nonce: str,
    public_key_pem: str,
    cert_serial: int | str,
    cert_expires_at: datetime,
    now: datetime,
    instance_id: str | None = None,
) -> bool:
    """Consume an agent's registration nonce: True for exactly one caller, False for every other.

    One UPDATE guarded by ``registered_at IS NULL AND deleted_at IS NULL`` and a record state other
    than failed; SQLite serialises writers, so only the first statement to run matches the row. Unknown,
    deleted, failed or already-registered nonces (and a nonce that belongs to a different
    ``instance_id``, when one is given) yield False. A row is failed when the leader decided its
    provider create failed (``instance_lifecycle.mark_create_failed``): the VM that answers with its
    nonce was made by a create whose answer was lost, and is deleted as an orphan when a listing finds
    it, so it must not join first. The two statements exclude each other: whichever runs first wins.
    """
    statement = (
        update(Instance)
        .where(
            Instance.nonce == nonce,
            Instance.registered_at.is_(None),
            Instance.deleted_at.is_(None),
            Instance.record_state != RECORD_FAILED,
        )
        .values(
            registered_at=now,
            instance_pub=public_key_pem,
            cert_serial=normalize_serial(cert_serial),
            cert_expires_at=cert_expires_at,
            updated_at=now,
        )
    )
    if instance_id is not None:
        statement = statement.where(Instance.id == instance_id)
    return rowcount(session, statement) == 1


class AgentClaim(NamedTuple):
    """What ``claim_agent_registration`` learned: whether this call claimed the nonce, and the group."""

    claimed: bool
    group_key: str


_CLAIM_AGENT_SQL = (
    "UPDATE instances SET registered_at = ?, instance_pub = ?, cert_serial = ?, cert_expires_at = ?, "
    "updated_at = ?, ip4 = coalesce(nullif(?, ''), ip4), ip6 = coalesce(nullif(?, ''), ip6), "
    "hostname = coalesce(nullif(?, ''), hostname) "
    "WHERE nonce = ? AND id = ? AND tenant = ? AND registered_at IS NULL "
    f"AND deleted_at IS NULL AND record_state != '{RECORD_FAILED}' RETURNING group_key"
)


def claim_agent_registration(
    conn: sqlite3.Connection,
    *,
    nonce: str,
    instance_id: str,
    tenant: str,
    public_key_pem: str,
    cert_serial: int | str,
    cert_expires_at: datetime,
    now: datetime,
    ip4: str = "",
    ip6: str = "",
    hostname: str = "",
) -> AgentClaim:
    """``mark_registered_atomically`` for the registration hot path: one plain-SQL statement.

    Takes the DBAPI connection of ``Database.write_connection``, not a Session. The row must also belong to
    ``tenant``. Claimed for exactly one caller; every other caller gets ``claimed=False`` (then read the
    row to learn why: unknown, another instance or tenant, deleted, failed, or already registered). The same
    statement stores the addresses and host name the agent reported (empty ones keep the stored
    value), as ``store_reported_addresses`` would, so a replay writes none of them either.
    """
    stamp = sqlite_time(now)
    row = conn.execute(
        _CLAIM_AGENT_SQL,
        (
            stamp,
            public_key_pem,
            normalize_serial(cert_serial),
            sqlite_time(cert_expires_at),
            stamp,
            ip4,
            ip6,
            hostname,
            nonce,
            instance_id,
            tenant,
        ),
    ).fetchone()
    return AgentClaim(claimed=row is not None, group_key=str(row[0]) if row is not None else "")


def store_reported_addresses(
    conn: sqlite3.Connection,
    instance_id: str,
    *,
    now: datetime,
    ip4: str = "",
    ip6: str = "",
    hostname: str = "",
) -> bool:
    """Store the addresses and host name an agent reported about itself; empty values are left alone.

    Plain SQL on a Connection (the registration hot path). True if the (not deleted) instance exists.
    Agent-reported values are authoritative over the provider's view.
    """
    sets = ["updated_at = ?"]
    params: list[Any] = [sqlite_time(now)]
    for column, value in (("ip4", ip4), ("ip6", ip6), ("hostname", hostname)):
        if value:
            sets.append(f"{column} = ?")
            params.append(value)
    sql = f"UPDATE instances SET {', '.join(sets)} WHERE id = ? AND deleted_at IS NULL"
    return conn.execute(sql, (*params, instance_id)).rowcount == 1


def unmark_registered(bind: Bind, *, instance_id: str, cert_serial: int | str, now: datetime) -> bool:
    """Undo ``mark_registered_atomically`` (the registration could not be recorded in object storage).

    Guarded by the certificate serial the claim stored, so only the claim's own caller can undo it and
    a later successful registration is never reverted. True if the claim was undone.
    """
    sql = (
        "UPDATE instances SET registered_at = NULL, instance_pub = NULL, cert_serial = NULL, "
        "cert_expires_at = NULL, updated_at = ? "
        "WHERE id = ? AND registered_at IS NOT NULL AND cert_serial = ?"
    )
    return changed(bind, sql, (sqlite_time(now), instance_id, normalize_serial(cert_serial))) == 1


def replace_agent_certificate(
    bind: Bind,
    *,
    instance_id: str,
    expected_serial: int | str,
    public_key_pem: str,
    cert_serial: int | str,
    cert_expires_at: datetime,
    now: datetime,
) -> bool:
    """Swap a registered instance's identity certificate, only if its current serial is ``expected_serial``.

    One conditional UPDATE (compare-and-swap on the serial): of two renewals presenting the same
    certificate exactly one wins, and a superseded certificate can never renew. False when the
    instance is unknown, deleted, unregistered or has another current serial.
    """
    sql = (
        "UPDATE instances SET instance_pub = ?, cert_serial = ?, cert_expires_at = ?, updated_at = ? "
        "WHERE id = ? AND deleted_at IS NULL AND registered_at IS NOT NULL AND cert_serial = ?"
    )
    params = (
        public_key_pem,
        normalize_serial(cert_serial),
        sqlite_time(cert_expires_at),
        sqlite_time(now),
        instance_id,
        normalize_serial(expected_serial),
    )
    return changed(bind, sql, params) == 1
