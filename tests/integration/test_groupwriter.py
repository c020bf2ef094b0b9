"""Group edits of one server fold into one groups.jsonc write (real ConfigState, in-memory object store).

What a user notices: an operator that changes 100 pools at once gets every UpsertGroup done, none of
them failing on its own server's compare-and-swap retries, and a refused edit fails only its call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from nstance.config import GroupUpdate, apply_upsert
from nstance.config.loader import load_groups_text
from nstance.core.clock import ManualClock
from nstance.core.errors import InvalidArgument
from nstance.objectstore.memory import MemoryObjectStore
from nstance.server.state import groupwriter
from nstance.server.state.configstate import ConfigChange, ConfigState
from nstance.server.state.dynamic_groups import GROUPS_KEY, edit_dynamic_groups
from nstance.server.state.groupwriter import Edit, GroupsWriter
from nstance.testing.shardproc import server_addrs, shard_config
from nstance.testing.waiting import eventually


@pytest.fixture
def state(tmp_path: Path) -> tuple[MemoryObjectStore, ConfigState]:
    store = MemoryObjectStore()
    store.put("config.jsonc", json.dumps(shard_config(addrs=server_addrs())).encode())
    config = ConfigState(store, tmp_path / "config", clock=ManualClock())
    config.load()
    return store, config


def _upsert(config: ConfigState, group: str, size: int, template: str = "app") -> Edit:
    snapshot = config.snapshot()
    assert snapshot is not None
    return lambda current: apply_upsert(
        snapshot.config, current, "default", group, GroupUpdate(template=template, size=size)
    )


def _stored(store: MemoryObjectStore) -> dict[str, int]:
    groups = load_groups_text(store.get(GROUPS_KEY)[0].decode(), GROUPS_KEY)
    return {name: entry.size for name, entry in groups.get("default", {}).items() if entry.size is not None}


async def test_concurrent_upserts_fold_into_few_writes_and_all_land(
    state: tuple[MemoryObjectStore, ConfigState],
) -> None:
    store, config = state
    changes: list[ConfigChange] = []
    writer = GroupsWriter(store, config, changes.append)
    together = await asyncio.gather(*(writer.submit(_upsert(config, f"pool-{i}", i)) for i in range(40)))
    assert _stored(store) == {f"pool-{i}": i for i in range(40)}
    assert 1 <= writer.writes < 40
    # Each call is told how many edits its write held: n calls say n, once per write.
    assert sum(Fraction(1, n) for n in together) == writer.writes
    installed = config.snapshot()
    assert installed is not None
    assert {g for _, g in installed.group_keys()} >= {f"pool-{i}" for i in range(40)}
    assert set().union(*(c.changed for c in changes)) >= {("default", f"pool-{i}") for i in range(40)}


async def test_a_refused_edit_fails_only_its_own_call(state: tuple[MemoryObjectStore, ConfigState]) -> None:
    store, config = state
    writer = GroupsWriter(store, config, lambda _change: None)
    results = await asyncio.gather(
        writer.submit(_upsert(config, "good-1", 1)),
        writer.submit(_upsert(config, "bad", 1, template="no-such-template")),
        writer.submit(_upsert(config, "good-2", 2)),
        return_exceptions=True,
    )
    assert results[0] == 3  # one write held the three edits (the refused one included)
    assert isinstance(results[1], InvalidArgument)
    assert results[2] == 3
    assert _stored(store) == {"good-1": 1, "good-2": 2}


async def test_a_write_by_another_server_in_between_is_kept(
    state: tuple[MemoryObjectStore, ConfigState],
) -> None:
    store, config = state
    writer = GroupsWriter(store, config, lambda _change: None)
    await writer.submit(_upsert(config, "mine", 1))
    # Another server of the shard writes; this server's snapshot does not know that ETag yet.
    edit_dynamic_groups(store, _upsert(config, "theirs", 3))
    await writer.submit(_upsert(config, "mine", 2))
    assert _stored(store) == {"mine": 2, "theirs": 3}


async def test_edits_with_their_keys_reach_the_snapshot_and_then_the_disk_cache(
    state: tuple[MemoryObjectStore, ConfigState],
) -> None:
    # The writer names the group each edit changes (the snapshot update then compares nothing else)
    # and writes the disk cache after the callers were answered, not before.
    store, config = state
    changes: list[ConfigChange] = []
    writer = GroupsWriter(store, config, changes.append)
    await asyncio.gather(
        *(writer.submit(_upsert(config, f"pool-{i}", i + 1), ("default", f"pool-{i}")) for i in range(10))
    )
    assert set().union(*(c.changed for c in changes)) == {("default", f"pool-{i}") for i in range(10)}
    assert [config.merged("default", f"pool-{i}").size for i in range(10)] == list(range(1, 11))  # type: ignore[union-attr]

    def cached() -> dict[str, int]:
        document = json.loads(config.cache_path.read_text())
        groups = load_groups_text(document["groups"]["text"], "cache")
        return {name: entry.size or 0 for name, entry in groups.get("default", {}).items()}

    await eventually(lambda: cached() == _stored(store), within=10, what="the disk cache")
    assert json.loads(config.cache_path.read_text())["groups"]["etag"] == store.get(GROUPS_KEY)[1]


async def test_writes_in_quick_succession_share_one_disk_cache_rewrite(
    state: tuple[MemoryObjectStore, ConfigState], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cache is the whole document (a megabyte at 10,000 groups): it is rewritten once, after the
    # burst, with the last document, and not while the reconciles the edits started are running.
    store, config = state
    flushes: list[str | None] = []
    flush = config.flush_cache

    def counted() -> None:
        flush()
        flushes.append(json.loads(config.cache_path.read_text())["groups"]["etag"])

    monkeypatch.setattr(config, "flush_cache", counted)
    monkeypatch.setattr(groupwriter, "CACHE_FLUSH_DELAY_S", 2.0)  # ample for five in-memory writes
    writer = GroupsWriter(store, config, lambda _change: None)
    for i in range(5):
        await writer.submit(_upsert(config, "pool", i + 1), ("default", "pool"))
    assert flushes == []  # answered before any rewrite of the cache
    await eventually(lambda: len(flushes) >= 1, within=15, what="the disk cache rewrite")
    assert flushes == [store.get(GROUPS_KEY)[1]]
    await writer.submit(_upsert(config, "pool", 9), ("default", "pool"))  # a later write: one more
    await eventually(lambda: len(flushes) >= 2, within=15, what="the second rewrite")
    assert flushes == [flushes[0], store.get(GROUPS_KEY)[1]]


def test_an_edit_named_by_its_keys_is_compared_on_those_groups_only(
    state: tuple[MemoryObjectStore, ConfigState],
) -> None:
    # The writer tells edit_dynamic_groups which groups its edits touched: an edit that leaves them as
    # they were writes nothing, one that changes them writes, and a tenant the hint does not name is
    # compared in full.
    store, config = state
    edit_dynamic_groups(store, _upsert(config, "a", 1))
    base, etag = edit_dynamic_groups(store, _upsert(config, "b", 1))

    def hint_a(doc: dict[str, Any]) -> Callable[[], tuple[dict[str, Any], set[tuple[str, str]]]]:
        return lambda: (doc, {("default", "a")})

    after, etag_after = edit_dynamic_groups(
        store, _upsert(config, "a", 1), known=(base, etag), edited=hint_a(base)
    )
    assert (after, etag_after) == (base, etag)  # nothing written
    after, etag_after = edit_dynamic_groups(
        store, _upsert(config, "a", 2), known=(base, etag), edited=hint_a(base)
    )
    assert etag_after != etag
    assert _stored(store) == {"a": 2, "b": 1}
    # Another tenant's mapping, a new object equal to the old one: nothing to write.
    with_copy = {"default": after["default"], "other": {}}
    base2, etag2 = edit_dynamic_groups(store, lambda _c: with_copy, known=(after, etag_after))
    _, etag_same = edit_dynamic_groups(
        store, lambda c: {**c, "other": {}}, known=(base2, etag2), edited=hint_a(base2)
    )
    assert etag_same == etag2
    # The same tenant, now different: written although the hint named only default/a.
    moved = dict(base2["default"])
    changed, etag_changed = edit_dynamic_groups(
        store, lambda c: {**c, "other": moved}, known=(base2, etag2), edited=hint_a(base2)
    )
    assert etag_changed != etag2
    assert changed["other"] == moved
    # A tenant the hint does not name, equal but a new object, ahead of the named tenant whose group
    # changed: the change is written all the same.
    first = {"early": {}, **base2}
    base3, etag3 = edit_dynamic_groups(store, lambda _c: first, known=(base2, etag2))
    bump = _upsert(config, "a", 3)
    written, etag_bumped = edit_dynamic_groups(
        store, lambda c: {**bump(c), "early": {}}, known=(base3, etag3), edited=hint_a(base3)
    )
    assert list(written) == ["early", "default", "other"]
    assert etag_bumped != etag3
    assert _stored(store) == {"a": 3, "b": 1}


async def test_an_orderly_shutdown_writes_the_waiting_disk_copy_at_once(
    state: tuple[MemoryObjectStore, ConfigState], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, config = state
    monkeypatch.setattr(groupwriter, "CACHE_FLUSH_DELAY_S", 3600.0)  # only flush_now can write it
    writer = GroupsWriter(store, config, lambda _change: None)
    await writer.submit(_upsert(config, "pool", 4), ("default", "pool"))
    assert json.loads(config.cache_path.read_text())["groups"]["etag"] != store.get(GROUPS_KEY)[1]
    await writer.flush_now()
    assert json.loads(config.cache_path.read_text())["groups"]["etag"] == store.get(GROUPS_KEY)[1]
