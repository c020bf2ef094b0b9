"""The SQLite cache schema: alembic migrations equal the ORM models, pragmas hold, timestamps stay UTC.

Every test works on a real database file in tmp_path, migrated the way the server migrates it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    CheckConstraint,
    Column,
    DefaultClause,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    inspect,
    select,
)
from sqlalchemy.exc import IntegrityError, StatementError

from nstance.db import repo
from nstance.db.engine import (
    Database,
    alembic_config,
    current_revision,
    migrations_path,
    open_database,
)
from nstance.db.models import NAMING_CONVENTION, Base, Instance, PublicKey

NOW = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
TABLES = {"instances", "groups", "public_keys", "operators", "images", "lb_instances", "revoked_certs"}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_database(tmp_path / "cache" / "db" / "nstance.db")
    yield database
    database.close()


def _diff(database: Database, metadata: MetaData) -> list[Any]:
    with database.engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True}
        )
        return list(compare_metadata(context, metadata))


def _head() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def test_migrated_schema_equals_models(db: Database) -> None:
    assert _diff(db, Base.metadata) == []
    assert set(inspect(db.engine).get_table_names()) >= TABLES


def _with_extra_column(metadata: MetaData) -> None:
    metadata.tables["instances"].append_column(Column("surprise", String, nullable=True))


def _with_extra_index(metadata: MetaData) -> None:
    Index("ix_instances_hostname", metadata.tables["instances"].c.hostname)


def _with_extra_unique(metadata: MetaData) -> None:
    table = metadata.tables["images"]
    table.append_constraint(UniqueConstraint(table.c.image_id, name="uq_images_image_id"))


def _with_dropped_index(metadata: MetaData) -> None:
    table = metadata.tables["instances"]
    table.indexes.discard(next(ix for ix in table.indexes if ix.name == "ix_instances_provider_id"))


def _with_changed_type(metadata: MetaData) -> None:
    metadata.tables["groups"].c.runtime_config_hash.type = Integer()


def _with_changed_nullability(metadata: MetaData) -> None:
    metadata.tables["instances"].c.template.nullable = False


def _with_changed_default(metadata: MetaData) -> None:
    metadata.tables["instances"].c.record_state.server_default = DefaultClause("provisioned")


def _with_extra_table(metadata: MetaData) -> None:
    Table("surprises", metadata, Column("id", Integer, primary_key=True))


@pytest.mark.parametrize(
    ("change", "expected_op"),
    [
        (_with_extra_column, "add_column"),
        (_with_extra_index, "add_index"),
        (_with_extra_unique, "add_constraint"),
        (_with_dropped_index, "remove_index"),
        (_with_changed_type, "modify_type"),
        (_with_changed_nullability, "modify_nullable"),
        (_with_changed_default, "modify_default"),
        (_with_extra_table, "add_table"),
    ],
)
def test_comparison_detects_model_drift(
    db: Database, change: Callable[[MetaData], None], expected_op: str
) -> None:
    # The equality test above is only worth something if a model change without a migration fails it.
    drifted = MetaData(naming_convention=NAMING_CONVENTION)
    for table in Base.metadata.sorted_tables:
        table.to_metadata(drifted)
    change(drifted)

    diff = _diff(db, drifted)

    assert diff, "a model change without a migration must show up as a schema difference"
    flat = [entry for item in diff for entry in (item if isinstance(item, list) else [item])]
    assert expected_op in {entry[0] for entry in flat}


def test_check_constraints_match_models(db: Database) -> None:
    # compare_metadata does not look at CHECK constraints, so compare them by name and text here.
    inspector = inspect(db.engine)
    for table in Base.metadata.sorted_tables:
        expected = {
            str(c.name): " ".join(str(c.sqltext).split())
            for c in table.constraints
            if isinstance(c, CheckConstraint)
        }
        reflected = {
            str(c["name"]): " ".join(c["sqltext"].split())
            for c in inspector.get_check_constraints(table.name)
        }
        assert reflected == expected, table.name
    assert "ck_instances_record_state" in {c["name"] for c in inspector.get_check_constraints("instances")}


def test_every_pooled_connection_has_the_pragmas(db: Database) -> None:
    # Hold several connections at once so the pool has to open new ones, not reuse one.
    conns = [db.engine.connect() for _ in range(3)]
    try:
        for conn in conns:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    finally:
        for conn in conns:
            conn.close()


def test_foreign_keys_are_enforced(db: Database) -> None:
    with pytest.raises(IntegrityError), db.session() as session:
        session.add(
            PublicKey(
                instance_id="knc-does-not-exist",
                filename="tls.key",
                public_key_pem="pem",
                submitted_at=NOW,
                created_at=NOW,
                updated_at=NOW,
            )
        )


def test_open_creates_parent_directories_and_lands_on_head(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "nstance.db"
    with open_database(path) as database, database.engine.connect() as conn:
        assert current_revision(conn) == _head()
    assert path.is_file()


def test_open_without_migrate_leaves_the_file_empty(tmp_path: Path) -> None:
    with open_database(tmp_path / "nstance.db", migrate=False) as database:
        assert inspect(database.engine).get_table_names() == []
        database.migrate()
        assert set(inspect(database.engine).get_table_names()) >= TABLES


def test_migrate_is_idempotent_and_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "nstance.db"
    with open_database(path) as database, database.session() as session:
        repo.insert_instance(
            session, instance_id="i1", tenant="t", group_key="g", kind="knc", nonce="n1", now=NOW
        )
    # A restart migrates again: nothing changes, nothing is lost.
    with open_database(path) as database:
        database.migrate()
        with database.read_session() as session:
            assert repo.get_instance(session, "i1") is not None
        with database.engine.connect() as conn:
            assert current_revision(conn) == _head()
        assert _diff(database, Base.metadata) == []


def test_downgrade_to_base_and_upgrade_again(db: Database) -> None:
    with db.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    assert set(inspect(db.engine).get_table_names()) & TABLES == set()
    db.migrate()
    assert _diff(db, Base.metadata) == []


def test_migrations_ship_inside_the_package() -> None:
    path = Path(migrations_path())
    assert (path / "env.py").is_file()
    assert (path / "versions" / "__init__.py").is_file()
    script = ScriptDirectory.from_config(alembic_config())
    assert len(script.get_heads()) == 1
    assert script.get_base() == "0001"


@pytest.mark.parametrize(
    "moment",
    [
        NOW,
        datetime(2026, 3, 1, 17, 30, 0, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        datetime(2026, 3, 1, 7, 0, 0, 1, tzinfo=timezone(timedelta(hours=-5))),
    ],
)
def test_aware_datetimes_round_trip_as_utc(db: Database, moment: datetime) -> None:
    with db.session() as session:
        repo.insert_instance(
            session, instance_id="i1", tenant="t", group_key="g", kind="knc", nonce="n1", now=moment
        )
    with db.read_session() as session:
        created = session.scalars(select(Instance.created_at)).one()
    assert created == moment
    assert created.tzinfo is UTC
    assert created.utcoffset() == timedelta(0)
    assert created.microsecond == moment.microsecond


def test_naive_datetimes_are_refused(db: Database) -> None:
    with pytest.raises(StatementError, match="naive datetime"), db.session() as session:
        repo.insert_instance(
            session,
            instance_id="i1",
            tenant="t",
            group_key="g",
            kind="knc",
            nonce="n1",
            now=datetime(2026, 3, 1, 12, 0),  # naive: the point of the test
        )


def test_timestamps_compare_in_time_order_across_zones(db: Database) -> None:
    # Stored as fixed-width UTC text, so SQL comparisons follow real time, whatever zone came in.
    early = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    late_in_other_zone = datetime(2026, 3, 1, 8, 0, 1, tzinfo=timezone(timedelta(hours=-4)))
    with db.session() as session:
        repo.insert_instance(
            session,
            instance_id="a",
            tenant="t",
            group_key="g",
            kind="knc",
            nonce="na",
            now=late_in_other_zone,
        )
        repo.insert_instance(
            session, instance_id="b", tenant="t", group_key="g", kind="knc", nonce="nb", now=early
        )
    with db.read_session() as session:
        assert [row.id for row in repo.list_active_instances(session)] == ["b", "a"]
        later = session.scalars(select(Instance.id).where(Instance.created_at > early)).all()
    assert later == ["a"]
