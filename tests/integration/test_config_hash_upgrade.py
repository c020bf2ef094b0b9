"""An in-place upgrade from a version that hashed configs its own way rotates nothing and pushes nothing.

Earlier versions of this project computed the runtime and infra hashes over sorted-key JSON; they are
now upstream's bytes (``nstance.config.hashes``). A fleet created by an earlier version carries the
old infra hash in every instance row and record, and its agents report the old runtime hash. Both
still match the group when the config is the same; a real change of config still rotates.
(In-process leader on the sim provider, as in test_shard_cloud_features.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from test_shard_cloud_features import Harness

from nstance.config import GroupUpdate, MergedGroupConfig, infra_hash, legacy_infra_hash, legacy_runtime_hash
from nstance.core.plan import Reason
from nstance.server.agents.hub import FileReport, HealthReport
from nstance.server.reconcile.reconciler import Reconciler
from nstance.server.state import provisioning

pytestmark = pytest.mark.timeout(60)
FILES = {"app.env": {"kind": "env", "template": {"GREETING": "hello"}}}


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path, drain_timeout="5m", template_extra={"files": FILES})
    yield harness
    harness.db.close()


def _merged(h: Harness) -> MergedGroupConfig:
    merged = h.state.merged("default", "web")
    assert merged is not None
    return merged


async def test_instances_an_earlier_version_created_are_not_rotated_until_the_config_changes(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as earlier:  # the earlier version creates the group's instances
        earlier.setattr(provisioning, "infra_hash", legacy_infra_hash)
        await h.reconcile()
    rows = h.rows()
    assert len(rows) == 2
    legacy = legacy_infra_hash(_merged(h))
    assert {r.infra_config_hash for r in rows} == {legacy} != {infra_hash(_merged(h))}
    await h.report(*(r.id for r in rows))

    h.reconciler = Reconciler(h.ctx, h.shard.ops)  # the upgraded server
    await h.reconcile()
    assert [(r.id, r.drain_started_at) for r in h.rows()] == [(r.id, None) for r in rows]
    assert len(h.vms.requests) == 2

    await h.shard.upsert_group("default", "web", GroupUpdate(instance_type="bigger"))
    await h.reconcile()
    drained = [r for r in h.rows() if r.drain_started_at is not None]
    assert [r.drain_reason for r in drained] == [Reason.DRIFT]
    (replacement,) = [r for r in h.rows() if r.id not in {old.id for old in rows}]
    assert replacement.infra_config_hash == infra_hash(_merged(h))


async def test_an_agent_reporting_the_runtime_hash_an_earlier_version_pushed_gets_no_files(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await h.reconcile()
    iid = h.rows()[0].id
    pushes: list[str] = []

    def push(session: Any, merged: Any, desired: str, *, only: list[str] | None) -> Awaitable[None]:
        pushes.append(desired)  # called when the hub decides to push, before anything is sent

        async def nothing() -> None:
            return None

        return nothing()

    monkeypatch.setattr(h.shard.agents, "_push", push)

    async def report(config_hash: str) -> None:
        async def one() -> AsyncIterator[HealthReport]:
            files = {"app.env": FileReport(last_modified=datetime(2026, 1, 1))}
            yield HealthReport(instance_id=iid, count=1, files=files, config_hash=config_hash)

        await h.shard.agents.health(iid, one())

    await report(legacy_runtime_hash(_merged(h)))
    assert pushes == []
    await report("sha256:" + "0" * 64)  # any other hash: the files are pushed again
    assert len(pushes) == 1
