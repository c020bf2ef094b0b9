"""Alembic environment for the SQLite cache.

The application (``nstance.db.engine.migrate``) and the tests pass an open SQLAlchemy connection in
``config.attributes["connection"]``; migrations then run on it, inside the caller's transaction. For
development tooling without a connection, ``sqlalchemy.url`` in the config's main options names the
database instead (and offline ``--sql`` mode renders the statements from that URL).

``render_as_batch`` is on because SQLite's ALTER TABLE is limited: alembic rebuilds the table instead.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

from nstance.db.models import Base

config = context.config
target_metadata = Base.metadata


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Render the migration SQL for the URL in ``sqlalchemy.url`` without connecting."""
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("offline migrations need the sqlalchemy.url main option")
    context.configure(
        url=url,
        target_metadata=target_metadata,
        render_as_batch=True,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run migrations on the connection the caller passed, or on a fresh one to ``sqlalchemy.url``."""
    connection = config.attributes.get("connection")
    if isinstance(connection, Connection):
        _configure_and_run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError(
            "no connection in config.attributes['connection'] and no sqlalchemy.url; "
            "use nstance.db.engine.migrate() to migrate the cache"
        )
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            _configure_and_run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
