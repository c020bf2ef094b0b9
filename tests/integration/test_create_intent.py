"""A create's intent: the SQLite row and the pending record are both written before the provider call.

The two writes run at the same time (neither needs the other). Whichever fails, no VM is asked for:
a record the provider never saw is marked failed when the cache refused its row, and a row whose
record was not written is soft-deleted. The next reconcile creates the group's instances afresh.
(In-process leader on the sim provider, as in test_shard_cloud_features.)
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from test_shard_cloud_features import Harness

from nstance.core.errors import Unavailable
from nstance.objectstore.memory import MemoryObjectStore
from nstance.server.reconcile.create import Creator
from nstance.server.state import records

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.db.close()


async def _statuses(h: Harness) -> list[str]:
    await h.shard.ops.followups.flush()  # the provider's answer reaches the records after the burst
    found, problems = records.list_records(h.store)
    assert not problems
    return sorted(r.status for r in found)


async def test_a_batch_the_cache_refuses_asks_for_no_vm_and_marks_its_records_failed(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: Creator, rows: list[dict[str, Any]], now: datetime) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(Creator, "_insert_rows", refuse)
    await h.reconcile()
    assert h.vms.requests == []
    assert h.rows() == []
    assert await _statuses(h) == ["failed", "failed"]  # written at the same time as the refused rows
    assert not h.shard.ops.in_flight

    monkeypatch.undo()
    await h.reconcile()
    assert len(h.vms.requests) == 2
    assert len(h.rows()) == 2
    assert await _statuses(h) == ["failed", "failed", "running", "running"]


async def test_a_record_that_cannot_be_written_leaves_no_row_and_asks_for_no_vm(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = MemoryObjectStore.put_if_match

    def refuse_instances(self: MemoryObjectStore, key: str, data: bytes, etag: str | None) -> str:
        if "/instance/" in f"/{key}":
            raise Unavailable("object storage is unreachable")
        return original(self, key, data, etag)

    monkeypatch.setattr(MemoryObjectStore, "put_if_match", refuse_instances)
    await h.reconcile()
    assert h.vms.requests == []
    assert h.rows() == []  # written at the same time, then soft-deleted
    assert not h.shard.ops.in_flight

    monkeypatch.undo()
    await h.reconcile()
    assert len(h.vms.requests) == 2
    assert await _statuses(h) == ["running", "running"]
