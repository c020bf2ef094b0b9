"""Unreadable, empty or vanished shard config is an error to report, never a desired state.

In-process leader (real SQLite file, in-memory object store, sim provider) with the periodic ETag
check made fast: a ``groups.jsonc`` that is deleted or emptied after the server saw it with groups, or
a ``config.jsonc`` that turns to garbage, leaves every VM and the last good view in place, and is
reported on ``/health`` (through ``Degradations``), in ``nstance_config_loaded`` /
``nstance_degraded`` and on ``WatchErrors``; fixing the document clears all of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_shard_cloud_features import Harness

from nstance.config import GroupUpdate, apply_upsert
from nstance.core.errors import FailedPrecondition, InvalidArgument
from nstance.objectstore.base import ObjectNotFound
from nstance.server.leadership import session as session_module
from nstance.server.state.dynamic_groups import edit_dynamic_groups
from nstance.testing.waiting import eventually

BATCH = ("default", "batch")


def gauge(h: Harness, name: str, **labels: str) -> float | None:
    value = h.metrics.registry.get_sample_value(name, labels or None)
    return value


@pytest.fixture
def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setattr(session_module, "CONFIG_CHECK_INTERVAL", 0.05)
    harness = Harness(tmp_path, size=1)
    config = harness.state.snapshot().config  # type: ignore[union-attr]
    edit_dynamic_groups(
        harness.store,
        lambda current: apply_upsert(
            config, current, "default", "batch", GroupUpdate(template="app", size=2)
        ),
    )
    yield harness
    harness.db.close()


def degraded(h: Harness) -> str:
    return h.ctx.degraded.summary() or ""


@pytest.mark.parametrize("fault", ["deleted", "emptied"])
async def test_a_vanished_or_emptied_groups_file_keeps_every_vm_and_is_reported(
    h: Harness, fault: str
) -> None:
    good = h.store.get("groups.jsonc")[0]
    await h.shard.start_leading()
    try:
        await eventually(lambda: len(h.live()) == 3, within=10, what="web (1) and batch (2) created")
        assert gauge(h, "nstance_config_loaded") == 1
        if fault == "deleted":
            h.store.delete("groups.jsonc")
        else:
            h.store.put("groups.jsonc", b"")
        await eventually(lambda: "groups.jsonc" in degraded(h), within=10, what="the fault reported")
        kind = "missing" if fault == "deleted" else "empty"
        assert "keeping the last good" in degraded(h)
        assert gauge(h, "nstance_config_loaded") == 0
        assert gauge(h, "nstance_degraded", component="config", kind=kind) == 1
        errors = [e for e in h.errors if "groups.jsonc" in e.error]
        assert [e.tenant for e in errors] == ["default"]  # once, not at every 30-second check
        assert h.state.snapshot().merged(*BATCH) is not None  # type: ignore[union-attr]
        assert len(h.live()) == 3

        h.store.put("groups.jsonc", good)
        await eventually(lambda: degraded(h) == "", within=10, what="the fault cleared")
        assert gauge(h, "nstance_config_loaded") == 1
        assert gauge(h, "nstance_degraded", component="config", kind=kind) is None
        assert len(h.live()) == 3
    finally:
        await h.shard.stop_leading(grace=1)


async def test_garbage_in_config_jsonc_is_reported_and_the_last_good_config_kept(h: Harness) -> None:
    await h.shard.start_leading()
    try:
        await eventually(lambda: len(h.live()) == 3, within=10, what="web (1) and batch (2) created")
        h.store.put("config.jsonc", b"{ this is not json")
        await eventually(lambda: "config.jsonc" in degraded(h), within=10, what="the fault reported")
        assert gauge(h, "nstance_degraded", component="config", kind="invalid") == 1
        assert any("config.jsonc" in e.error for e in h.errors)
        with pytest.raises(InvalidArgument, match=r"config\.jsonc"):  # RefreshConfig answers with it too
            await h.shard.refresh_config()
        assert len(h.live()) == 3
    finally:
        await h.shard.stop_leading(grace=1)


async def test_an_upsert_after_groups_jsonc_vanished_does_not_recreate_it_from_nothing(h: Harness) -> None:
    await h.shard.start_leading()
    try:
        h.store.delete("groups.jsonc")
        with pytest.raises(FailedPrecondition, match="was deleted"):
            await h.shard.upsert_group("default", "other", GroupUpdate(template="app", size=1))
        with pytest.raises(ObjectNotFound):
            h.store.get("groups.jsonc")
        assert h.state.snapshot().merged(*BATCH) is not None  # type: ignore[union-attr]
    finally:
        await h.shard.stop_leading(grace=1)


async def test_refresh_reports_a_groups_change_the_periodic_check_applied_first(h: Harness) -> None:
    await h.shard.start_leading()
    try:
        before = h.state.snapshot().groups_etag  # type: ignore[union-attr]
        config = h.state.snapshot().config  # type: ignore[union-attr]
        edit_dynamic_groups(
            h.store, lambda current: apply_upsert(config, current, "default", "batch", GroupUpdate(size=3))
        )
        await eventually(
            lambda: h.state.snapshot().groups_etag != before,  # type: ignore[union-attr]
            within=10,
            what="the periodic check applying the change",
        )
        result = await h.shard.refresh_config()
        assert result.updated
        assert (await h.shard.refresh_config()).updated is False
        # The server's own writes are not news to the next RefreshConfig.
        await h.shard.upsert_group("default", "batch", GroupUpdate(size=1))
        assert (await h.shard.refresh_config()).updated is False
    finally:
        await h.shard.stop_leading(grace=1)


async def test_a_standby_reports_a_vanished_groups_file_too(h: Harness) -> None:
    h.leader.leading = False
    h.state.load(True)  # the standby saw the groups at start
    watching = asyncio.create_task(h.shard.standby_config_loop())
    try:
        h.store.delete("groups.jsonc")
        await eventually(lambda: "groups.jsonc" in degraded(h), within=10, what="the standby reporting")
        assert gauge(h, "nstance_degraded", component="config", kind="missing") == 1
        assert h.state.snapshot().merged(*BATCH) is not None  # type: ignore[union-attr]
        assert not h.vms.requests  # a standby never acts
    finally:
        watching.cancel()
