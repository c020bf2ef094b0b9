"""Rebuilding ``instances`` rows from their object-storage records (the cache rebuild after failover).

``restore_instance`` upserts one row through the ORM; ``restore_instances`` upserts a batch as one
plain-SQL executemany, converting times here because SQLAlchemy's per-value processing cost ten times
the insert on a rebuild of 100,000 rows. A restored row overwrites the columns it names and keeps the
others.

Must not stand in for creating or registering an instance: a new instance goes through
``instance_lifecycle`` (which records the create intent), a registration through ``agent_registration``;
this module only copies records into the cache.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.orm import Session

from nstance.core.errors import InvalidArgument
from nstance.db.models import Instance
from nstance.db.repo._sql import INSTANCES_TABLE, Bind, plain
from nstance.db.rows import sqlite_time
from nstance.db.types import UTCDateTime


def restore_instance(session: Session, **values: Any) -> None:
    """Insert or overwrite one row from its object-storage record (cache rebuild after failover).

    ``values`` are column names; ``id`` is required. Columns not given keep their stored value.
    """
    if "id" not in values:
        raise InvalidArgument("restore_instance needs the instance id")
    statement = insert(Instance).values(**values)
    updates = {key: statement.excluded[key] for key in values if key != "id"}
    session.execute(statement.on_conflict_do_update(index_elements=[Instance.id], set_=updates))


_TIME_COLUMNS = frozenset(c.name for c in INSTANCES_TABLE.c if isinstance(c.type, UTCDateTime))
_RESTORE_COLUMNS = frozenset(c.name for c in INSTANCES_TABLE.c) - {"health"}


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
    plain(bind).executemany(sql, params)
