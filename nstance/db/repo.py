"""Repository functions over the SQLite cache: the only queries the rest of the server runs.

Each function takes an open ``Session`` (from ``Database.session()`` for writes, ``read_session()`` for
reads) and neither commits nor rolls back: the caller owns the transaction, so several calls can form
one atomic step. Times are passed in (``now``) from the injected clock, never read here.

The hot paths (the reconciler's, GC's and provider sync's listings, instance lookups, health, status
and delete writes, registration) run plain SQL on the DBAPI connection instead of the ORM: the ORM
spent several times the statement's own cost building and tracking objects. Those functions take a
``Bind``: a Session (they run in its transaction) or a plain ``sqlite3.Connection`` from
``Database.read_connection()`` / ``write_connection()``, which skips the Session's own cost too.
They return immutable ``rows`` tuples (``InstanceRow``, ``PublicKeyRow``, ``LbRow``). The other
functions use the ORM and return ORM rows, which stay readable after the session ends
(``expire_on_commit=False``). The busiest writers (health, the create path's batches, the
registration claim) run on the shard's single database writer thread (``InstanceOps.db_writer``),
so they never queue on SQLite's write lock behind each other.

Single-use guarantees rest on one conditional statement whose affected-row count is checked, never on
read-then-write: ``mark_registered_atomically`` and ``claim_operator_nonce`` are safe when any number
of threads or processes race on the same nonce.
"""

from __future__ import annotations

import enum
import json
import sqlite3
from datetime import datetime
from typing import Any, NamedTuple, TypeAlias, cast

from sqlalchemy import Executable, Table, case, delete, func, select, update
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from nstance.core.errors import AlreadyExists, InvalidArgument, NotFound
from nstance.db.models import (
    INACTIVE_PROVIDER_STATUSES,
    LB_STATUSES,
    RECORD_FAILED,
    RECORD_PENDING,
    RECORD_PROVISIONED,
    Group,
    Image,
    Instance,
    Operator,
    PublicKey,
    RevokedCert,
)
from nstance.db.rows import (
    INSTANCES,
    LB_INSTANCES,
    PUBLIC_KEYS,
    InstanceRow,
    LbRow,
    PublicKeyRow,
    sqlite_time,
)
from nstance.db.types import UTCDateTime

_INSTANCES: Table = Instance.__table__  # type: ignore[assignment]  # Core statements for the batch paths

#: What the plain-SQL functions run on: a Session (in its transaction) or a DBAPI connection.
Bind: TypeAlias = Session | sqlite3.Connection


def _plain(bind: Bind) -> sqlite3.Connection:
    """The DBAPI connection under ``bind``; a Session's is taken in (and starts) its transaction."""
    if isinstance(bind, Session):
        return cast(sqlite3.Connection, bind.connection().connection.driver_connection)
    return bind


def _instances(bind: Bind, where: str, params: tuple[Any, ...] = ()) -> list[InstanceRow]:
    """Instance rows matching ``where`` (plain SQL, with its ORDER BY), as ``InstanceRow``."""
    cursor = _plain(bind).execute(f"SELECT {INSTANCES.columns} FROM instances WHERE {where}", params)
    return [INSTANCES.row(values) for values in cursor.fetchall()]


def _changed(bind: Bind, sql: str, params: tuple[Any, ...]) -> int:
    """Run one plain-SQL write; the number of rows it changed."""
    return _plain(bind).execute(sql, params).rowcount


def _rowcount(session: Session, statement: Executable) -> int:
    result = session.execute(statement)
    if not isinstance(result, CursorResult):  # pragma: no cover - DML always yields a CursorResult
        raise TypeError(f"expected a CursorResult from DML, got {type(result).__name__}")
    return result.rowcount


def normalize_serial(serial: int | str) -> str:
    """Canonical text form of a certificate serial: lowercase hex, no ``0x``, colons or leading zeros."""
    if isinstance(serial, int):
        if serial < 0:
            raise InvalidArgument(f"certificate serial must not be negative (got {serial})")
        return format(serial, "x")
    text = serial.strip().lower().replace(":", "")
    text = text.removeprefix("0x")
    try:
        value = int(text, 16)
    except ValueError:
        raise InvalidArgument(f"certificate serial {serial!r} is not hexadecimal") from None
    return format(value, "x")


# --- instances ---------------------------------------------------------------------------------


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
    return _rowcount(session, update(Instance).where(Instance.id == instance_id).values(**values)) == 1


def set_provider_status(bind: Bind, instance_id: str, status: str, *, now: datetime) -> bool:
    """Store the normalised provider status seen at ``now``. Returns False if the instance is unknown."""
    stamp = sqlite_time(now)
    sql = "UPDATE instances SET provider_status = ?, provider_at = ?, updated_at = ? WHERE id = ?"
    return _changed(bind, sql, (status, stamp, stamp, instance_id)) == 1


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
    _plain(bind).executemany(_HEALTH_SQL, params)


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

    One UPDATE guarded by ``registered_at IS NULL AND deleted_at IS NULL``; SQLite serialises writers,
    so only the first statement to run matches the row. Unknown, deleted or already-registered nonces
    (and a nonce that belongs to a different ``instance_id``, when one is given) yield False.
    """
    statement = (
        update(Instance)
        .where(
            Instance.nonce == nonce,
            Instance.registered_at.is_(None),
            Instance.deleted_at.is_(None),
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
    return _rowcount(session, statement) == 1


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
) -> list[InstanceRow]:
    """Instances not deleted and not being deleted by the provider, oldest first.

    ``managed_only`` leaves out on-demand instances (the reconciler counts only managed ones).
    """
    where = _ACTIVE
    params: tuple[str, ...] = ()
    if tenant is not None:
        where += " AND tenant = ?"
        params += (tenant,)
    if group_key is not None:
        where += " AND group_key = ?"
        params += (group_key,)
    if managed_only:
        where += " AND on_demand = 0"
    return _instances(bind, where + _OLDEST_FIRST, params)


def soft_delete(bind: Bind, instance_id: str, *, now: datetime) -> bool:
    """Mark an instance deleted at ``now``; True only if it existed and was not deleted already."""
    stamp = sqlite_time(now)
    sql = "UPDATE instances SET deleted_at = ?, updated_at = ? WHERE id = ? AND deleted_at IS NULL"
    return _changed(bind, sql, (stamp, stamp, instance_id)) == 1


def list_instances(bind: Bind, *, include_deleted: bool = False) -> list[InstanceRow]:
    """Every instance row (deleted ones only when asked), oldest first."""
    where = "1" if include_deleted else "deleted_at IS NULL"
    return _instances(bind, where + _OLDEST_FIRST)


def insert_instances(session: Session, rows: list[dict[str, Any]], *, now: datetime) -> None:
    """Record many new instances (state ``pending``) in one statement - the create path's batch intent.

    Each dict holds ``insert_instance``'s keyword arguments (without ``now``). Raises AlreadyExists,
    inserting none of them, if any id, nonce or idempotency token is taken.
    """
    if not rows:
        return
    values = [
        {
            "on_demand": False,
            "template": None,
            "subnet_id": None,
            "instance_type": None,
            "infra_config_hash": None,
            "idempotency_token": None,
            "issued_at": None,
            **row,
            "id": row["instance_id"],
            "group_key": row["group_key"],
            "record_state": RECORD_PENDING,
            "created_at": now,
            "updated_at": now,
        }
        for row in rows
    ]
    for value in values:
        value.pop("instance_id", None)
    try:
        with session.begin_nested():
            session.execute(_INSTANCES.insert(), values)
    except IntegrityError as exc:
        raise AlreadyExists(
            "an instance id, nonce or idempotency token of this batch is already recorded"
        ) from exc


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
    _plain(bind).executemany(sql, params)


def count_instances(bind: Bind) -> dict[tuple[str, str, str], int]:
    """Live instances counted by (tenant, group, state) with one aggregate query (for metrics)."""
    sql = (
        "SELECT tenant, group_key, CASE WHEN drain_started_at IS NOT NULL THEN 'draining' "
        f"WHEN record_state = '{RECORD_FAILED}' THEN 'failed' ELSE coalesce(provider_status, 'pending') END "
        "AS state, count(*) FROM instances WHERE deleted_at IS NULL GROUP BY tenant, group_key, state"
    )
    return {(t, g, str(st)): int(n) for t, g, st, n in _plain(bind).execute(sql).fetchall()}


def groups_with_managed_instances(bind: Bind) -> set[tuple[str, str]]:
    """(tenant, group) of every group that still has a live managed instance."""
    sql = "SELECT DISTINCT tenant, group_key FROM instances WHERE deleted_at IS NULL AND on_demand = 0"
    return {(t, g) for t, g in _plain(bind).execute(sql).fetchall()}


def mark_create_failed(bind: Bind, instance_id: str, *, now: datetime) -> bool:
    """The provider create failed for good: the row no longer counts and the reconciler removes it."""
    sql = "UPDATE instances SET record_state = ?, updated_at = ? WHERE id = ? AND deleted_at IS NULL"
    return _changed(bind, sql, (RECORD_FAILED, sqlite_time(now), instance_id)) == 1


def start_drain(bind: Bind, instance_id: str, *, reason: str, now: datetime, delete_at: datetime) -> bool:
    """Begin draining: the instance stops counting and is deleted on ack or at ``delete_at``.

    Only the first call for an instance takes effect; returns whether this call started the drain.
    """
    stamp = sqlite_time(now)
    sql = (
        "UPDATE instances SET drain_started_at = ?, drain_reason = ?, delete_at = ?, updated_at = ? "
        "WHERE id = ? AND deleted_at IS NULL AND drain_started_at IS NULL"
    )
    return _changed(bind, sql, (stamp, reason, sqlite_time(delete_at), stamp, instance_id)) == 1


def acknowledge_drain(bind: Bind, instance_id: str, *, now: datetime) -> bool:
    """Record the operator's drain acknowledgement; False unless the instance is being drained."""
    stamp = sqlite_time(now)
    sql = (
        "UPDATE instances SET drain_acked_at = ?, updated_at = ? "
        "WHERE id = ? AND deleted_at IS NULL AND drain_started_at IS NOT NULL"
    )
    return _changed(bind, sql, (stamp, stamp, instance_id)) == 1


def restore_instance(session: Session, **values: Any) -> None:
    """Insert or overwrite one row from its object-storage record (cache rebuild after failover).

    ``values`` are column names; ``id`` is required. Columns not given keep their stored value.
    """
    if "id" not in values:
        raise InvalidArgument("restore_instance needs the instance id")
    statement = insert(Instance).values(**values)
    updates = {key: statement.excluded[key] for key in values if key != "id"}
    session.execute(statement.on_conflict_do_update(index_elements=[Instance.id], set_=updates))


_TIME_COLUMNS = frozenset(c.name for c in _INSTANCES.c if isinstance(c.type, UTCDateTime))
_RESTORE_COLUMNS = frozenset(c.name for c in _INSTANCES.c) - {"health"}


def restore_instances(
    bind: Bind, rows: list[dict[str, Any]], *, keep_stored_if_null: tuple[str, ...] = ()
) -> None:
    """``restore_instance`` for many rows as one executemany upsert (the cache rebuild's batch step).

    Every dict must have the same keys (``id`` among them; ``health``, a JSON column, is not accepted).
    A column named in ``keep_stored_if_null`` keeps its stored value where the row gives None (a fresh
    row gets NULL). Plain SQL with the values converted here: SQLAlchemy's per-value bind processing
    cost ten times the insert itself on a rebuild of 100,000 rows.
    """
    if not rows:
        return
    columns = list(rows[0])
    if "id" not in columns:
        raise InvalidArgument("restore_instances needs the instance id of every row")
    unknown = sorted(set(columns) - _RESTORE_COLUMNS)
    if unknown:
        raise InvalidArgument(f"restore_instances: unknown column(s) {', '.join(unknown)}")
    sets = ", ".join(
        f"{name} = coalesce(excluded.{name}, {name})"
        if name in keep_stored_if_null
        else f"{name} = excluded.{name}"
        for name in columns
        if name != "id"
    )
    sql = (
        f"INSERT INTO instances ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)}) "
        f"ON CONFLICT(id) DO UPDATE SET {sets}"
    )
    times = [i for i, name in enumerate(columns) if name in _TIME_COLUMNS]
    params: list[tuple[Any, ...]] = []
    for row in rows:
        values = [row[name] for name in columns]
        for i in times:
            values[i] = sqlite_time(values[i])
        params.append(tuple(values))
    _plain(bind).executemany(sql, params)


def soft_delete_many(bind: Bind, instance_ids: list[str], *, now: datetime) -> None:
    """``soft_delete`` for many instances as one executemany UPDATE (already deleted ones are left)."""
    stamp = sqlite_time(now)
    sql = "UPDATE instances SET deleted_at = ?, updated_at = ? WHERE id = ? AND deleted_at IS NULL"
    _plain(bind).executemany(sql, [(stamp, stamp, instance_id) for instance_id in instance_ids])


def live_instance_ids(bind: Bind) -> set[str]:
    """The ids of every instance row not soft-deleted (one column, no row objects)."""
    return {iid for (iid,) in _plain(bind).execute("SELECT id FROM instances WHERE deleted_at IS NULL")}


def get_instances(bind: Bind, instance_ids: list[str]) -> list[InstanceRow]:
    """The rows with these ids (unknown ids are left out), oldest first."""
    if not instance_ids:
        return []
    unique = list(dict.fromkeys(instance_ids))
    marks = ", ".join("?" for _ in unique)
    return _instances(bind, f"id IN ({marks}){_OLDEST_FIRST}", tuple(unique))


def forget_instance(bind: Bind, instance_id: str) -> bool:
    """Remove an instance's row outright (no tombstone): its record is gone, which is not a deletion."""
    return _changed(bind, "DELETE FROM instances WHERE id = ?", (instance_id,)) == 1


class PurgedInstance(NamedTuple):
    """An instance row removed by ``purge_deleted_before`` (enough to find its object-storage record)."""

    tenant: str
    instance_id: str


def purge_deleted_before(bind: Bind, cutoff: datetime) -> list[PurgedInstance]:
    """Remove rows soft-deleted before ``cutoff`` (their public keys and LB rows go with them)."""
    sql = "DELETE FROM instances WHERE deleted_at IS NOT NULL AND deleted_at < ? RETURNING tenant, id"
    rows = _plain(bind).execute(sql, (sqlite_time(cutoff),)).fetchall()
    return sorted(PurgedInstance(tenant, instance_id) for tenant, instance_id in rows)


# --- groups ------------------------------------------------------------------------------------


_GROUP_HASHES_SQL = (
    "INSERT INTO groups (tenant, group_key, runtime_config_hash, infra_config_hash, hashes_updated_at, "
    "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, group_key) DO UPDATE SET "
    "runtime_config_hash = excluded.runtime_config_hash, infra_config_hash = excluded.infra_config_hash, "
    "hashes_updated_at = excluded.hashes_updated_at, updated_at = excluded.updated_at "
    "WHERE groups.runtime_config_hash != excluded.runtime_config_hash "
    "OR groups.infra_config_hash != excluded.infra_config_hash"
)


def upsert_group_hashes(
    bind: Bind,
    *,
    tenant: str,
    group_key: str,
    runtime_config_hash: str,
    infra_config_hash: str,
    now: datetime,
) -> bool:
    """Store a group's config hashes; True if the group is new or either hash changed.

    ``hashes_updated_at`` moves only when a hash actually changes, so it says when drift began.
    """
    stamp = sqlite_time(now)
    params = (tenant, group_key, runtime_config_hash, infra_config_hash, stamp, stamp, stamp)
    return _changed(bind, _GROUP_HASHES_SQL, params) == 1


def get_group_hashes(session: Session, tenant: str, group_key: str) -> Group | None:
    """The stored hashes of one group, or None if none were stored."""
    return session.get(Group, (tenant, group_key))


def list_groups(session: Session, *, tenant: str | None = None) -> list[Group]:
    """Every group with stored hashes (optionally of one tenant), ordered by tenant and key."""
    statement = select(Group).order_by(Group.tenant, Group.group_key)
    if tenant is not None:
        statement = statement.where(Group.tenant == tenant)
    return list(session.scalars(statement))


def delete_group_hashes(session: Session, tenant: str, group_key: str) -> bool:
    """Forget a removed group's hashes; True if there were any."""
    statement = delete(Group).where(Group.tenant == tenant, Group.group_key == group_key)
    return _rowcount(session, statement) == 1


# --- workload public keys ----------------------------------------------------------------------


def upsert_public_key(
    session: Session,
    *,
    instance_id: str,
    filename: str,
    public_key_pem: str,
    now: datetime,
    certificate_name: str | None = None,
) -> PublicKey:
    """Store the public key an agent submitted for ``filename``.

    A different key than the stored one clears the issued-certificate fields (that certificate
    belongs to the old key); resubmitting the same key keeps them. Raises NotFound for an unknown
    instance.
    """
    statement = insert(PublicKey).values(
        instance_id=instance_id,
        filename=filename,
        public_key_pem=public_key_pem,
        certificate_name=certificate_name,
        submitted_at=now,
        created_at=now,
        updated_at=now,
    )
    same_key = PublicKey.public_key_pem == statement.excluded.public_key_pem
    statement = statement.on_conflict_do_update(
        index_elements=[PublicKey.instance_id, PublicKey.filename],
        set_={
            "public_key_pem": statement.excluded.public_key_pem,
            "certificate_name": statement.excluded.certificate_name,
            "certificate_serial": case((same_key, PublicKey.certificate_serial), else_=None),
            "certificate_issued_at": case((same_key, PublicKey.certificate_issued_at), else_=None),
            "submitted_at": statement.excluded.submitted_at,
            "updated_at": statement.excluded.updated_at,
        },
    )
    returning = statement.returning(PublicKey)
    try:
        with session.begin_nested():
            return session.scalars(returning, execution_options={"populate_existing": True}).one()
    except IntegrityError as exc:
        raise NotFound(f"instance {instance_id!r} is not in the cache") from exc


def list_public_keys(bind: Bind, instance_id: str) -> list[PublicKeyRow]:
    """The public keys an instance submitted, by filename."""
    sql = f"SELECT {PUBLIC_KEYS.columns} FROM public_keys WHERE instance_id = ? ORDER BY filename"
    return [PUBLIC_KEYS.row(values) for values in _plain(bind).execute(sql, (instance_id,)).fetchall()]


# --- certificate deny list ---------------------------------------------------------------------


def add_revoked_serial(
    session: Session,
    serial: int | str,
    *,
    now: datetime,
    reason: str = "",
    expires_at: datetime | None = None,
) -> bool:
    """Put a certificate serial on the deny list; True if it was not there yet."""
    statement = (
        insert(RevokedCert)
        .values(serial=normalize_serial(serial), revoked_at=now, reason=reason, expires_at=expires_at)
        .on_conflict_do_nothing(index_elements=[RevokedCert.serial])
    )
    return _rowcount(session, statement) == 1


def is_serial_revoked(session: Session, serial: int | str) -> bool:
    """True if the serial (any accepted spelling) is on the deny list."""
    return session.get(RevokedCert, normalize_serial(serial)) is not None


def revoked_serials(session: Session) -> set[str]:
    """Every serial on the deny list, normalised (for an in-memory check in the auth path)."""
    return set(session.scalars(select(RevokedCert.serial)))


# --- operators ---------------------------------------------------------------------------------


class NonceClaim(enum.Enum):
    """Outcome of ``claim_operator_nonce``."""

    CLAIMED = "claimed"  # this call bound the nonce to the key
    SAME_KEY = "same_key"  # bound earlier to the same public key: a retry, allowed
    TAKEN = "taken"  # bound earlier to a different key: refuse


def claim_operator_nonce(
    session: Session,
    *,
    nonce: str,
    operator_id: str,
    cluster_id: str,
    tenant: str,
    public_key: str,
    now: datetime,
    cert_serial: int | str | None = None,
    cert_expires_at: datetime | None = None,
) -> tuple[NonceClaim, Operator]:
    """Bind an operator registration nonce to a public key, once.

    ``INSERT ... ON CONFLICT(nonce) DO NOTHING`` decides the race: the one insert that lands gets
    CLAIMED. Everyone else learns whether the stored key equals theirs (compare PEM text normalised
    the same way by the caller). Returns the outcome and the row now holding the nonce.
    """
    statement = (
        insert(Operator)
        .values(
            id=operator_id,
            cluster_id=cluster_id,
            tenant=tenant,
            nonce=nonce,
            public_key=public_key,
            cert_serial=None if cert_serial is None else normalize_serial(cert_serial),
            cert_expires_at=cert_expires_at,
            registered_at=now,
            created_at=now,
            updated_at=now,
        )
        .on_conflict_do_nothing(index_elements=[Operator.nonce])
    )
    try:
        with session.begin_nested():
            inserted = _rowcount(session, statement) == 1
    except IntegrityError as exc:
        raise AlreadyExists(f"operator {operator_id!r} already exists") from exc
    holder = session.scalars(
        select(Operator).where(Operator.nonce == nonce), execution_options={"populate_existing": True}
    ).one()
    if inserted:
        return NonceClaim.CLAIMED, holder
    return (NonceClaim.SAME_KEY if holder.public_key == public_key else NonceClaim.TAKEN), holder


def upsert_operator(
    session: Session,
    *,
    operator_id: str,
    cluster_id: str,
    tenant: str,
    public_key: str,
    registered_at: datetime,
    now: datetime,
    cert_serial: int | str | None = None,
    cert_expires_at: datetime | None = None,
    renewed_at: datetime | None = None,
    nonce: str | None = None,
) -> None:
    """Create or refresh an operator row (cache rebuild from object storage, certificate renewal).

    A stored nonce is never cleared by an upsert without one (object-storage records carry none).
    """
    statement = insert(Operator).values(
        id=operator_id,
        cluster_id=cluster_id,
        tenant=tenant,
        nonce=nonce,
        public_key=public_key,
        cert_serial=None if cert_serial is None else normalize_serial(cert_serial),
        cert_expires_at=cert_expires_at,
        registered_at=registered_at,
        renewed_at=renewed_at,
        created_at=now,
        updated_at=now,
    )
    excluded = statement.excluded
    statement = statement.on_conflict_do_update(
        index_elements=[Operator.id],
        set_={
            "cluster_id": excluded.cluster_id,
            "tenant": excluded.tenant,
            "nonce": func.coalesce(excluded.nonce, Operator.nonce),
            "public_key": excluded.public_key,
            "cert_serial": excluded.cert_serial,
            "cert_expires_at": excluded.cert_expires_at,
            "registered_at": excluded.registered_at,
            "renewed_at": excluded.renewed_at,
            "updated_at": excluded.updated_at,
        },
    )
    try:
        with session.begin_nested():
            session.execute(statement)
    except IntegrityError as exc:
        raise AlreadyExists(f"operator {operator_id!r}: nonce already bound to another operator") from exc


def get_operator(session: Session, operator_id: str) -> Operator | None:
    """The operator row with this id, or None."""
    return session.get(Operator, operator_id)


def list_operators(session: Session, *, tenant: str | None = None) -> list[Operator]:
    """Registered operators (optionally of one tenant), oldest registration first."""
    statement = select(Operator).order_by(Operator.registered_at, Operator.id)
    if tenant is not None:
        statement = statement.where(Operator.tenant == tenant)
    return list(session.scalars(statement))


# --- registration (agents) ---------------------------------------------------------------------


def set_reported_addresses(
    session: Session,
    instance_id: str,
    *,
    now: datetime,
    ip4: str = "",
    ip6: str = "",
    hostname: str = "",
) -> bool:
    """Store the addresses and host name an agent reported about itself; empty values are left alone.

    True if the (not deleted) instance exists. Agent-reported values are authoritative over the
    provider's view.
    """
    values: dict[str, Any] = {"updated_at": now}
    if ip4:
        values["ip4"] = ip4
    if ip6:
        values["ip6"] = ip6
    if hostname:
        values["hostname"] = hostname
    statement = (
        update(Instance).where(Instance.id == instance_id, Instance.deleted_at.is_(None)).values(**values)
    )
    return _rowcount(session, statement) == 1


class AgentClaim(NamedTuple):
    """What ``claim_agent_registration`` learned: whether this call claimed the nonce, and the group."""

    claimed: bool
    group_key: str


_CLAIM_AGENT_SQL = (
    "UPDATE instances SET registered_at = ?, instance_pub = ?, cert_serial = ?, cert_expires_at = ?, "
    "updated_at = ?, ip4 = coalesce(nullif(?, ''), ip4), ip6 = coalesce(nullif(?, ''), ip6), "
    "hostname = coalesce(nullif(?, ''), hostname) "
    "WHERE nonce = ? AND id = ? AND tenant = ? AND registered_at IS NULL "
    "AND deleted_at IS NULL RETURNING group_key"
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
    row to learn why: unknown, another instance or tenant, deleted, or already registered). The same
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
    """``set_reported_addresses`` in plain SQL on a Connection (the registration hot path)."""
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
    return _changed(bind, sql, (sqlite_time(now), instance_id, normalize_serial(cert_serial))) == 1


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
    return _changed(bind, sql, params) == 1


def count_operators(session: Session) -> int:
    """How many operator rows the cache holds (0 means: backfill from object storage)."""
    return int(session.scalar(select(func.count()).select_from(Operator)) or 0)


# --- images -------------------------------------------------------------------------------------


def get_image(session: Session, name: str) -> Image | None:
    """The cached resolution of ``images.<name>``, or None."""
    return session.get(Image, name)


def put_image(
    session: Session, name: str, *, image_id: str, resolved_at: datetime, fingerprint: str | None
) -> None:
    """Store (or replace) the resolution of ``images.<name>``."""
    statement = insert(Image).values(
        name=name, image_id=image_id, resolved_at=resolved_at, fingerprint=fingerprint
    )
    session.execute(
        statement.on_conflict_do_update(
            index_elements=[Image.name],
            set_={"image_id": image_id, "resolved_at": resolved_at, "fingerprint": fingerprint},
        )
    )


# --- load balancer membership -------------------------------------------------------------------


def set_lb_status(bind: Bind, lb_key: str, instance_ids: list[str], *, status: str, now: datetime) -> None:
    """Record ``status`` (one of LB_STATUSES) for each instance in load balancer ``lb_key``."""
    if status not in LB_STATUSES:
        raise InvalidArgument(
            f"load balancer status must be one of {', '.join(LB_STATUSES)} (got {status!r})"
        )
    sql = (
        "INSERT INTO lb_instances (lb_key, instance_id, status, updated_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (lb_key, instance_id) DO UPDATE SET status = excluded.status, "
        "updated_at = excluded.updated_at"
    )
    stamp = sqlite_time(now)
    _plain(bind).executemany(sql, [(lb_key, instance_id, status, stamp) for instance_id in instance_ids])


def _lb_rows(bind: Bind, column: str, value: str) -> list[LbRow]:
    sql = f"SELECT {LB_INSTANCES.columns} FROM lb_instances WHERE {column} = ?"
    return [LB_INSTANCES.row(values) for values in _plain(bind).execute(sql, (value,)).fetchall()]


def lb_memberships(bind: Bind, instance_id: str) -> list[LbRow]:
    """Every load balancer row of one instance."""
    return _lb_rows(bind, "instance_id", instance_id)


def lb_members(bind: Bind, lb_key: str) -> list[LbRow]:
    """Every instance row of one load balancer."""
    return _lb_rows(bind, "lb_key", lb_key)


def delete_lb_memberships(bind: Bind, instance_id: str) -> None:
    """Forget one instance's load balancer rows (its deregistration was confirmed)."""
    _plain(bind).execute("DELETE FROM lb_instances WHERE instance_id = ?", (instance_id,))
