"""The shard's config snapshot on a real ``file://`` store, its disk cache, and dynamic-group CAS edits.

Uses the shipped ``examples/local`` documents under ``shard/local-a/`` exactly as a server sees them.
"""

from __future__ import annotations

import builtins
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest

from nstance.config.editing import GroupUpdate, apply_upsert
from nstance.config.errors import ConfigError
from nstance.config.loader import load_config_text, load_groups_text
from nstance.config.schema import DynamicGroups, ServerConfig
from nstance.core.clock import ManualClock
from nstance.core.errors import FailedPrecondition, NotFound, Unavailable
from nstance.objectstore.base import ObjectInfo, ObjectStore
from nstance.objectstore.file import FileObjectStore
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.server.state.configstate import ConfigState, GroupsVanished
from nstance.server.state.dynamic_groups import edit_dynamic_groups, read_dynamic_groups

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "local"
CONFIG_TEXT = (EXAMPLES / "config.jsonc").read_text()
GROUPS_TEXT = (EXAMPLES / "groups.jsonc").read_text()
APP = ("default", "app")


class CountingStore:
    """Passes every call through to the shard store, counting downloads; can be switched off."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.prefix = "shard/local-a/"
        self.gets = 0
        self.writes = 0
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise Unavailable("object storage: connection refused")

    def get(self, key: str) -> tuple[bytes, str]:
        self._check()
        self.gets += 1
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo:
        self._check()
        return self.inner.head(key)

    def put(self, key: str, data: bytes) -> str:
        self._check()
        return self.inner.put(key, data)

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        self._check()
        self.writes += 1
        return self.inner.put_if_match(key, data, etag)

    def delete(self, key: str, if_match: str | None = None) -> None:
        self._check()
        self.inner.delete(key, if_match)

    def list(self, prefix: str = "") -> builtins.list[str]:
        self._check()
        return self.inner.list(prefix)

    def exists(self, key: str) -> bool:
        self._check()
        return self.inner.exists(key)


@pytest.fixture
def shard(tmp_path: Path) -> ScopedObjectStore:
    store = ScopedObjectStore(FileObjectStore(tmp_path / "bucket"), "shard/local-a/")
    store.put("config.jsonc", CONFIG_TEXT.encode())
    store.put("groups.jsonc", GROUPS_TEXT.encode())
    return store


@pytest.fixture
def counting(shard: ScopedObjectStore) -> CountingStore:
    return CountingStore(shard)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def state(counting: CountingStore, tmp_path: Path, clock: ManualClock) -> ConfigState:
    return ConfigState(counting, tmp_path / "cache", clock=clock)


def put_groups(store: ObjectStore, groups: dict[str, object]) -> None:
    store.put("groups.jsonc", json.dumps(groups).encode())


def test_first_load_reads_storage_and_reports_every_group_as_changed(
    state: ConfigState, shard: ScopedObjectStore, clock: ManualClock
) -> None:
    change = state.load()

    assert change.source == "storage"
    assert change.updated
    assert change.changed == {APP}
    assert change.removed == set()
    assert change.prev_config_etag is None
    snap = state.snapshot()
    assert snap is not None
    assert snap.config.shard.id == "local-a"
    assert snap.dynamic == {}
    assert snap.config_etag == shard.head("config.jsonc").etag == change.config_etag
    assert snap.config_size == len(CONFIG_TEXT.encode())
    assert snap.config_last_modified is not None
    assert snap.loaded_at == clock.now()
    merged = state.merged(*APP)
    assert merged is not None
    assert (merged.size, merged.template, merged.subnet_pool) == (1, "app", "default")
    assert state.merged("default", "nope") is None
    assert state.group_keys() == [APP]
    assert state.last_error is None
    assert state.cache_path.exists()


def test_unchanged_documents_are_not_downloaded_or_parsed_again(
    state: ConfigState, counting: CountingStore
) -> None:
    state.load()
    before = state.snapshot()
    downloads = counting.gets

    change = state.load()

    assert not change.updated
    assert change.changed == set()
    assert change.removed == set()
    assert counting.gets == downloads
    assert state.snapshot() is before
    # force re-reads even so
    state.load(force=True)
    assert counting.gets > downloads


def test_size_change_added_group_and_removed_group_are_reported(
    state: ConfigState, shard: ScopedObjectStore
) -> None:
    state.load()

    put_groups(shard, {"default": {"app": {"template": "app", "size": 3}}})
    change = state.load()
    assert change.updated
    assert change.changed == {APP}
    merged = state.merged(*APP)
    assert merged is not None
    assert merged.size == 3

    put_groups(
        shard,
        {"default": {"app": {"template": "app", "size": 3}, "batch": {"template": "app", "size": 2}}},
    )
    change = state.load()
    assert change.changed == {("default", "batch")}
    assert change.removed == set()

    put_groups(shard, {"default": {"app": {"template": "app", "size": 3}}})
    change = state.load()
    assert change.changed == set()
    assert change.removed == {("default", "batch")}
    assert state.group_keys() == [APP]

    put_groups(shard, {})  # "{}" removes every dynamic group on purpose
    change = state.load()
    assert change.changed == {APP}  # back to the static size
    merged = state.merged(*APP)
    assert merged is not None
    assert merged.size == 1


@pytest.mark.parametrize("fault", ["deleted", "emptied", "blank"])
def test_a_groups_jsonc_that_vanishes_after_being_seen_is_refused_not_applied(
    state: ConfigState, shard: ScopedObjectStore, fault: str
) -> None:
    put_groups(shard, {"default": {"app": {"template": "app", "size": 3}}})
    state.load()
    if fault == "deleted":
        shard.delete("groups.jsonc")
    else:
        shard.put("groups.jsonc", b"" if fault == "emptied" else b" \n\n")
    for _ in range(2):  # the second check answers from the remembered failure, just the same
        with pytest.raises(GroupsVanished, match="non-empty before") as err:
            state.load()
        assert err.value.kind == ("missing" if fault == "deleted" else "empty")
        assert state.fault is not None
        assert state.fault.kind == err.value.kind
    merged = state.merged(*APP)
    assert merged is not None
    assert merged.size == 3


def test_a_restarted_server_remembers_from_its_cache_that_groups_jsonc_had_groups(
    state: ConfigState, shard: ScopedObjectStore, tmp_path: Path, clock: ManualClock
) -> None:
    put_groups(shard, {"default": {"app": {"template": "app", "size": 3}}})
    state.load()
    shard.delete("groups.jsonc")
    restarted = ConfigState(shard, state.cache_path.parent, clock=clock)
    with pytest.raises(GroupsVanished):
        restarted.load(True)
    assert restarted.snapshot() is None
    fresh = ConfigState(shard, tmp_path / "other-cache", clock=clock)
    assert fresh.load(True).groups_etag == ""  # a server that never saw groups takes "none" as it is


def test_config_edit_that_changes_no_group_updates_etag_but_marks_nothing_dirty(
    state: ConfigState, shard: ScopedObjectStore
) -> None:
    first = state.load()
    shard.put("config.jsonc", ("// reviewed\n" + CONFIG_TEXT).encode())
    change = state.load()
    assert change.updated
    assert change.prev_config_etag == first.config_etag
    assert change.config_etag != first.config_etag
    assert change.changed == set()


def test_invalid_config_keeps_the_previous_snapshot_and_reports_the_path(
    state: ConfigState, shard: ScopedObjectStore, counting: CountingStore
) -> None:
    state.load()
    good = state.snapshot()
    shard.put("config.jsonc", CONFIG_TEXT.replace('"kind": "app"', '"kind": "apps"').encode())

    with pytest.raises(ConfigError) as caught:
        state.load()

    message = str(caught.value)
    assert "shard/local-a/config.jsonc" in message
    assert "templates.app.kind" in message
    assert state.snapshot() is good
    assert state.last_error == message
    merged = state.merged(*APP)
    assert merged is not None  # the server keeps running on the last good config
    # Polling the same broken document raises the same error without parsing it again.
    downloads = counting.gets
    with pytest.raises(ConfigError):
        state.load()
    assert counting.gets == downloads

    shard.put("config.jsonc", CONFIG_TEXT.encode())
    change = state.load()
    assert state.last_error is None
    assert not change.updated  # same content, same ETag as the snapshot kept all along
    assert change.changed == set()


def test_dynamic_group_with_unknown_template_is_refused_with_its_path(
    state: ConfigState, shard: ScopedObjectStore
) -> None:
    state.load()
    put_groups(shard, {"default": {"ghost": {"template": "missing", "size": 1}}})
    with pytest.raises(ConfigError) as caught:
        state.load()
    assert "shard/local-a/groups.jsonc" in str(caught.value)
    assert "default.ghost" in str(caught.value)
    assert state.group_keys() == [APP]


def test_missing_config_is_not_found_with_its_location(state: ConfigState, shard: ScopedObjectStore) -> None:
    shard.delete("config.jsonc")
    with pytest.raises(NotFound, match=r"shard/local-a/config\.jsonc does not exist"):
        state.load()
    assert state.snapshot() is None
    assert state.last_error is not None


def test_storage_down_at_start_runs_from_the_disk_cache(
    state: ConfigState, counting: CountingStore, tmp_path: Path, clock: ManualClock
) -> None:
    put_groups(counting, {"default": {"batch": {"template": "app", "size": 2}}})
    state.load()
    written = state.snapshot()
    assert written is not None

    counting.down = True
    restarted = ConfigState(counting, tmp_path / "cache", clock=clock)
    change = restarted.load()

    assert change.source == "cache"
    assert change.changed == {APP, ("default", "batch")}
    assert restarted.fault is not None
    assert restarted.fault.kind == "unavailable"  # running on the copy is reported as degraded
    snap = restarted.snapshot()
    assert snap is not None
    assert snap.source == "cache"
    assert (snap.config_etag, snap.groups_etag) == (written.config_etag, written.groups_etag)
    assert snap.config_last_modified == written.config_last_modified
    merged = restarted.merged("default", "batch")
    assert merged is not None
    assert merged.size == 2

    # Storage comes back with the same documents: confirmed, nothing re-parsed or reported.
    counting.down = False
    change = restarted.load()
    assert change.source == "storage"
    assert not change.updated
    snap = restarted.snapshot()
    assert snap is not None
    assert snap.source == "storage"


def test_storage_down_while_running_keeps_the_current_snapshot(
    state: ConfigState, counting: CountingStore
) -> None:
    state.load()
    before = state.snapshot()
    counting.down = True
    change = state.load()
    assert change.source == "cache"
    assert not change.updated
    assert state.snapshot() is before
    assert state.fault is not None
    assert state.fault.kind == "unavailable"
    counting.down = False
    state.load()
    assert state.fault is None  # storage answers again: no longer degraded


def test_a_server_taking_leadership_never_settles_for_the_copy_it_holds(
    state: ConfigState, counting: CountingStore
) -> None:
    """Found by the simulation: a new leader that kept a stale snapshot acted on old group sizes."""
    state.load()
    before = state.snapshot()
    counting.down = True
    with pytest.raises(Unavailable, match="connection refused"):
        state.load(True, require_storage=True)
    assert state.snapshot() is before  # nothing half-installed; the caller retries


def test_storage_down_without_cache_is_unavailable(
    counting: CountingStore, tmp_path: Path, clock: ManualClock
) -> None:
    counting.down = True
    state = ConfigState(counting, tmp_path / "empty-cache", clock=clock)
    with pytest.raises(Unavailable, match="no cached copy"):
        state.load()
    assert state.snapshot() is None


def test_corrupt_cache_is_reported_not_trusted(
    state: ConfigState, counting: CountingStore, tmp_path: Path, clock: ManualClock
) -> None:
    state.load()
    state.cache_path.write_text("{ truncated")
    counting.down = True
    restarted = ConfigState(counting, tmp_path / "cache", clock=clock)
    with pytest.raises(Unavailable, match="unreadable"):
        restarted.load()


# -- dynamic groups ---------------------------------------------------------------------------


def config() -> ServerConfig:
    return load_config_text(CONFIG_TEXT)


def add_group(
    cfg: ServerConfig, tenant: str, group: str, size: int = 1
) -> Callable[[DynamicGroups], DynamicGroups]:
    def edit(dynamic: DynamicGroups) -> DynamicGroups:
        return apply_upsert(cfg, dynamic, tenant, group, GroupUpdate(template="app", size=size))

    return edit


def test_edit_creates_groups_jsonc_and_replace_dynamic_installs_it(
    state: ConfigState, shard: ScopedObjectStore, clock: ManualClock
) -> None:
    shard.delete("groups.jsonc")
    state.load()
    snap = state.snapshot()
    assert snap is not None

    dynamic, etag = edit_dynamic_groups(
        shard, lambda d: apply_upsert(snap.config, d, "default", "batch", GroupUpdate(template="app", size=2))
    )
    data, stored_etag = shard.get("groups.jsonc")
    assert stored_etag == etag
    assert load_groups_text(data.decode()) == dynamic

    clock.advance(timedelta(seconds=5))
    change = state.replace_dynamic(dynamic, etag)
    assert change.changed == {("default", "batch")}
    assert change.updated
    new = state.snapshot()
    assert new is not None
    assert new.groups_etag == etag
    assert new.loaded_at == clock.now()
    # The next poll sees our own write as unchanged.
    assert not state.load().updated
    # And a restart without storage finds the edited groups in the cache.
    unreachable = CountingStore(shard)
    unreachable.down = True
    restarted = ConfigState(unreachable, state.cache_path.parent, clock=clock)
    assert restarted.load().source == "cache"
    assert restarted.merged("default", "batch") is not None


def test_replace_dynamic_with_the_edited_keys_reports_the_same_change(
    state: ConfigState, shard: ScopedObjectStore
) -> None:
    state.load()
    snap = state.snapshot()
    assert snap is not None
    base = snap.dynamic
    edit = add_group(snap.config, "default", "batch", size=3)
    dynamic, etag = edit_dynamic_groups(shard, edit, known=(base, snap.groups_etag))
    # The writer knows which group its edit touched: the snapshot's other groups are not compared.
    change = state.replace_dynamic(dynamic, etag, edited=(base, {("default", "batch")}))
    assert change.changed == {("default", "batch")}
    assert change.removed == frozenset()
    merged = state.merged("default", "batch")
    assert merged is not None
    assert merged.size == 3
    # A hint about another document (the snapshot moved on since) is not trusted: every group is
    # compared, so a group removed by that other change is still reported.
    after = state.snapshot()
    assert after is not None
    gone = {t: {g: e for g, e in groups.items() if g != "batch"} for t, groups in after.dynamic.items()}
    bigger = apply_upsert(after.config, gone, "default", "other", GroupUpdate(template="app", size=1))
    _, etag = edit_dynamic_groups(shard, lambda _d: bigger, known=(after.dynamic, after.groups_etag))
    change = state.replace_dynamic(bigger, etag, edited=(base, {("default", "other")}))
    assert change.changed == {("default", "other")}
    assert change.removed == {("default", "batch")}
    assert state.merged("default", "batch") is None


def test_replace_dynamic_before_load_is_refused(tmp_path: Path, shard: ScopedObjectStore) -> None:
    state = ConfigState(shard, tmp_path / "c", clock=ManualClock())
    with pytest.raises(FailedPrecondition, match="not been loaded"):
        state.replace_dynamic({}, '"x"')


def test_concurrent_editors_lose_no_update(shard: ScopedObjectStore) -> None:
    cfg = config()
    rounds = 20
    start = threading.Barrier(2)

    def editor(tenant: str) -> None:
        start.wait()
        for i in range(rounds):
            # Each lost race means the other editor committed, so rounds+1 attempts always suffice.
            edit_dynamic_groups(shard, add_group(cfg, tenant, f"g{i}"), attempts=rounds + 1)

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(editor, tenant) for tenant in ("alpha", "beta")]
        for future in futures:
            future.result(timeout=60)

    stored, _ = read_dynamic_groups(shard)
    assert {tenant: sorted(groups) for tenant, groups in stored.items()} == {
        "alpha": sorted(f"g{i}" for i in range(rounds)),
        "beta": sorted(f"g{i}" for i in range(rounds)),
    }


class RacingStore(CountingStore):
    """Before each of the first ``races`` conditional writes of groups.jsonc, another editor commits."""

    def __init__(self, inner: ObjectStore, races: int) -> None:
        super().__init__(inner)
        self.races = races
        self.rival = 0

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        if self.races > 0:
            self.races -= 1
            self.rival += 1
            current, _ = read_dynamic_groups(self.inner)
            rival = apply_upsert(config(), current, "rival", f"r{self.rival}", GroupUpdate(template="app"))
            edit_dynamic_groups(self.inner, lambda _d: rival)
        return super().put_if_match(key, data, etag)


def test_conflicting_write_reruns_the_edit_on_fresh_data(shard: ScopedObjectStore) -> None:
    store = RacingStore(shard, races=2)
    seen: list[DynamicGroups] = []
    cfg = config()

    def edit(dynamic: DynamicGroups) -> DynamicGroups:
        seen.append(dynamic)
        return apply_upsert(cfg, dynamic, "default", "batch", GroupUpdate(template="app", size=4))

    result, _ = edit_dynamic_groups(store, edit)

    assert len(seen) == 3  # two lost races, then success
    assert sorted(seen[-1].get("rival", {})) == ["r1", "r2"]  # the last run saw both rival writes
    stored, _ = read_dynamic_groups(shard)
    assert stored == result
    assert sorted(stored["rival"]) == ["r1", "r2"]
    assert stored["default"]["batch"].size == 4


def test_editor_gives_up_after_repeated_conflicts(shard: ScopedObjectStore) -> None:
    store = RacingStore(shard, races=100)
    with pytest.raises(Unavailable, match=r"groups\.jsonc kept changing under us; retry"):
        edit_dynamic_groups(store, add_group(config(), "default", "batch"), attempts=3)


@pytest.mark.parametrize("exists", [True, False])
def test_refused_edit_writes_nothing(shard: ScopedObjectStore, exists: bool) -> None:
    cfg = config()
    if not exists:
        shard.delete("groups.jsonc")
    before = shard.get("groups.jsonc") if exists else None

    # "app" is a static group: its template cannot be changed through the API.
    with pytest.raises(FailedPrecondition, match='field "template" cannot be changed'):
        edit_dynamic_groups(
            shard, lambda d: apply_upsert(cfg, d, "default", "app", GroupUpdate(template="other"))
        )

    if exists:
        assert shard.get("groups.jsonc") == before
    else:
        assert not shard.exists("groups.jsonc")


def test_edit_that_changes_nothing_does_not_write(shard: ScopedObjectStore) -> None:
    store = CountingStore(shard)
    _, etag = edit_dynamic_groups(store, add_group(config(), "default", "batch"))
    assert store.writes == 1
    _, again = edit_dynamic_groups(store, lambda d: d)
    assert again == etag
    assert store.writes == 1


def test_a_stale_known_document_is_caught_by_the_conditional_write(shard: ScopedObjectStore) -> None:
    cfg = config()

    def add(name: str) -> Callable[[DynamicGroups], DynamicGroups]:
        return lambda d: apply_upsert(cfg, d, "default", name, GroupUpdate(template="app", size=1))

    first, first_etag = edit_dynamic_groups(shard, add("one"))
    # another server adds a group; our snapshot still holds the document before that write
    edit_dynamic_groups(shard, add("two"))
    result, _ = edit_dynamic_groups(shard, add("three"), known=(first, first_etag))
    assert sorted(result["default"]) == ["one", "three", "two"]  # nothing lost
    assert read_dynamic_groups(shard)[0] == result
    # a fresh guess is used as is: no read before the write
    reads: list[str] = []
    current, etag = read_dynamic_groups(shard)
    original_get = shard.get

    def counting_get(key: str) -> tuple[bytes, str]:
        reads.append(key)
        return original_get(key)

    shard.get = counting_get  # type: ignore[method-assign]
    edit_dynamic_groups(shard, add("four"), known=(current, etag))
    assert reads == []


def test_a_groups_jsonc_beyond_shard_limits_is_refused_with_its_path(
    state: ConfigState, shard: ScopedObjectStore
) -> None:
    put_groups(shard, {"default": {"app": {"template": "app", "size": 3}}})
    state.load()
    put_groups(shard, {"default": {"app": {"template": "app", "size": 2_147_483_648}}})
    with pytest.raises(ConfigError, match=r"default\.app\.size: 2147483648 is more than 10000"):
        state.load()
    merged = state.merged(*APP)
    assert merged is not None
    assert merged.size == 3
