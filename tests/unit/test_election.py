"""Leader election on object storage: who leads, when a dead leader is replaced, and fencing.

Most tests drive electors exactly as ``Elector.run`` would (step, then wait the returned delay) on a
ManualClock, so failover timing is checked to the millisecond without sleeping. One test runs the real
``run()`` loop with tiny intervals on a FileObjectStore.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nstance.config.cluster import LeaderElectionConfig
from nstance.core.clock import ManualClock, SystemClock
from nstance.core.errors import InvalidArgument, Unavailable
from nstance.objectstore.base import ObjectInfo, ObjectStore
from nstance.objectstore.file import FileObjectStore
from nstance.objectstore.memory import MemoryObjectStore
from nstance.server.leadership.election import Elector, LeaderInfo, encode_lockfile, parse_lockfile
from nstance.testing.waiting import eventually

KEY = "shard/local-a/leader.json"
CONFIG = LeaderElectionConfig()  # frequent 5 s, infrequent 30 s, leader_timeout 15 s
FREQUENT = 5.0
TIMEOUT = 15.0
VALID_FOR = TIMEOUT / 2
TAKEOVER = max(TIMEOUT - FREQUENT, 0.6 * TIMEOUT)  # a follower takes over after this long unchanged
GRACE = 1.0  # default: min(1 s, frequent / 2)


# -- helpers -------------------------------------------------------------------------------------


def ms(value: int) -> timedelta:
    return timedelta(milliseconds=value)


@dataclass
class Call:
    op: str
    key: str
    at: float  # monotonic time of the call
    data: bytes | None = None
    etag: str | None = None  # the condition (put_if_match etag / delete if_match)
    ok: bool = True


class RecordingStore:
    """Wraps a store, records every call, and can fail calls on demand (before or after applying)."""

    def __init__(self, inner: ObjectStore, clock: ManualClock | SystemClock) -> None:
        self.inner = inner
        self.clock = clock
        self.calls: builtins.list[Call] = []
        self.fail_ops: set[str] = set()  # these ops raise Unavailable without doing anything
        self.fail_after_apply: set[str] = set()  # these ops are applied, then raise Unavailable
        self.block: threading.Event | None = None  # put_if_match waits for this event first

    def _record(self, call: Call, fn: Callable[[], object]) -> object:
        self.calls.append(call)
        if call.op in self.fail_ops:
            call.ok = False
            raise Unavailable("store unreachable (injected)")
        try:
            result = fn()
        except Exception:
            call.ok = False
            raise
        if call.op in self.fail_after_apply:
            call.ok = False
            raise Unavailable("connection dropped after the request was sent (injected)")
        return result

    def get(self, key: str) -> tuple[bytes, str]:
        result = self._record(Call("get", key, self.clock.monotonic()), lambda: self.inner.get(key))
        assert isinstance(result, tuple)
        return result

    def head(self, key: str) -> ObjectInfo:
        result = self._record(Call("head", key, self.clock.monotonic()), lambda: self.inner.head(key))
        assert isinstance(result, ObjectInfo)
        return result

    def put(self, key: str, data: bytes) -> str:
        return str(
            self._record(Call("put", key, self.clock.monotonic(), data), lambda: self.inner.put(key, data))
        )

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        if self.block is not None:
            self.block.wait(5)
        call = Call("put_if_match", key, self.clock.monotonic(), data, etag)
        return str(self._record(call, lambda: self.inner.put_if_match(key, data, etag)))

    def delete(self, key: str, if_match: str | None = None) -> None:
        call = Call("delete", key, self.clock.monotonic(), etag=if_match)
        self._record(call, lambda: self.inner.delete(key, if_match=if_match))

    def list(self, prefix: str = "") -> builtins.list[str]:
        result = self._record(Call("list", prefix, self.clock.monotonic()), lambda: self.inner.list(prefix))
        assert isinstance(result, list)
        return result

    def exists(self, key: str) -> bool:
        return bool(self._record(Call("exists", key, self.clock.monotonic()), lambda: self.inner.exists(key)))

    def successful_writes_by(self, leader_id: str) -> builtins.list[Call]:
        return [
            c
            for c in self.calls
            if c.op == "put_if_match" and c.ok and c.data and json.loads(c.data)["leaderID"] == leader_id
        ]


class Changes:
    """Collects on_change notifications."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def __call__(self, leading: bool) -> None:
        self.seen.append(leading)


def make(
    store: ObjectStore,
    clock: ManualClock,
    elector_id: str,
    *,
    config: LeaderElectionConfig = CONFIG,
    changes: Changes | None = None,
    extra: dict[str, str] | None = None,
) -> Elector:
    return Elector(
        store,
        KEY,
        elector_id=elector_id,
        address=f"{elector_id}.internal:8991",
        extra=extra,
        config=config,
        clock=clock,
        on_change=changes,
    )


class Sim:
    """Steps each live elector when the delay returned by its previous step has passed (as run() does).

    After every step it checks the safety property: at most one elector (live or killed) is leader.
    """

    def __init__(
        self, clock: ManualClock, electors: dict[str, Elector], alive: set[str] | None = None
    ) -> None:
        self.clock = clock
        self.electors = electors
        self.due = dict.fromkeys(electors, clock.monotonic())
        self.alive = set(electors) if alive is None else set(alive)
        self.first_leading: dict[str, float] = {}

    def check(self) -> None:
        leaders = [name for name, e in self.electors.items() if e.is_leader()]
        assert len(leaders) <= 1, f"split brain at t={self.clock.monotonic()}: {leaders}"
        for name in leaders:
            self.first_leading.setdefault(name, self.clock.monotonic())

    def leaders(self) -> list[str]:
        return [name for name, e in self.electors.items() if e.is_leader()]

    def kill(self, name: str) -> None:
        self.alive.discard(name)

    def revive(self, name: str) -> None:
        self.alive.add(name)
        self.due[name] = self.clock.monotonic()

    async def run_for(self, seconds: float) -> None:
        end = self.clock.monotonic() + seconds
        for _ in range(20_000):
            name = min(sorted(self.alive), key=lambda n: self.due[n])
            at = self.due[name]
            if at > end:
                self.clock.advance(end - self.clock.monotonic())
                self.check()
                return
            self.clock.advance(max(0.0, at - self.clock.monotonic()))
            self.check()
            delay = await self.electors[name].step()
            assert delay >= 0
            self.due[name] = self.clock.monotonic() + delay
            self.check()
        raise AssertionError("electors kept asking to be stepped without time passing")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(clock: ManualClock) -> RecordingStore:
    return RecordingStore(MemoryObjectStore(), clock)


# -- winning -------------------------------------------------------------------------------------


async def test_single_elector_leads_only_after_the_grace_gap(
    clock: ManualClock, store: RecordingStore
) -> None:
    changes = Changes()
    a = make(store, clock, "a", changes=changes)

    wait = await a.step()

    assert not a.is_leader(), "must not act during the grace gap"
    assert wait == pytest.approx(GRACE)
    assert a.term == 1
    info = a.leader()
    assert info is not None
    assert (info.leader_id, info.address) == ("a", "a.internal:8991")
    clock.advance(GRACE - 0.01)
    assert not a.is_leader()
    clock.advance(0.01)
    await a.step()
    assert a.is_leader()
    assert changes.seen == [True]


async def test_two_electors_starting_together_never_both_lead(
    clock: ManualClock, store: RecordingStore
) -> None:
    a, b = make(store, clock, "a"), make(store, clock, "b")
    start = clock.monotonic()

    await asyncio.gather(a.step(), b.step())  # both find no lockfile and race to create it
    sim = Sim(clock, {"a": a, "b": b})
    await sim.run_for(300)

    assert len(sim.leaders()) == 1
    winner = sim.leaders()[0]
    loser = "b" if winner == "a" else "a"
    assert sim.first_leading == {winner: pytest.approx(start + GRACE)}, (
        "leadership must not move while the leader lives"
    )
    assert sim.electors[winner].term == 1
    assert sim.electors[loser].term == 0
    assert sim.electors[loser].leader() == sim.electors[winner].leader()


# -- failover ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kill_after", [30 + 0.25 * i for i in range(21)] + [31.1, 47.3, 52.9])
async def test_dead_leader_is_replaced_after_its_lease_and_within_the_leader_timeout(
    clock: ManualClock, store: RecordingStore, kill_after: float
) -> None:
    a_changes = Changes()
    a = make(store, clock, "a", changes=a_changes)
    b = make(store, clock, "b")
    start = clock.monotonic()
    await a.step()  # a creates the lock first
    sim = Sim(clock, {"a": a, "b": b})
    await sim.run_for(kill_after)
    assert sim.leaders() == ["a"]

    sim.kill("a")  # the process dies: no more renewals, no release
    await sim.run_for(TIMEOUT + FREQUENT + GRACE + 10)

    last_write = store.successful_writes_by("a")[-1].at
    took_over = sim.first_leading["b"]
    assert took_over - last_write >= TAKEOVER, "took over a lock that was not stale yet"
    assert took_over - last_write >= VALID_FOR + GRACE, "the old leader's lease had not run out"
    assert took_over - last_write <= TAKEOVER + FREQUENT / 2 + GRACE + 1e-6
    assert took_over - last_write <= TIMEOUT + 1e-6
    assert sim.leaders() == ["b"]
    assert start <= last_write

    # The old leader fenced itself by time alone (it was not stepped), long before b took over...
    assert not a.is_leader()
    assert a_changes.seen == [True]
    # ...and when it runs again it notices it lost and reports it.
    await a.step()
    assert not a.is_leader()
    assert a_changes.seen == [True, False]
    info = a.leader()
    assert info is not None
    assert info.leader_id == "b"


async def test_leader_stops_acting_when_its_lease_runs_out_without_renewal(
    clock: ManualClock, store: RecordingStore
) -> None:
    a = make(store, clock, "a")
    await a.step()
    clock.advance(GRACE)
    await a.step()
    assert a.is_leader()
    last_write = store.successful_writes_by("a")[-1].at

    clock.advance(last_write + VALID_FOR - clock.monotonic() - 0.001)
    assert a.is_leader()
    clock.advance(0.001)
    assert not a.is_leader(), "a leader that could not renew must stop at leader_timeout/2"


async def test_hung_renewal_fences_the_leader(clock: ManualClock) -> None:
    config = LeaderElectionConfig(
        frequent_interval=ms(200), infrequent_interval=ms(1000), leader_timeout=ms(600)
    )
    store = RecordingStore(MemoryObjectStore(), clock)
    changes = Changes()
    a = make(store, clock, "a", config=config, changes=changes)
    await a.step()
    clock.advance(0.1)  # grace = 100 ms
    await a.step()
    assert a.is_leader()
    clock.advance(0.1)  # renewal due at 200 ms; lease valid until 300 ms
    store.block = threading.Event()
    try:
        wait = await a.step()  # the renewal hangs; it is abandoned when the lease would lapse
    finally:
        store.block.set()
    assert not a.is_leader()
    assert changes.seen == [True, False]
    assert wait == 0.0  # retry at once


# -- failures ------------------------------------------------------------------------------------


async def test_failed_renewal_stops_the_leader_at_once_and_it_resumes_later(
    clock: ManualClock, store: RecordingStore
) -> None:
    a_changes = Changes()
    a = make(store, clock, "a", changes=a_changes)
    b = make(store, clock, "b")
    await a.step()
    await b.step()
    clock.advance(FREQUENT)
    await a.step()  # renewed, leading
    await b.step()
    assert a.is_leader()

    clock.advance(FREQUENT)
    store.fail_ops = {"get", "put_if_match"}
    waits = [await a.step()]
    assert not a.is_leader(), "a failed renewal must stop the leader immediately"
    assert a_changes.seen == [True, False]
    for _ in range(3):
        waits.append(await a.step())
    assert waits == [0.0, 0.1, 1.0, FREQUENT]  # retries as s3lect: at once, +100 ms, +1 s, then every poll
    await b.step()
    assert not b.is_leader(), "a short outage must not make followers take over"

    store.fail_ops = set()
    await a.step()  # resumes its own lock with a conditional write: a new term, a new grace gap
    assert a.term == 2
    assert not a.is_leader()
    clock.advance(GRACE)
    await a.step()
    assert a.is_leader()
    assert a_changes.seen == [True, False, True]
    await b.step()
    assert not b.is_leader()


async def test_renewal_that_landed_despite_an_error_is_recognised(
    clock: ManualClock, store: RecordingStore
) -> None:
    a = make(store, clock, "a")
    await a.step()
    clock.advance(FREQUENT)
    await a.step()
    assert a.is_leader()

    clock.advance(FREQUENT)
    store.fail_after_apply = {"put_if_match"}
    await a.step()
    assert not a.is_leader()
    store.fail_after_apply = set()
    await a.step()
    clock.advance(GRACE)  # its own write: the normal grace gap, not the stretched one
    await a.step()
    assert a.is_leader()
    assert a.term == 2


async def test_lost_lock_is_noticed_on_the_next_renewal(clock: ManualClock, store: RecordingStore) -> None:
    a_changes = Changes()
    a = make(store, clock, "a", changes=a_changes)
    await a.step()
    clock.advance(GRACE)
    await a.step()
    assert a.is_leader()
    _, etag = store.inner.get(KEY)
    stolen = encode_lockfile("z", "z:1", clock.now(), {})
    store.inner.put_if_match(KEY, stolen, etag)

    clock.advance(FREQUENT - GRACE)
    wait = await a.step()
    assert not a.is_leader()
    assert a_changes.seen == [True, False]
    info = a.leader()
    assert info is not None
    assert info.leader_id == "z"
    assert wait == FREQUENT


async def test_a_restarted_server_resumes_its_lock_after_the_old_lease_lapsed(
    clock: ManualClock, store: RecordingStore
) -> None:
    old = make(store, clock, "a")
    new = make(store, clock, "a")  # same server ID, next process
    sim = Sim(clock, {"old": old, "new": new}, alive={"old"})
    await sim.run_for(12)
    assert sim.leaders() == ["old"]

    sim.kill("old")
    sim.revive("new")
    restarted = clock.monotonic()
    calls_before = len(store.calls)
    await sim.run_for(TIMEOUT)

    writes = [c for c in store.calls[calls_before:] if c.op == "put_if_match"]
    assert writes[0].etag is not None, "resuming must be a conditional write"
    # Content it did not write itself: it waits out a lease the previous process may still hold...
    assert sim.first_leading["new"] - restarted == pytest.approx(VALID_FOR)
    # ...which is still faster than waiting for the lock to become stale.
    assert sim.first_leading["new"] - restarted < TIMEOUT
    assert new.term == 1


async def test_two_live_processes_sharing_an_id_never_both_lead(
    clock: ManualClock, store: RecordingStore
) -> None:
    one, two = make(store, clock, "a"), make(store, clock, "a")
    sim = Sim(clock, {"one": one, "two": two}, alive={"one"})
    await sim.run_for(12)
    sim.revive("two")
    await sim.run_for(120)  # Sim.check asserts at most one leader after every step


# -- resign --------------------------------------------------------------------------------------


async def test_resign_hands_leadership_to_another_server_quickly(
    clock: ManualClock, store: RecordingStore
) -> None:
    a_changes = Changes()
    a = make(store, clock, "a", changes=a_changes)
    b = make(store, clock, "b")
    sim = Sim(clock, {"a": a, "b": b})
    await a.step()
    await sim.run_for(20)
    assert sim.leaders() == ["a"]

    await a.resign()
    assert not a.is_leader()
    assert a_changes.seen == [True, False]
    assert not store.inner.exists(KEY)
    resigned_at = clock.monotonic()
    await sim.run_for(20)

    assert sim.leaders() == ["b"]
    assert sim.first_leading["b"] - resigned_at <= FREQUENT + GRACE


class RenewalLandsDuringRelease(RecordingStore):
    """A renewal's write waits in its thread and lands just before the release's delete arrives."""

    def __init__(self, inner: ObjectStore, clock: ManualClock) -> None:
        super().__init__(inner, clock)
        self.armed = False  # only the write made after arming waits
        self.entered, self.go, self.landed = threading.Event(), threading.Event(), threading.Event()

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        if not self.armed:
            return super().put_if_match(key, data, etag)
        self.armed = False
        self.entered.set()
        self.go.wait(5)
        try:
            return super().put_if_match(key, data, etag)
        finally:
            self.landed.set()

    def delete(self, key: str, if_match: str | None = None) -> None:
        if self.entered.is_set() and not self.landed.is_set():
            self.go.set()
            self.landed.wait(5)
        super().delete(key, if_match)


async def test_a_renewal_that_lands_during_the_release_is_released_too(clock: ManualClock) -> None:
    # The renewal in flight when a leader stops lands between the release's read and its conditional
    # delete: the lock is still ours (the renewal's content), so it is read again and deleted, instead
    # of being left fresh for others to wait out for a whole leader timeout.
    config = LeaderElectionConfig(
        frequent_interval=ms(200), infrequent_interval=ms(1000), leader_timeout=ms(600)
    )
    store = RenewalLandsDuringRelease(MemoryObjectStore(), clock)
    a = make(store, clock, "a", config=config)
    await a.step()
    clock.advance(0.1)
    await a.step()
    assert a.is_leader()
    clock.advance(0.1)  # renewal due
    store.armed = True
    renewal = asyncio.create_task(a.step())
    await eventually(store.entered.is_set, within=10, what="the renewal's write in its thread")
    renewal.cancel()
    with pytest.raises(asyncio.CancelledError):
        await renewal
    await a.resign()
    assert store.landed.is_set()
    assert not store.inner.exists(KEY)


async def test_resigned_server_leaves_the_lock_alone_for_leader_timeout(
    clock: ManualClock, store: RecordingStore
) -> None:
    a = make(store, clock, "a")
    await a.step()
    clock.advance(GRACE)
    await a.step()
    await a.resign()

    sim = Sim(clock, {"a": a})
    await sim.run_for(TIMEOUT - 0.01)
    assert not store.inner.exists(KEY)
    await sim.run_for(FREQUENT + GRACE)
    assert a.is_leader()
    assert a.term == 2


# -- lockfile ------------------------------------------------------------------------------------


async def test_lockfile_uses_upstream_field_names(clock: ManualClock, store: RecordingStore) -> None:
    a = make(store, clock, "srv-1", extra={"operatorAddr": "10.0.0.1:8993"})
    await a.step()

    doc = json.loads(store.inner.get(KEY)[0])
    assert doc == {
        "leaderID": "srv-1",
        "leaderAddr": "srv-1.internal:8991",
        "lastUpdated": "2026-01-01T00:00:00.000000Z",
        "operatorAddr": "10.0.0.1:8993",
    }


async def test_follower_reads_a_lockfile_written_by_the_go_server(
    clock: ManualClock, store: RecordingStore
) -> None:
    go_lock = (
        b'{"leaderID":"go-1","leaderAddr":"10.0.0.9:8991","lastUpdated":"2026-01-01T00:00:05.123456789Z"}'
    )
    store.inner.put_if_match(KEY, go_lock, None)
    b = make(store, clock, "b")

    await b.step()

    info = b.leader()
    assert info is not None
    assert (info.leader_id, info.address, info.extra) == ("go-1", "10.0.0.9:8991", {})
    assert info.last_updated == datetime(2026, 1, 1, 0, 0, 5, 123456, tzinfo=UTC)
    assert not b.is_leader()


def test_parse_lockfile_is_tolerant_of_missing_optional_fields() -> None:
    info = parse_lockfile(b'{"leaderID":"x","extraNum":3,"healthAddr":"h:1"}', '"e"')
    assert info == LeaderInfo("x", "", datetime(1970, 1, 1, tzinfo=UTC), {"healthAddr": "h:1"}, '"e"')


@pytest.mark.parametrize("payload", [b"", b"{not json", b"[]", b'{"leaderAddr":"x:1"}', b"\xff\xfe"])
async def test_corrupt_lockfile_is_taken_over(
    clock: ManualClock, store: RecordingStore, payload: bytes
) -> None:
    store.inner.put(KEY, payload)
    _, corrupt_etag = store.inner.get(KEY)
    a = make(store, clock, "a")
    start = clock.monotonic()

    sim = Sim(clock, {"a": a})
    await sim.run_for(20)

    first_write = next(c for c in store.calls if c.op == "put_if_match")
    assert (first_write.at, first_write.etag) == (start, corrupt_etag), "taken over at once, conditionally"
    # Unknown provenance: it waits out a lease that might exist before acting.
    assert sim.first_leading["a"] - start == pytest.approx(VALID_FOR)
    assert json.loads(store.inner.get(KEY)[0])["leaderID"] == "a"


async def test_store_only_ever_receives_conditional_writes(clock: ManualClock, store: RecordingStore) -> None:
    a, b, c = make(store, clock, "a"), make(store, clock, "b"), make(store, clock, "c")
    sim = Sim(clock, {"a": a, "b": b, "c": c})
    await sim.run_for(40)
    first = sim.leaders()[0]
    sim.kill(first)
    await sim.run_for(40)
    second = sim.leaders()[0]
    await sim.electors[second].resign()
    await sim.run_for(40)
    store.inner.put(KEY, b"garbage")
    await sim.run_for(40)
    store.fail_after_apply = {"put_if_match"}
    await sim.run_for(10)
    store.fail_after_apply = set()
    await sim.run_for(40)

    ops = {c.op for c in store.calls}
    assert "put" not in ops
    assert {"get", "put_if_match", "delete"} <= ops
    assert all(c.etag is not None for c in store.calls if c.op == "delete")
    creates = [c for c in store.calls if c.op == "put_if_match" and c.etag is None]
    assert creates, "the lock is created with If-None-Match"
    assert len(sim.leaders()) == 1


async def test_disabled_election_leads_at_once_without_touching_storage(
    clock: ManualClock, store: RecordingStore
) -> None:
    changes = Changes()
    a = make(store, clock, "a", config=LeaderElectionConfig(enabled=False), changes=changes)

    assert a.is_leader()
    wait = await a.step()
    await a.step()

    assert a.is_leader()
    assert changes.seen == [True]
    assert a.term == 1
    assert wait == 30.0
    assert store.calls == []
    info = a.leader()
    assert info is not None
    assert info.leader_id == "a"


async def test_disabled_election_resign_steps_down_for_leader_timeout(
    clock: ManualClock, store: RecordingStore
) -> None:
    changes = Changes()
    a = make(store, clock, "a", config=LeaderElectionConfig(enabled=False), changes=changes)
    await a.step()

    await a.resign()
    assert not a.is_leader()
    sim = Sim(clock, {"a": a})
    await sim.run_for(TIMEOUT - 0.01)
    assert not a.is_leader()
    await sim.run_for(0.01)
    assert a.is_leader()
    assert changes.seen == [True, False, True]
    assert a.term == 2
    assert store.calls == []


async def test_a_failing_on_change_callback_does_not_break_the_election(
    clock: ManualClock, store: RecordingStore
) -> None:
    def explode(leading: bool) -> None:
        raise RuntimeError("callback bug")

    a = Elector(store, KEY, elector_id="a", address="a:1", config=CONFIG, clock=clock, on_change=explode)
    sim = Sim(clock, {"a": a})
    await sim.run_for(60)
    assert a.is_leader()
    assert a.term == 1


async def test_term_increments_on_every_acquisition(clock: ManualClock, store: RecordingStore) -> None:
    a, b = make(store, clock, "a"), make(store, clock, "b")
    await a.step()
    sim = Sim(clock, {"a": a, "b": b})
    await sim.run_for(10)
    assert (a.term, b.term) == (1, 0)
    sim.kill("a")
    await sim.run_for(30)
    sim.revive("a")
    sim.kill("b")
    await sim.run_for(30)
    assert sim.leaders() == ["a"]
    assert (a.term, b.term) == (2, 1)


def test_constructor_rejects_unusable_settings(clock: ManualClock, store: RecordingStore) -> None:
    with pytest.raises(InvalidArgument, match="elector_id"):
        make(store, clock, "")
    with pytest.raises(InvalidArgument, match="leaderAddr"):
        make(store, clock, "a", extra={"leaderAddr": "x"})


# -- the real loop -------------------------------------------------------------------------------


async def test_run_loop_fails_over_when_the_leader_task_is_cancelled(tmp_path: Path) -> None:
    # Real time and a real file store: a lease long enough that a loaded CI machine's slow file
    # calls (seen: over 200 ms) do not cost the leader its lock before the test cancels it.
    config = LeaderElectionConfig(
        frequent_interval=ms(50), infrequent_interval=ms(200), leader_timeout=ms(3000)
    )
    clock = SystemClock()
    store = FileObjectStore(tmp_path / "bucket")
    changes = {"a": Changes(), "b": Changes()}
    electors = {
        name: Elector(
            store,
            KEY,
            elector_id=name,
            address=f"{name}:1",
            config=config,
            clock=clock,
            on_change=changes[name],
        )
        for name in ("a", "b")
    }
    tasks = {name: asyncio.create_task(e.run()) for name, e in electors.items()}
    try:
        # Polled often: the test acts between the first renewals (a cancel during one is another test).
        leader = await eventually(
            lambda: next((n for n, e in electors.items() if e.is_leader()), None),
            within=10,
            what="a leader",
            every=0.005,
        )
        other = "b" if leader == "a" else "a"
        assert not electors[other].is_leader()

        tasks[leader].cancel()
        with pytest.raises(asyncio.CancelledError):
            await tasks[leader]
        assert not electors[leader].is_leader()
        assert changes[leader].seen == [True, False]

        # A released lock is taken without waiting for staleness; if the release itself timed out on a
        # slow machine, the lock goes stale after leader_timeout instead.
        await eventually(electors[other].is_leader, within=10, what=f"{other} to take over", every=0.005)
        assert changes[other].seen == [True]
        info = electors[other].leader()
        assert info is not None
        assert info.leader_id == other
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert not store.exists(KEY), "the last leader releases the lock when its task is cancelled"


def test_lockfile_timestamps_round_trip() -> None:
    when = datetime(2026, 3, 4, 5, 6, 7, 890000, tzinfo=UTC)
    info = parse_lockfile(encode_lockfile("a", "a:1", when + timedelta(0), {"k": "v"}), '"x"')
    assert info.last_updated == when
    assert info.extra == {"k": "v"}


async def test_a_cancel_arriving_as_a_store_call_completes_is_not_lost(tmp_path: Path) -> None:
    # Python 3.11's asyncio.wait_for returns the inner result when the cancellation and the
    # completion meet, so a cancelled elector would keep running. Construct exactly that moment:
    # the worker thread has finished (its result is queued for the loop) when cancel() is called.
    elector = Elector(
        FileObjectStore(tmp_path / "bucket"),
        KEY,
        elector_id="a",
        address="a:1",
        config=LeaderElectionConfig(
            frequent_interval=ms(50), infrequent_interval=ms(200), leader_timeout=ms(400)
        ),
        clock=SystemClock(),
    )
    finished = threading.Event()

    def store_call() -> str:
        finished.set()
        return "answer"

    task = asyncio.create_task(elector._call(store_call, limit=5))
    await asyncio.sleep(0)  # the call is now waiting on the worker thread
    assert finished.wait(5)  # blocks the loop: the completion is queued but not yet delivered
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
