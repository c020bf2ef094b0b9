"""``nstance-admin config plan`` and ``cert revoke``/``list-revoked`` on file:// storage, and the server's
deny-list sync from ``revoked/`` into SQLite."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nstance.admin.cli import app
from nstance.config import infra_hash, load_config_text, merged_group
from nstance.core.clock import ManualClock
from nstance.core.errors import Unavailable
from nstance.core.ids import new_puid
from nstance.db import repo
from nstance.db.engine import Database, open_database
from nstance.objectstore.base import ObjectStore
from nstance.objectstore.file import FileObjectStore
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.server.identity.revocations import DenyList, revocation_loop, sync_revocations
from nstance.server.state import records

SHARD = "zone-a"
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CLEAN_ENV: dict[str, str | None] = {"NSTANCE_STORAGE": None, "NSTANCE_BUCKET": None}

ADDRS = {
    "health_addr": "127.0.0.1:8990",
    "election_addr": "127.0.0.1:8991",
    "registration_addr": "127.0.0.1:8992",
    "operator_addr": "127.0.0.1:8993",
    "agent_addr": "127.0.0.1:8994",
}
BASE_CONFIG: dict[str, Any] = {
    "cluster": {
        "id": "demo",
        "secrets": {
            "provider": "object-storage",
            "encryption_key": {"provider": "env", "source": "NSTANCE_ENCRYPTION_KEY"},
        },
    },
    "shard": {
        "id": SHARD,
        "infra": {"provider": "local", "region": "local", "zone": SHARD},
        "bind": ADDRS,
        "advertise": ADDRS,
        "subnet_pools": {"default": ["local-net"]},
    },
    "templates": {
        "app": {
            "kind": "app",
            "arch": "amd64",
            "subnet_pool": "default",
            "instance_type": "small",
            "vars": {"role": "demo"},
            "userdata": {"content": "#!/bin/sh\necho {{ .Vars.role }}\n"},
        },
    },
    "groups": {"default": {"web": {"template": "app", "size": 2}, "db": {"template": "app", "size": 1}}},
}


@dataclass
class Result:
    code: int
    out: str
    err: str


def run(*args: str) -> Result:
    result = CliRunner().invoke(app, list(args), env=CLEAN_ENV)
    assert "Traceback" not in result.stderr
    return Result(result.exit_code, result.stdout, result.stderr)


def flags(bucket: Path) -> list[str]:
    """Storage flags for ``bucket``, made as `cluster init` would (the admin creates no other bucket)."""
    bucket.mkdir(parents=True, exist_ok=True)
    return ["--storage-provider", "file", "--storage-bucket", str(bucket)]


def shard_store(bucket: Path, shard: str = SHARD) -> ObjectStore:
    return ScopedObjectStore(FileObjectStore(bucket), f"shard/{shard}/")


def cluster_store(bucket: Path) -> ObjectStore:
    return ScopedObjectStore(FileObjectStore(bucket), "cluster/")


def write_file(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path


def snapshot(bucket: Path) -> dict[str, bytes]:
    return {str(p.relative_to(bucket)): p.read_bytes() for p in sorted(bucket.rglob("*")) if p.is_file()}


@pytest.fixture
def bucket(tmp_path: Path) -> Path:
    """A shard with the base config stored and three records of ``default/web``: two running, one failed."""
    root = tmp_path / "bucket"
    store = shard_store(root)
    text = json.dumps(BASE_CONFIG)
    store.put("config.jsonc", text.encode())
    config = load_config_text(text)
    current = infra_hash(merged_group(config, {}, "default", "web"))
    for status in ("running", "running", "failed"):
        record = records.InstanceRecord(
            instance_id=str(new_puid("app")),
            tenant="default",
            group="web",
            created_at=NOW,
            last_updated=NOW,
            status=status,
            infra_config_hash=current,
        )
        records.write_record(store, record)
    return root


def changed(**template: Any) -> dict[str, Any]:
    config = copy.deepcopy(BASE_CONFIG)
    config["templates"]["app"].update(template)
    return config


def plan_lines(out: str) -> dict[str, str]:
    """GROUP -> PLAN column of the table output."""
    lines = [line for line in out.splitlines() if line.startswith(SHARD)]
    return {line.split()[2]: line.split(None, 4)[4] for line in lines}


# --- config plan -----------------------------------------------------------------------------------


def test_var_change_pushes_files_only(bucket: Path, tmp_path: Path) -> None:
    before = snapshot(bucket)
    new = write_file(tmp_path / "new.jsonc", changed(vars={"role": "prod"}))
    result = run("config", "plan", str(new), *flags(bucket))
    assert result.code == 0, result.err
    plans = plan_lines(result.out)
    assert plans["web"] == "push files to 2 instances"
    assert plans["db"] == "push files to 0 instances"
    assert "rotate" not in result.out.split("\n\n")[0]
    assert "0 instances rotated" in result.out
    assert snapshot(bucket) == before  # a plan writes nothing


def test_instance_type_change_rotates_the_running_instances(bucket: Path, tmp_path: Path) -> None:
    new = write_file(tmp_path / "new.jsonc", changed(instance_type="large"))
    result = run("config", "plan", str(new), "--shard", SHARD, *flags(bucket))
    assert result.code == 0, result.err
    plans = plan_lines(result.out)
    assert plans["web"] == "rotate 2 instances"  # the failed one is not rotated
    assert plans["db"] == "rotate 0 instances"

    result = run("config", "plan", str(new), "-o", "json", *flags(bucket))
    rows = {row["group"]: row for row in json.loads(result.out)}
    assert rows["web"]["changes"] == ["rotate"]
    assert rows["web"]["rotate"] == 2
    assert rows["web"]["shard"] == SHARD


def test_resize_new_and_removed_groups(bucket: Path, tmp_path: Path) -> None:
    config = copy.deepcopy(BASE_CONFIG)
    config["groups"]["default"] = {
        "db": {"template": "app", "size": 3},
        "cache": {"template": "app", "size": 4},
    }
    new = write_file(tmp_path / "new.jsonc", config)
    result = run("config", "plan", str(new), *flags(bucket))
    assert result.code == 0, result.err
    plans = plan_lines(result.out)
    assert plans == {
        "cache": "new group (size 4)",
        "db": "resize 1→3",
        "web": "removed group (2 instances deleted)",
    }


def test_invalid_file_names_the_json_path_and_writes_nothing(bucket: Path, tmp_path: Path) -> None:
    before = snapshot(bucket)
    new = write_file(tmp_path / "bad.jsonc", changed(kind="TOO-LONG"))
    result = run("config", "plan", str(new), *flags(bucket))
    assert result.code == 1
    assert "templates.app.kind" in result.err
    assert "nothing was planned" in result.err
    assert result.out == ""
    assert snapshot(bucket) == before


def test_new_config_that_breaks_a_dynamic_group_is_refused(bucket: Path, tmp_path: Path) -> None:
    shard_store(bucket).put("groups.jsonc", b'{"team-b": {"batch": {"template": "gpu", "size": 1}}}')
    new = write_file(tmp_path / "new.jsonc", changed(vars={"role": "x"}))
    result = run("config", "plan", str(new), *flags(bucket))
    assert result.code == 1
    assert "team-b.batch" in result.err
    assert '"gpu" is not defined' in result.err


def test_first_config_of_a_shard_and_all_shards(bucket: Path, tmp_path: Path) -> None:
    other = shard_store(bucket, "zone-b")
    other.put("config.jsonc", json.dumps(changed(instance_type="large")).encode())
    new = write_file(tmp_path / "new.jsonc", BASE_CONFIG)
    result = run("config", "plan", str(new), "--all-shards", "-o", "json", *flags(bucket))
    assert result.code == 0, result.err
    by_shard = {(row["shard"], row["group"]): row["summary"] for row in json.loads(result.out)}
    assert by_shard[(SHARD, "web")] == "unchanged"
    assert by_shard[("zone-b", "web")] == "rotate 0 instances"

    result = run("config", "plan", str(new), "--shard", "zone-c", *flags(bucket))
    assert result.code == 0
    assert "every group is new" in result.err
    assert "new group (size 2)" in result.out


def test_corrupt_record_is_reported_and_skipped(bucket: Path, tmp_path: Path) -> None:
    shard_store(bucket).put("instance/default.broken.json", b"{not json")
    new = write_file(tmp_path / "new.jsonc", changed(instance_type="large"))
    result = run("config", "plan", str(new), *flags(bucket))
    assert result.code == 0
    assert "warning: skipped instance record instance/default.broken.json" in result.err
    assert plan_lines(result.out)["web"] == "rotate 2 instances"


# --- cert revoke / list-revoked --------------------------------------------------------------------


def test_revoke_writes_the_entry_once(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    result = run("cert", "revoke", "0x3F:0A", "--reason", "laptop stolen", *flags(bucket))
    assert result.code == 0, result.err
    assert "revoked certificate serial 3f0a" in result.out
    entry = json.loads((bucket / "cluster" / "revoked" / "3f0a.json").read_text())
    assert entry["serial"] == "3f0a"
    assert entry["reason"] == "laptop stolen"
    assert datetime.fromisoformat(entry["revoked_at"]).tzinfo is not None

    again = run("cert", "revoke", "3f0a", "--reason", "other", *flags(bucket))
    assert again.code == 0
    assert "already revoked" in again.out
    assert "laptop stolen" in again.out
    assert json.loads((bucket / "cluster" / "revoked" / "3f0a.json").read_text()) == entry

    decimal = run("cert", "revoke", "16138", "--decimal", *flags(bucket))  # 16138 == 0x3f0a
    assert "already revoked" in decimal.out

    listed = run("cert", "list-revoked", "-o", "json", *flags(bucket))
    assert json.loads(listed.out) == [entry]
    table = run("cert", "list-revoked", *flags(bucket))
    assert "3f0a" in table.out
    assert "laptop stolen" in table.out


@pytest.mark.parametrize(
    ("args", "message"), [(["xyz"], "not hexadecimal"), (["12a", "--decimal"], "decimal")]
)
def test_revoke_refuses_a_bad_serial(tmp_path: Path, args: list[str], message: str) -> None:
    bucket = tmp_path / "bucket"
    result = run("cert", "revoke", *args, *flags(bucket))
    assert result.code == 1
    assert message in result.err
    assert not bucket.exists() or not list(bucket.rglob("*.json"))


# --- server: deny-list sync ------------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_database(tmp_path / "db" / "nstance.db")
    yield database
    database.close()


async def test_sync_puts_revoked_serials_into_sqlite(
    tmp_path: Path, db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = tmp_path / "bucket"
    assert run("cert", "revoke", "ab:cd", *flags(bucket)).code == 0
    assert run("cert", "revoke", "1234", "--reason", "rotated", *flags(bucket)).code == 0
    store = cluster_store(bucket)
    # Corrupt entries fail closed: every serial they name is revoked, with a warning.
    store.put("revoked/beef.json", b"not json")
    store.put("revoked/cafe.json", b'{"serial": "f00d"}')
    store.put("revoked/dead.json", b"")
    store.put("revoked/not-a-serial.json", b'{"serial": "0bad"}')
    store.put("revoked/junk.json", b"junk")
    clock = ManualClock(NOW)
    deny = DenyList()

    with caplog.at_level(logging.WARNING, logger="nstance.server.identity.revocations"):
        assert await sync_revocations(store, db, clock=clock, deny=deny) == 7
    warnings = " ".join(r.getMessage() for r in caplog.records)
    assert "revoking beef anyway (fail closed)" in warnings
    assert "revoking cafe, f00d anyway (fail closed)" in warnings
    assert "skipped deny-list object revoked/junk.json" in warnings
    with db.read_session() as session:
        assert repo.revoked_serials(session) == {"abcd", "1234", "beef", "cafe", "f00d", "dead", "bad"}
    # What the auth interceptor asks: any spelling of a listed serial, nothing else.
    assert all(deny.revoked(spelling) for spelling in ("ABCD", "0x1234", "00:f0:0d", "bad"))
    assert not deny.revoked("99")

    assert await sync_revocations(store, db, clock=clock, deny=deny) == 0
    assert run("cert", "revoke", "99", *flags(bucket)).code == 0
    assert not deny.revoked("99")  # until the next pass
    assert await sync_revocations(store, db, clock=clock, deny=deny) == 1
    assert all(deny.revoked(serial) for serial in ("99", "abcd"))


class FlakyStore(ScopedObjectStore):
    """Fails the first listing, as an unreachable bucket would."""

    failures = 1

    def list(self, prefix: str = "") -> list[str]:
        if self.failures:
            self.failures -= 1
            raise Unavailable("storage is down")
        return super().list(prefix)


async def test_loop_survives_a_storage_error_and_picks_up_later_revocations(
    tmp_path: Path, db: Database
) -> None:
    bucket = tmp_path / "bucket"
    store = FlakyStore(FileObjectStore(bucket), "cluster/")
    assert run("cert", "revoke", "aa", *flags(bucket)).code == 0
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            assert run("cert", "revoke", "bb", *flags(bucket)).code == 0
        if len(sleeps) == 3:
            raise asyncio.CancelledError

    deny = DenyList()
    with pytest.raises(asyncio.CancelledError):
        await revocation_loop(store, db, clock=ManualClock(NOW), interval=30.0, sleep=fake_sleep, deny=deny)
    assert sleeps == [30.0, 30.0, 30.0]
    with db.read_session() as session:
        assert repo.revoked_serials(session) == {"aa", "bb"}
    assert all(deny.revoked(serial) for serial in ("aa", "bb"))
