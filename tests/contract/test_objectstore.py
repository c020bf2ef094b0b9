"""Contract suite for ObjectStore: the same behaviours on memory://, file:// and s3:// (moto_server).

Leader election and every compare-and-swap in Nstance rely on these semantics, so each backend must
show them identically, including under contention (16 threads racing one key, N processes racing one
file). Backend-specific tests (crash leftovers, retries on 409/503) follow the shared ones.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from nstance.core.errors import InvalidArgument, NotFound, Unavailable
from nstance.objectstore.base import (
    Conflict,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    Throttled,
)
from nstance.objectstore.factory import open_scopes, open_store
from nstance.objectstore.file import KNOWN_KEYS, KNOWN_MIN_BYTES, LOCK_STRIPES, READ_CHUNK, FileObjectStore
from nstance.objectstore.memory import MemoryObjectStore, content_etag
from nstance.objectstore.s3 import S3ObjectStore
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.testing.gofilestore import GoFileStorage
from nstance.testing.motoserver import MotoServer

REPO_ROOT = Path(__file__).resolve().parents[2]
RACERS = 16
ROUNDS = {"memory": 10, "file": 10, "s3": 5, "gcs": 5}
MISSING_ETAG = '"00000000000000000000000000000000"'

S3StoreFactory = Callable[..., S3ObjectStore]


def _make_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> ObjectStore:
    if kind == "memory":
        return MemoryObjectStore()
    if kind == "file":
        return FileObjectStore(tmp_path / "store")
    if kind == "gcs":
        make_gcs: Callable[[], ObjectStore] = request.getfixturevalue("gcs_store_factory")
        return make_gcs()
    factory: S3StoreFactory = request.getfixturevalue("s3_store_factory")
    return factory()


@pytest.fixture(params=["memory", "file", "s3", "gcs"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> ObjectStore:
    return _make_store(backend, tmp_path, request)


@pytest.fixture(params=["file", "s3", "gcs"])
def strict_store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """Backends that police keys (memory accepts any string)."""
    return _make_store(str(request.param), tmp_path, request)


# --------------------------------------------------------------------------------------------------
# Shared behaviours
# --------------------------------------------------------------------------------------------------


def test_missing_object_is_not_found(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound):
        store.get("shard/a/leader.json")
    with pytest.raises(ObjectNotFound):
        store.head("shard/a/leader.json")
    assert not store.exists("shard/a/leader.json")


def test_put_get_round_trip_and_etag_follows_content(store: ObjectStore) -> None:
    first = store.put("cluster/ca.crt", b"one")
    assert store.get("cluster/ca.crt") == (b"one", first)
    assert first.startswith('"')
    assert first.endswith('"')

    second = store.put("cluster/ca.crt", b"two")
    assert second != first
    assert store.get("cluster/ca.crt") == (b"two", second)


@pytest.mark.parametrize("payload", [b"", bytes(range(256)) * 40], ids=["empty", "binary-10k"])
def test_arbitrary_bytes_round_trip(store: ObjectStore, payload: bytes) -> None:
    etag = store.put("blob", payload)
    assert store.get("blob") == (payload, etag)
    assert store.head("blob").size == len(payload)


def test_create_only_once(store: ObjectStore) -> None:
    etag = store.put_if_match("shard/a/leader.json", b"first", None)
    with pytest.raises(PreconditionFailed):
        store.put_if_match("shard/a/leader.json", b"second", None)
    assert store.get("shard/a/leader.json") == (b"first", etag)


def test_stale_etag_is_refused_and_data_unchanged(store: ObjectStore) -> None:
    e1 = store.put("groups.jsonc", b"v1")
    e2 = store.put_if_match("groups.jsonc", b"v2", e1)
    with pytest.raises(PreconditionFailed):
        store.put_if_match("groups.jsonc", b"v3", e1)
    assert store.get("groups.jsonc") == (b"v2", e2)

    e4 = store.put_if_match("groups.jsonc", b"v4", e2)
    assert store.get("groups.jsonc") == (b"v4", e4)


def test_if_match_on_missing_key_fails(store: ObjectStore) -> None:
    with pytest.raises(PreconditionFailed):
        store.put_if_match("nothing-here", b"x", MISSING_ETAG)
    assert not store.exists("nothing-here")


def test_unconditional_delete(store: ObjectStore) -> None:
    store.delete("never-existed")  # not an error
    store.put("k", b"v")
    store.delete("k")
    assert not store.exists("k")
    store.delete("k")


def test_conditional_delete(store: ObjectStore) -> None:
    etag = store.put("lease", b"mine")
    with pytest.raises(PreconditionFailed):
        store.delete("lease", if_match=content_etag(b"someone else's"))
    assert store.get("lease") == (b"mine", etag)

    store.delete("lease", if_match=etag)
    assert not store.exists("lease")
    with pytest.raises(ObjectNotFound):
        store.delete("lease", if_match=etag)


def test_list_is_sorted_and_filtered_by_prefix(store: ObjectStore) -> None:
    keys = [
        "shard/b/leader.json",
        "shard/a/instance/t1.02.json",
        "cluster/ca.crt",
        "shard/a/leader.json",
        "shard/ab",
        "shard/a/instance/t1.01.json",
    ]
    for key in keys:
        store.put(key, key.encode())

    assert store.list() == sorted(keys)
    assert store.list("shard/a/") == [
        "shard/a/instance/t1.01.json",
        "shard/a/instance/t1.02.json",
        "shard/a/leader.json",
    ]
    assert store.list("shard/a/instance/t1.0") == [
        "shard/a/instance/t1.01.json",
        "shard/a/instance/t1.02.json",
    ]
    assert store.list("shard/a") == [
        "shard/a/instance/t1.01.json",
        "shard/a/instance/t1.02.json",
        "shard/a/leader.json",
        "shard/ab",
    ]
    assert store.list("nope/") == []


def test_head_reports_size_etag_and_time(store: ObjectStore) -> None:
    etag = store.put("shard/a/config.jsonc", b"{ }\n")
    info = store.head("shard/a/config.jsonc")
    assert info.key == "shard/a/config.jsonc"
    assert info.size == 4
    assert info.etag == etag
    assert info.last_modified.utcoffset() == timedelta(0)
    assert abs(info.last_modified - datetime.now(UTC)) < timedelta(minutes=5)


def test_exists(store: ObjectStore) -> None:
    assert not store.exists("a/b")
    store.put("a/b", b"")
    assert store.exists("a/b")
    assert not store.exists("a")  # a prefix is not an object


def test_scoped_views_are_isolated(store: ObjectStore) -> None:
    shard_a = ScopedObjectStore(store, "shard/a/")
    shard_b = ScopedObjectStore(store, "shard/b")  # trailing slash added
    assert shard_b.prefix == "shard/b/"

    etag_a = shard_a.put_if_match("leader.json", b"A", None)
    shard_b.put("leader.json", b"B")
    shard_a.put("instance/t.1.json", b"i")

    assert shard_a.get("leader.json") == (b"A", etag_a)
    assert shard_b.get("leader.json")[0] == b"B"
    assert store.get("shard/a/leader.json") == (b"A", etag_a)
    assert shard_a.list() == ["instance/t.1.json", "leader.json"]
    assert shard_a.list("inst") == ["instance/t.1.json"]
    assert shard_b.list() == ["leader.json"]
    assert store.list() == ["shard/a/instance/t.1.json", "shard/a/leader.json", "shard/b/leader.json"]
    assert shard_a.head("leader.json").key == "leader.json"

    with pytest.raises(PreconditionFailed):
        shard_a.put_if_match("leader.json", b"again", None)
    shard_b.delete("leader.json")
    assert shard_a.exists("leader.json")
    assert not shard_b.exists("leader.json")


def _race(store: ObjectStore, key: str, etag: str | None) -> tuple[list[int], list[int], list[Exception]]:
    """RACERS threads released together by a barrier; each tries put_if_match(key, own data, etag)."""
    barrier = threading.Barrier(RACERS)
    winners: list[int] = []
    losers: list[int] = []
    errors: list[Exception] = []
    lock = threading.Lock()

    def racer(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            store.put_if_match(key, f"writer-{i}".encode(), etag)
        except PreconditionFailed:
            with lock:
                losers.append(i)
        except Exception as exc:  # noqa: BLE001 (collected; the test asserts there are none)
            with lock:
                errors.append(exc)
        else:
            with lock:
                winners.append(i)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return winners, losers, errors


def test_race_on_if_match_has_exactly_one_winner(store: ObjectStore, backend: str) -> None:
    for round_ in range(ROUNDS[backend]):
        key = f"race/if-match-{round_}"
        start = store.put(key, b"start")
        winners, losers, errors = _race(store, key, start)
        assert errors == []
        assert len(winners) == 1, f"round {round_}: winners {winners}"
        assert len(losers) == RACERS - 1
        assert store.get(key)[0] == f"writer-{winners[0]}".encode()


def test_race_on_create_has_exactly_one_winner(store: ObjectStore, backend: str) -> None:
    for round_ in range(ROUNDS[backend]):
        key = f"race/create-{round_}"
        winners, losers, errors = _race(store, key, None)
        assert errors == []
        assert len(winners) == 1, f"round {round_}: winners {winners}"
        assert len(losers) == RACERS - 1
        assert store.get(key)[0] == f"writer-{winners[0]}".encode()


BAD_KEYS = [
    "",
    "/etc/passwd",
    "../outside",
    "a/../../outside",
    "a/./b",
    "a//b",
    "a/",
    "a\\b",
    "a\x00b",
    ".nstance-locks/x",
    "x" * 1025,
]


@pytest.mark.parametrize("key", BAD_KEYS, ids=lambda k: repr(k)[:24])
def test_unportable_keys_are_refused(strict_store: ObjectStore, key: str) -> None:
    calls: list[Callable[[], object]] = [
        lambda: strict_store.get(key),
        lambda: strict_store.head(key),
        lambda: strict_store.put(key, b"x"),
        lambda: strict_store.put_if_match(key, b"x", None),
        lambda: strict_store.delete(key),
        lambda: strict_store.exists(key),
    ]
    for call in calls:
        with pytest.raises(InvalidArgument):
            call()
    assert strict_store.list() == []


# --------------------------------------------------------------------------------------------------
# file:// specifics
# --------------------------------------------------------------------------------------------------

_RACE_CHILD = textwrap.dedent(
    """
    import sys, time
    from nstance.objectstore.base import PreconditionFailed
    from nstance.objectstore.file import FileObjectStore

    store = FileObjectStore(sys.argv[1])
    me = sys.argv[2]
    print("ready", flush=True)
    for line in sys.stdin:
        key, etag, start_at = line.split()
        time.sleep(max(0.0, float(start_at) - time.time()))
        try:
            store.put_if_match(key, me.encode(), None if etag == "-" else etag)
        except PreconditionFailed:
            print("lost", flush=True)
        else:
            print("won", flush=True)
    """
)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    return env


def test_file_conditional_writes_hold_across_processes(tmp_path: Path) -> None:
    processes, rounds = 8, 6
    root = tmp_path / "shared"
    store = FileObjectStore(root)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE_CHILD, str(root), f"proc-{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_child_env(),
            cwd=REPO_ROOT,
        )
        for i in range(processes)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        for round_ in range(rounds):
            key = f"race/{round_}"
            etag = "-" if round_ % 2 == 0 else store.put(key, b"start")
            start_at = time.time() + 0.15
            for p in procs:
                assert p.stdin is not None
                p.stdin.write(f"{key} {etag} {start_at}\n")
                p.stdin.flush()
            results = [p.stdout.readline().strip() for p in procs if p.stdout is not None]
            assert sorted(results) == ["lost"] * (processes - 1) + ["won"], f"round {round_}: {results}"
            assert store.get(key)[0] == f"proc-{results.index('won')}".encode()
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in procs:
            p.wait(timeout=30)
            if p.stdout is not None:
                p.stdout.close()
    assert [p.returncode for p in procs] == [0] * processes


_MIXED_CHILD = textwrap.dedent(
    """
    import json, sys, time
    from nstance.objectstore.base import ObjectNotFound, PreconditionFailed
    from nstance.objectstore.file import FileObjectStore
    from nstance.testing.gofilestore import GoFileStorage, GoPreconditionFailed

    root, side, keys, updates = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if side == "go":
        store = GoFileStorage(root)
        create_etag, lost = "", GoPreconditionFailed
    else:
        store = FileObjectStore(root)
        create_etag, lost = None, PreconditionFailed
    print("ready", flush=True)

    assert sys.stdin.readline().strip() == "create"
    won = []
    for k in range(keys):
        try:
            store.put_if_match(f"race/create/{k}", side.encode(), create_etag)
        except lost:
            continue
        won.append(k)
    print(json.dumps(won), flush=True)

    # Each side keeps updating until it has won `updates` times, at least once on top of a version the
    # other side wrote. A fixed number of attempts can all be lost when the scheduler runs the other
    # side through a whole stretch of them; this ends once the two have interleaved, whatever the order.
    assert sys.stdin.readline().strip() == "update"
    other = "go" if side == "ours" else "ours"
    chain, i, deadline = [], 0, time.monotonic() + 30
    while time.monotonic() < deadline:
        if len(chain) >= updates and any(before.startswith(other) for before, _ in chain):
            break
        current, etag = store.get("race/chain")
        new, i = f"{side}-{i}".encode(), i + 1
        try:
            store.put_if_match("race/chain", new, etag)
        except lost:
            continue
        chain.append([current.decode(), new.decode()])
    print(json.dumps(chain), flush=True)
    """
)


def test_file_conditional_writes_exclude_a_go_server_on_the_same_directory(tmp_path: Path) -> None:
    """Our store and a process doing what upstream's Go server does race on create-only and on
    compare-and-swap updates of the same keys: every key has exactly one creator, and no two updates
    succeed from the same version. Each side names the directory differently (a symlink, a ``..``)."""
    keys, updates = 150, 100
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "link").symlink_to(data)
    FileObjectStore(data).put("race/chain", b"start")
    roots = {"ours": str(tmp_path / "link"), "go": str(tmp_path / "data" / ".." / "data")}
    procs = {
        side: subprocess.Popen(
            [sys.executable, "-c", _MIXED_CHILD, root, side, str(keys), str(updates)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_child_env(),
            cwd=REPO_ROOT,
        )
        for side, root in roots.items()
    }

    def phase(command: str) -> dict[str, Any]:
        for p in procs.values():
            assert p.stdin is not None
            p.stdin.write(command + "\n")
            p.stdin.flush()
        out = {}
        for side, p in procs.items():
            assert p.stdout is not None
            out[side] = json.loads(p.stdout.readline())
        return out

    try:
        for p in procs.values():
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        created = phase("create")
        chains = phase("update")
    finally:
        for p in procs.values():
            if p.stdin is not None:
                p.stdin.close()
        for p in procs.values():
            p.wait(timeout=60)
            if p.stdout is not None:
                p.stdout.close()
    assert [p.returncode for p in procs.values()] == [0, 0]

    both = set(created["ours"]) & set(created["go"])
    assert not both, f"keys created by both sides: {sorted(both)}"
    assert sorted(created["ours"] + created["go"]) == list(range(keys))
    store = FileObjectStore(data)
    for side, won in created.items():
        for k in won:
            assert store.get(f"race/create/{k}")[0] == side.encode()

    steps = chains["ours"] + chains["go"]
    successors: dict[str, list[str]] = {}
    for before, after in steps:
        successors.setdefault(before, []).append(after)
    forks = {before: after for before, after in successors.items() if len(after) > 1}
    assert not forks, f"{len(forks)} versions were each updated twice, e.g. {list(forks.items())[:3]}"
    version, seen = "start", 0
    while version in successors:
        version, seen = successors[version][0], seen + 1
    assert seen == len(steps)
    assert store.get("race/chain")[0] == version.encode()
    for side, other in (("ours", "go"), ("go", "ours")):
        on_top = [after for before, after in chains[side] if before.startswith(other)]
        assert on_top, f"{side} never won an update on top of a version {other} wrote: they did not race"


def test_file_writes_hold_upstreams_lock_on_the_normalised_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While our store publishes, upstream's lock file for the key (named from the real path of the
    root, however the store was opened) is held: a Go server would wait for it."""
    from nstance.objectstore import file as file_store

    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "link").symlink_to(data)
    go = GoFileStorage(str(tmp_path / "data" / ".." / "data"))
    assert go.lock_path("shard/a/leader.json") == str(
        tmp_path / "data.locks" / (hashlib.md5(b"shard/a/leader.json").hexdigest() + ".lock")
    )
    probes: list[str] = []

    def held_by_someone(key: str) -> str:
        fd = os.open(go.lock_path(key), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "held"
        finally:
            os.close(fd)
        return "free"

    real_link, real_write = os.link, file_store.write_atomic

    def probing_link(src: Any, dst: Any, **kw: Any) -> None:
        probes.append(held_by_someone("shard/a/leader.json"))
        real_link(src, dst, **kw)

    def probing_write(path: Path, payload: bytes, **kw: Any) -> None:
        probes.append(held_by_someone("shard/a/leader.json"))
        real_write(path, payload, **kw)

    monkeypatch.setattr(os, "link", probing_link)
    monkeypatch.setattr(file_store, "write_atomic", probing_write)
    for root in (tmp_path / "link", tmp_path / "data" / ".." / "data"):
        store = FileObjectStore(root)
        etag = store.put_if_match("shard/a/leader.json", b"lease", None)
        store.put_if_match("shard/a/leader.json", b"renewed", etag)
        store.delete("shard/a/leader.json")
    # per root: the create (its write, then its link) and the update, each under upstream's lock
    assert probes == ["held"] * 6
    assert sorted(os.listdir(tmp_path)) == ["data", "data.locks", "link"]


def test_file_store_lists_neither_its_own_nor_a_go_servers_temporary_files(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "root")
    store.put("shard/a/leader.json", b"x")
    for name in (".nstance-create-123", ".nstance-update-456", ".nstance-put-789", ".nstance-tmp-ab"):
        (tmp_path / "root" / "shard" / "a" / name).write_bytes(b"half")
    assert store.list() == ["shard/a/leader.json"]
    assert store.list("shard/a/") == ["shard/a/leader.json"]


def test_file_create_only_falls_back_without_hard_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(*_: object, **__: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    store = FileObjectStore(tmp_path / "root")
    etag = store.put_if_match("shard/a/leader.json", b"lease", None)
    with pytest.raises(PreconditionFailed):
        store.put_if_match("shard/a/leader.json", b"second", None)
    assert store.get("shard/a/leader.json") == (b"lease", etag)
    assert sorted(os.listdir(tmp_path / "root" / "shard" / "a")) == ["leader.json"]


def test_file_store_without_room_for_upstreams_locks_warns_once_and_still_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The directory beside the root cannot be created (its parent is read-only to this user): no Go
    server with the same rights can write there either, so the store says so once and goes on."""

    def refused(*_: object, **__: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    store = FileObjectStore(tmp_path / "root")
    monkeypatch.setattr(os, "makedirs", refused)
    with caplog.at_level(logging.WARNING, logger="nstance.objectstore.file"):
        etag = store.put_if_match("shard/a/leader.json", b"lease", None)
        store.put_if_match("shard/a/leader.json", b"renewed", etag)
        store.put_if_match("shard/a/other.json", b"x", None)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert f"cannot use {tmp_path / 'root.locks'} for upstream's per-key locks" in warnings[0]
    assert store.get("shard/a/leader.json")[0] == b"renewed"
    assert not (tmp_path / "root.locks").exists()


_CRASH_CHILD = textwrap.dedent(
    """
    import os, sys
    from nstance.objectstore.file import FileObjectStore

    store = FileObjectStore(sys.argv[1])

    def crash(*args, **kwargs):
        os._exit(17)  # die between writing the temporary file and renaming it

    os.replace = crash
    store.put_if_match(sys.argv[2], b"new content that never lands", sys.argv[3])
    """
)


def test_file_crash_leftovers_are_invisible(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = FileObjectStore(root)
    old_etag = store.put("shard/a/leader.json", b"old")

    child = subprocess.run(
        [sys.executable, "-c", _CRASH_CHILD, str(root), "shard/a/leader.json", old_etag],
        env=_child_env(),
        cwd=REPO_ROOT,
        check=False,
        timeout=30,
    )
    assert child.returncode == 17
    on_disk = sorted(os.listdir(root / "shard" / "a"))
    assert len(on_disk) == 2, on_disk  # the object and the crash's orphaned temporary file
    assert "leader.json" in on_disk

    assert store.list() == ["shard/a/leader.json"]
    assert store.list("shard/a/") == ["shard/a/leader.json"]
    assert store.get("shard/a/leader.json") == (b"old", old_etag)
    # The dead writer's lock died with it.
    store.put_if_match("shard/a/leader.json", b"new", old_etag)
    assert store.get("shard/a/leader.json")[0] == b"new"


def test_file_store_keeps_a_bounded_number_of_lock_files(tmp_path: Path) -> None:
    root = tmp_path / "root"
    locks = root / ".nstance-locks"
    locks.mkdir(parents=True)
    legacy = locks / ("ab" * 20 + ".lock")  # one-per-key lock file of an older version
    legacy.write_bytes(b"")
    store = FileObjectStore(root)
    assert not legacy.exists()
    for i in range(500):
        key = f"shard/a/instance/default.i-{i:04d}.json"
        etag = store.put_if_match(key, b"pending", None)
        store.delete(key, if_match=etag)
    assert 0 < len(os.listdir(locks)) <= LOCK_STRIPES


def test_file_store_hashes_a_large_object_it_already_knows_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conditional write of a large object hashes the new content only, never the bytes it wrote."""
    from nstance.objectstore import file as file_store

    hashed: list[int] = []

    def counting(data: bytes) -> str:
        hashed.append(len(data))
        return content_etag(data)

    monkeypatch.setattr(file_store, "content_etag", counting)
    store = FileObjectStore(tmp_path / "root")
    big = [bytes([i]) * KNOWN_MIN_BYTES for i in range(3)]
    etag = store.put_if_match("shard/a/groups.jsonc", big[0], None)
    for data in big[1:]:
        etag = store.put_if_match("shard/a/groups.jsonc", data, etag)
    assert store.get("shard/a/groups.jsonc") == (big[2], content_etag(big[2]))
    assert len(hashed) == 3  # one per write; the current content was each time the one just written


def test_file_store_hashes_large_new_content_beside_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new content of a large object is hashed in a helper thread while the write runs (its ETag
    then costs the writer no time of its own); a refused write is not remembered as written."""
    import threading

    from nstance.objectstore import file as file_store

    threads: list[str] = []

    def counting(data: bytes) -> str:
        threads.append(threading.current_thread().name)
        return content_etag(data)

    monkeypatch.setattr(file_store, "content_etag", counting)
    store = FileObjectStore(tmp_path / "root")
    big = b"g" * KNOWN_MIN_BYTES
    etag = store.put_if_match("shard/a/groups.jsonc", big, None)
    assert etag == content_etag(big)
    assert threads
    assert all(name.startswith("nstance-etag") for name in threads)
    refused = b"r" * KNOWN_MIN_BYTES
    with pytest.raises(PreconditionFailed):
        store.put_if_match("shard/a/groups.jsonc", refused, '"stale"')
    assert store.get("shard/a/groups.jsonc") == (big, etag)
    assert store.put("shard/a/groups.jsonc", refused) == content_etag(refused)
    assert store.get("shard/a/groups.jsonc") == (refused, content_etag(refused))


def test_file_store_never_reuses_an_etag_for_changed_bytes(tmp_path: Path) -> None:
    """Another writer (here another process's store on the same root) changes a large object: the
    remembered ETag of the old bytes is not used, and a write with the stale ETag is refused."""
    ours, theirs = FileObjectStore(tmp_path / "root"), FileObjectStore(tmp_path / "root")
    old = b"a" * KNOWN_MIN_BYTES
    new = b"a" * (KNOWN_MIN_BYTES - 1) + b"b"  # same size, one byte apart
    stale = ours.put_if_match("shard/a/groups.jsonc", old, None)
    theirs.put_if_match("shard/a/groups.jsonc", new, theirs.get("shard/a/groups.jsonc")[1])
    with pytest.raises(PreconditionFailed):
        ours.put_if_match("shard/a/groups.jsonc", b"lost update", stale)
    assert ours.get("shard/a/groups.jsonc") == (new, content_etag(new))
    assert ours.head("shard/a/groups.jsonc").etag == content_etag(new)
    for i in range(KNOWN_KEYS + 2):  # more large objects than are remembered: all still correct
        ours.put(f"shard/a/big-{i}", bytes([i]) * KNOWN_MIN_BYTES)
    for i in range(KNOWN_KEYS + 2):
        data = bytes([i]) * KNOWN_MIN_BYTES
        assert ours.get(f"shard/a/big-{i}") == (data, content_etag(data))


def test_file_path_traversal_cannot_escape_root(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "root")
    for key in ("../escaped", "a/../../escaped", "/tmp/escaped"):
        with pytest.raises(InvalidArgument):
            store.put(key, b"x")
    assert not (tmp_path / "escaped").exists()
    assert store.list() == []


def test_file_key_and_prefix_cannot_share_a_name(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "root")
    store.put("a", b"object")
    with pytest.raises(InvalidArgument):
        store.put("a/b", b"x")
    store.put("x/y", b"object")
    with pytest.raises(InvalidArgument):
        store.put("x", b"x")
    with pytest.raises(ObjectNotFound):
        store.get("x")
    store.delete("x")  # a directory of other keys is not an object: nothing to delete
    assert store.list() == ["a", "x/y"]


def test_file_store_reads_objects_of_every_size_around_its_read_chunk(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "root")
    for size in (1, READ_CHUNK - 1, READ_CHUNK, READ_CHUNK + 1, 2 * READ_CHUNK, 16 * READ_CHUNK + 3):
        payload = os.urandom(size)
        etag = store.put_if_match(f"blob/{size}", payload, None)
        assert store.get(f"blob/{size}") == (payload, etag)
        changed = bytes([payload[0] ^ 1]) + payload[1:]
        assert store.put_if_match(f"blob/{size}", changed, etag) != etag  # read again under the lock
        assert store.get(f"blob/{size}")[0] == changed


def test_file_store_persists_and_hides_internals(tmp_path: Path) -> None:
    root = tmp_path / "root"
    FileObjectStore(root).put_if_match("shard/a/leader.json", b"lease", None)
    reopened = FileObjectStore(root)
    assert reopened.get("shard/a/leader.json")[0] == b"lease"
    assert (root / "shard" / "a" / "leader.json").read_bytes() == b"lease"
    assert any(name.startswith(".nstance-") for name in os.listdir(root))  # the lock directory
    assert reopened.list() == ["shard/a/leader.json"]


# --------------------------------------------------------------------------------------------------
# s3:// specifics (fault injection against the real moto_server)
# --------------------------------------------------------------------------------------------------


class _RawBody:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: object) -> Iterator[bytes]:
        yield self._data


def _inject(store: S3ObjectStore, operation: str, failures: list[tuple[int, str]]) -> list[str]:
    """Answer the next len(failures) ``operation`` requests with these errors; return a call log."""
    calls: list[str] = []
    pending = list(failures)

    def before_send(request: Any, **_: object) -> AWSResponse | None:
        if not pending:
            calls.append("sent")
            return None
        status, code = pending.pop(0)
        calls.append(f"{status} {code}")
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>injected by test</Message>"
            "<RequestId>test</RequestId></Error>"
        ).encode()
        headers = {"Content-Type": "application/xml", "Content-Length": str(len(body))}
        return AWSResponse(request.url, status, headers, _RawBody(body))

    store.client.meta.events.register(f"before-send.s3.{operation}", before_send)
    return calls


def test_s3_conflict_is_retried_then_succeeds(s3_store_factory: S3StoreFactory) -> None:
    sleeps: list[float] = []
    store = s3_store_factory(sleep=sleeps.append, rand=lambda: 1.0)
    etag = store.put("leader.json", b"old")
    calls = _inject(store, "PutObject", [(409, "ConditionalRequestConflict")])

    new_etag = store.put_if_match("leader.json", b"new", etag)

    assert calls == ["409 ConditionalRequestConflict", "sent"]
    assert sleeps == [pytest.approx(0.05)]
    assert store.get("leader.json") == (b"new", new_etag)


def test_s3_persistent_conflict_surfaces_as_conflict(s3_store_factory: S3StoreFactory) -> None:
    sleeps: list[float] = []
    store = s3_store_factory(sleep=sleeps.append, max_attempts=3)
    calls = _inject(store, "PutObject", [(409, "ConditionalRequestConflict")] * 10)
    with pytest.raises(Conflict):
        store.put_if_match("leader.json", b"new", None)
    assert len(calls) == 3
    assert len(sleeps) == 2
    assert not store.exists("leader.json")


def test_s3_persistent_slowdown_backs_off_then_throttled(s3_store_factory: S3StoreFactory) -> None:
    sleeps: list[float] = []
    store = s3_store_factory(sleep=sleeps.append, rand=lambda: 1.0, max_attempts=6, max_delay=0.5)
    calls = _inject(store, "PutObject", [(503, "SlowDown")] * 10)
    with pytest.raises(Throttled):
        store.put("k", b"v")
    assert len(calls) == 6  # botocore added no retries of its own
    assert sleeps == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.5])  # exponential, capped


def test_s3_backoff_is_jittered(s3_store_factory: S3StoreFactory) -> None:
    sleeps: list[float] = []
    store = s3_store_factory(sleep=sleeps.append, rand=iter([0.5, 0.25]).__next__, max_attempts=3)
    _inject(store, "GetObject", [(503, "SlowDown")] * 2)
    store.put("k", b"v")
    assert store.get("k")[0] == b"v"
    assert sleeps == pytest.approx([0.025, 0.025])


def test_s3_ambiguous_error_on_conditional_write_is_not_retried(s3_store_factory: S3StoreFactory) -> None:
    sleeps: list[float] = []
    store = s3_store_factory(sleep=sleeps.append)
    calls = _inject(store, "PutObject", [(500, "InternalError")])
    with pytest.raises(Unavailable) as raised:
        store.put_if_match("k", b"v", None)
    assert not isinstance(raised.value, (Conflict, Throttled))
    assert "re-read" in str(raised.value)
    assert calls == ["500 InternalError"]
    assert sleeps == []

    _inject(store, "GetObject", [(500, "InternalError")])
    store.put("k", b"v")
    assert store.get("k")[0] == b"v"  # idempotent reads are retried
    assert len(sleeps) == 1


def test_s3_missing_bucket_is_not_a_missing_object(s3_store_factory: S3StoreFactory) -> None:
    store = s3_store_factory(bucket="nstance-no-such-bucket")
    with pytest.raises(NotFound) as raised:
        store.get("k")
    assert not isinstance(raised.value, ObjectNotFound)


def test_s3_prefix_is_applied_and_stripped(s3_store_factory: S3StoreFactory) -> None:
    base = s3_store_factory()
    scoped = s3_store_factory("tenant-x/", bucket=base.bucket)
    scoped.put("shard/a/leader.json", b"l")
    assert scoped.list() == ["shard/a/leader.json"]
    assert scoped.list("shard/") == ["shard/a/leader.json"]
    assert base.list() == ["tenant-x/shard/a/leader.json"]
    raw = base.client.list_objects_v2(Bucket=base.bucket)
    assert [o["Key"] for o in raw["Contents"]] == ["tenant-x/shard/a/leader.json"]


def test_s3_endpoint_and_path_style_from_environment(
    moto_server: MotoServer, aws_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint_url)
    monkeypatch.setenv("AWS_S3_USE_PATH_STYLE", "true")
    store = open_store("s3://nstance-env-bucket/p")
    assert isinstance(store, S3ObjectStore)
    try:
        assert store.endpoint_url == moto_server.endpoint_url
        assert store.path_style
        store.client.create_bucket(Bucket="nstance-env-bucket")
        store.put("k", b"v")
        assert store.list() == ["k"]
        assert store.client.list_objects_v2(Bucket="nstance-env-bucket")["Contents"][0]["Key"] == "p/k"
    finally:
        store.close()


# --------------------------------------------------------------------------------------------------
# factory
# --------------------------------------------------------------------------------------------------


def test_factory_memory() -> None:
    assert isinstance(open_store("memory://"), MemoryObjectStore)
    assert open_store("memory://") is not open_store("memory://")


def test_factory_file_absolute_and_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = open_store(f"file://{tmp_path}/abs")
    assert isinstance(absolute, FileObjectStore)
    assert absolute.root == tmp_path / "abs"
    assert (tmp_path / "abs").is_dir()

    monkeypatch.chdir(tmp_path)
    relative = open_store("file://rel/dir")
    assert isinstance(relative, FileObjectStore)
    assert relative.root == tmp_path / "rel" / "dir"


def test_factory_s3_url(aws_env: None) -> None:
    store = open_store("s3://my-bucket/some/prefix?region=eu-west-1", endpoint_url="http://127.0.0.1:9")
    assert isinstance(store, S3ObjectStore)
    try:
        assert (store.bucket, store.prefix) == ("my-bucket", "some/prefix/")
        assert store.endpoint_url == "http://127.0.0.1:9"
        assert not store.path_style
        assert store.client.meta.region_name == "eu-west-1"
    finally:
        store.close()

    bare = open_store("s3://my-bucket?path_style=true&endpoint=http://127.0.0.1:9")
    assert isinstance(bare, S3ObjectStore)
    try:
        assert bare.prefix == ""
        assert bare.path_style
        assert bare.client.meta.config.s3["addressing_style"] == "path"
    finally:
        bare.close()


@pytest.mark.parametrize(
    "url",
    ["gs://bucket/x", "ftp://host/x", "/just/a/path", "s3://", "s3:///prefix", "file://", "memory://x"],
)
def test_factory_rejects_bad_urls(url: str) -> None:
    with pytest.raises(InvalidArgument):
        open_store(url)


def test_factory_rejects_options_for_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        open_store(f"file://{tmp_path}", region="us-east-1")


def test_open_scopes_builds_shard_and_cluster_views(tmp_path: Path) -> None:
    scopes = open_scopes("file", str(tmp_path / "bucket"), shard="eu-1a")
    scopes.shard.put("leader.json", b"s")
    scopes.cluster.put("ca.crt", b"c")
    assert scopes.root.list() == ["cluster/ca.crt", "shard/eu-1a/leader.json"]

    custom = open_scopes("memory", "", shard="x", prefix="deploy/{shard}", cluster_prefix="global")
    custom.shard.put("k", b"1")
    custom.cluster.put("k", b"2")
    assert custom.root.list() == ["deploy/x/k", "global/k"]

    with pytest.raises(InvalidArgument):
        open_scopes("gcs", "b", shard="x")


@pytest.mark.parametrize("bucket", ["my bucket", "b/c", "bücket", "x" * 256])
def test_a_bucket_name_the_client_would_refuse_is_refused_at_once(bucket: str) -> None:
    with pytest.raises(InvalidArgument, match="is not a bucket name"):
        open_scopes("s3", bucket, shard="x")
