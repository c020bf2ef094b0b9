"""What every table module of the repository shares: the bind, its DBAPI connection, changed-row counts.

``Bind`` is what a plain-SQL function runs on: an ORM ``Session`` (the statement runs in its
transaction) or a plain ``sqlite3.Connection`` from ``Database.read_connection()`` /
``write_connection()``. ``plain`` unwraps it, ``changed`` and ``rowcount`` give the affected-row count
a conditional write is judged by, and ``normalize_serial`` is the one text form certificate serials
are stored and compared in (agent registration, operators and the deny list all use it).

This module owns no table and runs no query of its own; it must not grow table-specific helpers
(those stay private to their table's module).
"""

from __future__ import annotations

import sqlite3
from typing import Any, TypeAlias, cast

from sqlalchemy import Executable, Table
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from nstance.core.errors import InvalidArgument
from nstance.db.models import Instance

#: What the plain-SQL functions run on: a Session (in its transaction) or a DBAPI connection.
Bind: TypeAlias = Session | sqlite3.Connection

#: The ``instances`` table for Core statements (the batch insert, the restore's column checks).
INSTANCES_TABLE: Table = Instance.__table__  # type: ignore[assignment]


def plain(bind: Bind) -> sqlite3.Connection:
    """The DBAPI connection under ``bind``; a Session's is taken in (and starts) its transaction."""
    if isinstance(bind, Session):
        return cast(sqlite3.Connection, bind.connection().connection.driver_connection)
    return bind


def changed(bind: Bind, sql: str, params: tuple[Any, ...]) -> int:
    """Run one plain-SQL write; the number of rows it changed."""
    return plain(bind).execute(sql, params).rowcount


def rowcount(session: Session, statement: Executable) -> int:
    """Run one ORM DML statement; the number of rows it changed."""
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
