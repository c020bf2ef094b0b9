"""Opening the SQLite cache: engine, connection pragmas, transactions and schema migrations.

The cache is a local SQLite file (``{cachedir}/db/nstance.db``). Object storage is the source of truth:
instance records, operator records and group config live there, and a new leader rebuilds this cache
from them (plus the provider's instance list) before acting. So the file may be deleted at any time;
what is lost is only ephemeral state (health reports, drain progress), which is re-learned.

Every connection (the engine's pooled ones and the plain ones of ``read_connection``/``write_connection``)
gets ``journal_mode=WAL`` (readers never block the writer), ``foreign_keys=ON``,
``busy_timeout=5000`` and ``synchronous=NORMAL`` (durable at checkpoints; a power cut may lose the last
transactions, which the rebuild from object storage restores).

The ``sqlite3`` module never emits BEGIN on its own; we do. ``Database.session()`` (ORM) and
``Database.write_connection()`` (plain SQL on the DBAPI connection, for the hot paths) start with
``BEGIN IMMEDIATE``: the write lock is taken up front, so two writers queue on ``busy_timeout`` instead of
one failing with "database is locked" when it upgrades a read snapshot to a write.
``Database.read_session()``, ``Database.read_connection()`` (and any plain ``engine.connect()``) use a
deferred BEGIN: a consistent snapshot that never blocks writers.

The schema is created and upgraded only by alembic (``migrate``), never by ``metadata.create_all``.
"""

from __future__ import annotations

import importlib.resources
import logging
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

from nstance.db import quarantine

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS: Final = 5000
_BEGIN_OPTION: Final = "nstance_sqlite_begin"
_PRAGMAS: Final = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA foreign_keys=ON",
    f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
    "PRAGMA synchronous=NORMAL",
)
#: What a failed statement raises: SQLAlchemy wraps driver errors, plain SQL raises them as they are.
_DB_ERRORS: Final = (DBAPIError, sqlite3.DatabaseError)


def migrations_path() -> str:
    """Filesystem path of the alembic scripts (the ``nstance._migrations`` package)."""
    return str(importlib.resources.files("nstance._migrations"))


def alembic_config(connection: Connection | None = None) -> Config:
    """Build an alembic Config in code (there is no alembic.ini); ``env.py`` uses ``connection``."""
    config = Config()
    config.set_main_option("script_location", migrations_path())
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def _on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry | None) -> None:
    # Take transaction control away from the sqlite3 module; the "begin" hook below emits BEGIN.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        for pragma in _PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


def _on_begin(conn: Connection) -> None:
    immediate = conn.get_execution_options().get(_BEGIN_OPTION) == "IMMEDIATE"
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def create_sqlite_engine(path: Path) -> Engine:
    """Create an engine for the SQLite file at ``path`` (parent directories are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(f"sqlite:///{path}")
    event.listen(engine, "connect", _on_connect)
    event.listen(engine, "begin", _on_begin)
    return engine


def migrate(engine: Engine) -> None:
    """Upgrade the database behind ``engine`` to the newest alembic revision (idempotent).

    The whole upgrade runs in one transaction with foreign key enforcement switched off: SQLite's
    batch mode rebuilds a table by copy-and-drop, and dropping a parent table with enforcement on
    would cascade-delete its children. Integrity is checked with ``foreign_key_check`` before commit.
    """
    with engine.connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        # PRAGMA foreign_keys is a no-op inside a transaction, so set it before BEGIN.
        driver.execute("PRAGMA foreign_keys=OFF")
        conn.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
        try:
            with conn.begin():
                before = current_revision(conn)
                command.upgrade(alembic_config(conn), "head")
                problems = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if problems:
                    raise RuntimeError(f"migration left rows violating foreign keys: {problems[:5]}")
                after = current_revision(conn)
        finally:
            driver.execute("PRAGMA foreign_keys=ON")
    if before != after:
        log.info("sqlite cache migrated", extra={"from_revision": before, "to_revision": after})


def current_revision(conn: Connection) -> str | None:
    """The alembic revision the database is at (None when it has never been migrated)."""
    return MigrationContext.configure(conn).get_current_revision()


class Database:
    """The open cache: an engine plus session factories. Close it (or use ``with``) when done.

    A session that fails because the file is corrupt (``quarantine.is_corruption``) calls
    ``on_corrupt`` (from whatever thread ran it) and raises ``quarantine.CacheCorrupt``;
    ``replace_corrupt_file`` then moves the file aside and starts an empty one under the same object,
    so every holder of this Database keeps working once the cache has been rebuilt.
    """

    def __init__(self, engine: Engine, path: Path | None = None) -> None:
        self.path = path
        self.on_corrupt: Callable[[BaseException], None] | None = None
        # Plain connections (``read_connection``/``write_connection``) are kept here, not in the
        # engine's pool: its checkout and return cost more than a one-statement transaction. One per
        # thread that uses them at once; ``_generation`` retires those opened before a close.
        self._idle: list[sqlite3.Connection] = []
        self._generation = 0
        self._bind(engine)

    def _bind(self, engine: Engine) -> None:
        self.engine = engine
        # expire_on_commit=False: rows returned by repository functions stay readable after commit.
        self._write_engine = engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
        self._write_sessions = sessionmaker(bind=self._write_engine, expire_on_commit=False)
        self._read_sessions = sessionmaker(bind=engine, expire_on_commit=False)

    def _noticed(self, exc: BaseException) -> None:
        """Raise ``CacheCorrupt`` (after telling ``on_corrupt``) when ``exc`` is corruption."""
        if not quarantine.is_corruption(exc):
            return
        if self.on_corrupt is not None:
            self.on_corrupt(exc)
        cause = getattr(exc, "orig", None) or exc
        raise quarantine.CacheCorrupt(
            f"the SQLite cache is corrupt ({cause}); it is being rebuilt from object storage, retry"
        ) from exc

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A read-write transaction (``BEGIN IMMEDIATE``): committed on success, rolled back on error."""
        try:
            with self._write_sessions.begin() as session:
                yield session
        except _DB_ERRORS as exc:
            self._noticed(exc)
            raise

    @contextmanager
    def write_connection(self) -> Iterator[sqlite3.Connection]:
        """A read-write transaction (``BEGIN IMMEDIATE``) on a pooled DBAPI connection, for plain SQL.

        Committed on success, rolled back on error. Neither an ORM Session nor a SQLAlchemy Connection
        is built: for a one-statement transaction those cost several times the statement.
        """
        with self._transaction("BEGIN IMMEDIATE", commit=True) as conn:
            yield conn

    @contextmanager
    def read_connection(self) -> Iterator[sqlite3.Connection]:
        """A consistent snapshot (deferred ``BEGIN``) on a pooled DBAPI connection; always rolled back."""
        with self._transaction("BEGIN", commit=False) as conn:
            yield conn

    @contextmanager
    def _transaction(self, begin: str, *, commit: bool) -> Iterator[sqlite3.Connection]:
        try:
            generation = self._generation
            conn = self._checkout()
            try:
                conn.execute(begin)
                try:
                    yield conn
                    if commit:
                        conn.commit()
                finally:
                    if conn.in_transaction:
                        conn.rollback()
            finally:
                self._checkin(conn, generation)
        except _DB_ERRORS as exc:
            self._noticed(exc)
            raise

    def _checkout(self) -> sqlite3.Connection:
        try:
            return self._idle.pop()  # atomic: no lock needed
        except IndexError:
            pass
        database = self.engine.url.database
        if not database or database == ":memory:":  # pragma: no cover - the cache is always a file
            raise RuntimeError("plain connections need a database file")
        conn = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
        _on_connect(conn, None)
        return conn

    def _checkin(self, conn: sqlite3.Connection, generation: int) -> None:
        """Keep ``conn`` for reuse, unless its transaction is stuck or the engine was replaced since."""
        if generation == self._generation and not conn.in_transaction:
            self._idle.append(conn)
        else:
            conn.close()

    def _close_plain(self) -> None:
        self._generation += 1
        while self._idle:
            self._idle.pop().close()

    @contextmanager
    def read_session(self) -> Iterator[Session]:
        """A consistent snapshot for reads (deferred ``BEGIN``; never blocks writers).

        Always rolled back, so anything written in it is discarded.
        """
        # Closing (not rolling back) ends the transaction without expiring the rows already loaded,
        # so they stay readable after the block.
        try:
            with self._read_sessions() as session:
                yield session
        except _DB_ERRORS as exc:
            self._noticed(exc)
            raise

    def migrate(self) -> None:
        """Apply pending migrations (see ``migrate``)."""
        migrate(self.engine)

    def replace_corrupt_file(self) -> Path | None:
        """Move the (corrupt) file aside and continue on a fresh, migrated one; where the old one went."""
        if self.path is None:
            raise RuntimeError("this database was opened without a path; it cannot be replaced")
        self.engine.dispose()
        self._close_plain()
        moved = quarantine.move_aside(self.path)
        log.error("sqlite cache %s is corrupt: moved to %s; starting an empty one", self.path, moved)
        self._bind(create_sqlite_engine(self.path))
        self.migrate()
        return moved

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()
        self._close_plain()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_database(path: Path, *, migrate: bool = True) -> Database:
    """Open (creating if needed) the SQLite cache at ``path``; with ``migrate`` bring its schema to head.

    A file that fails ``quick_check`` or whose migration hits corruption is moved aside (see
    ``quarantine``) and replaced by an empty one: the cache is rebuilt from object storage anyway.
    """
    path = Path(path)
    problem = quarantine.check_file(path)
    if problem is not None:
        moved = quarantine.move_aside(path)
        log.error("sqlite cache %s is corrupt (%s): moved to %s; starting an empty one", path, problem, moved)
    database = Database(create_sqlite_engine(path), path)
    if migrate or problem is not None:  # a fresh file needs the schema
        try:
            database.migrate()
        except DBAPIError as exc:
            if not quarantine.is_corruption(exc):
                database.close()
                raise
            database.replace_corrupt_file()
        except BaseException:
            database.close()
            raise
    return database
