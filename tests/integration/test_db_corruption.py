"""A corrupt SQLite cache is detected, moved aside (kept, never deleted) and replaced by an empty one,
at open and at run time; a running leader steps down, rebuilds from object storage and leads again."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from test_shard_gc import Harness

from nstance.db import repo
from nstance.db.engine import open_database
from nstance.db.quarantine import CacheCorrupt, check_file, is_corruption
from nstance.testing.waiting import eventually


def damage(path: Path) -> None:
    """Overwrite every page after the header page with junk (the way a bad disk or a stray write does)."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek(4096)
        f.write(b"\xa5" * (size - 4096))


def seeded(path: Path) -> None:
    with open_database(path) as db, db.session() as session:
        repo.upsert_group_hashes(
            session,
            tenant="t",
            group_key="g",
            runtime_config_hash="r",
            infra_config_hash="i",
            now=datetime.now(UTC),
        )


@pytest.mark.parametrize("kind", ["garbage", "damaged-pages"])
def test_opening_a_corrupt_cache_moves_it_aside_and_starts_empty(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "db" / "nstance.db"
    if kind == "garbage":
        path.parent.mkdir(parents=True)
        path.write_bytes(b"this is not a database\n" * 400)
    else:
        seeded(path)
        damage(path)
    assert check_file(path) is not None
    with open_database(path) as db, db.read_session() as session:
        assert repo.list_instances(session) == []
    kept = [
        p for p in path.parent.iterdir() if ".corrupt-" in p.name and not p.name.endswith(("-wal", "-shm"))
    ]
    assert len(kept) == 1  # the damaged file is kept for a person to look at
    assert check_file(path) is None


def test_a_healthy_cache_is_opened_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "nstance.db"
    seeded(path)
    assert check_file(path) is None
    open_database(path).close()
    assert [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name] == []


def test_locked_or_bad_json_is_not_corruption() -> None:
    assert not is_corruption(sqlite3.OperationalError("database is locked"))
    assert is_corruption(sqlite3.DatabaseError("database disk image is malformed"))
    conn = sqlite3.connect(":memory:")
    with pytest.raises(sqlite3.OperationalError) as bad_json:
        conn.execute("SELECT json_extract('{not json', '$.a')")
    assert "malformed" in str(bad_json.value)
    assert not is_corruption(bad_json.value)


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path, size=2)
    yield harness
    harness.db.close()


async def test_a_leader_whose_cache_goes_corrupt_steps_down_rebuilds_and_leads_again(
    h: Harness, tmp_path: Path
) -> None:
    await h.shard.start_leading()
    try:
        await eventually(lambda: len(h.live()) == 2 and all(r.provider_id for r in h.rows()))
        await h.shard.ops.followups.settled()
        before = {r.id: r.provider_id for r in h.rows()}
        path = tmp_path / "db" / "nstance.db"
        h.db.engine.dispose()
        damage(path)
        h.db.engine.dispose()
        with pytest.raises(CacheCorrupt, match=r"SQLite cache is corrupt.*retry"):
            h.rows()  # the API or a loop hits it first: UNAVAILABLE, retry
        await eventually(lambda: h.shard.cache_repair.repairs == 1, what="the cache repaired")
        # The hold is cleared once leading has restarted (after ``leading`` turns true): wait for both.
        await eventually(
            lambda: h.shard.leading and h.shard.ops.holds.summary() is None,
            what="leading again, hold cleared",
        )
        assert {r.id: r.provider_id for r in h.rows()} == before  # rebuilt from the records
        assert h.live() == {iid: pid for iid, pid in before.items() if pid}  # no VM touched
        assert any(".corrupt-" in p.name for p in path.parent.iterdir())
    finally:
        await h.shard.stop_leading()
