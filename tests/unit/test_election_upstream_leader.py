"""Our follower next to upstream's leader (s3lect), and our own pairs with long renewal intervals.

Upstream's leader renews once per ``frequent_interval`` tick (one GET, one conditional PUT) and never
fences itself, so a follower must never take its lock while it keeps renewing; when it resigns it
writes ``lastUpdated`` as Go's zero time, which means "take over now". Everything runs on a
ManualClock: each actor is stepped exactly when it asked to be, so the timings are exact.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from nstance.config.cluster import LeaderElectionConfig
from nstance.core.clock import ManualClock
from nstance.objectstore.base import ObjectNotFound
from nstance.objectstore.memory import MemoryObjectStore
from nstance.server.leadership.election import Elector, format_timestamp, takeover_wait

KEY = "shard/zone-a/leader.json"
GO_ZERO = "0001-01-01T00:00:00Z"


def config(frequent: float, timeout: float) -> LeaderElectionConfig:
    return LeaderElectionConfig(
        frequent_interval=timedelta(seconds=frequent),
        infrequent_interval=timedelta(seconds=30),
        leader_timeout=timedelta(seconds=timeout),
    )


class Writes(MemoryObjectStore):
    """A memory store that remembers when each writer's conditional writes succeeded."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.by: dict[str, list[float]] = {}

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        new = super().put_if_match(key, data, etag)
        self.by.setdefault(json.loads(data)["leaderID"], []).append(self.clock.monotonic())
        return new


class GoLeader:
    """Upstream's leader: at every tick it reads the lockfile and rewrites it with If-Match."""

    def __init__(self, store: Writes, clock: ManualClock, leader_id: str = "go-1") -> None:
        self.store, self.clock, self.leader_id = store, clock, leader_id

    def _write(self, last_updated: str) -> None:
        try:
            _, etag = self.store.get(KEY)
        except ObjectNotFound:
            etag = None
        doc = {"leaderID": self.leader_id, "leaderAddr": "10.0.0.9:8991", "lastUpdated": last_updated}
        self.store.put_if_match(KEY, json.dumps(doc).encode(), etag)

    def renew(self) -> None:
        self._write(format_timestamp(self.clock.now()))

    def resign(self) -> None:
        self._write(GO_ZERO)


async def run_until(
    clock: ManualClock, follower: Elector, due: float, end: float, go: GoLeader, go_writes: list[float]
) -> float:
    """Step ``follower`` whenever it asked to be, and let ``go`` renew at ``go_writes``, until ``end``.

    Returns when the follower is next due. At equal times the Go leader writes first.
    """
    pending = sorted(t for t in go_writes if t >= clock.monotonic())
    while True:
        next_go = pending[0] if pending else float("inf")
        at = min(next_go, due)
        if at > end:
            clock.advance(end - clock.monotonic())
            return due
        clock.advance(max(0.0, at - clock.monotonic()))
        if next_go <= due:
            pending.pop(0)
            go.renew()
        else:
            due = clock.monotonic() + await follower.step()


# (frequent_interval, leader_timeout): the defaults, the pairs the review tried, and F close to T.
TIMINGS = [(5.0, 15.0), (7.0, 15.0), (8.0, 15.0), (10.0, 15.0), (12.0, 15.0), (14.0, 15.0), (0.2, 1.0)]


def test_the_takeover_wait_outlasts_one_renewal_and_our_lease_and_stays_within_the_timeout() -> None:
    assert takeover_wait(5, 15) == 10  # the defaults: failover as fast as before
    assert takeover_wait(10, 15) == 15
    for tenths in range(1, 150):
        frequent = tenths / 10
        wait = takeover_wait(frequent, 15)
        assert wait > frequent, frequent  # a leader renewing once per F is never taken over
        assert wait - frequent >= min(frequent / 2, 15 - frequent) - 1e-9  # lateness it tolerates
        assert wait > 15 / 2  # our own leader's lease has run out
        assert wait <= 15


@pytest.mark.parametrize(("frequent", "leader_timeout"), TIMINGS)
@pytest.mark.parametrize("phase", [0.0, 0.3, 0.5, 0.77])
async def test_a_go_leader_that_keeps_renewing_is_never_taken_over(
    frequent: float, leader_timeout: float, phase: float
) -> None:
    clock = ManualClock()
    store = Writes(clock)
    go = GoLeader(store, clock)
    go.renew()
    start = clock.monotonic()
    follower = Elector(
        store, KEY, elector_id="py-1", address="py:1", config=config(frequent, leader_timeout), clock=clock
    )
    # Renewals on their ticks, every other one as late as a tick may be while staying within the bound.
    late = 0.99 * min(frequent / 2, leader_timeout - frequent)
    ticks = [start + k * frequent + (late if k % 2 else 0.0) for k in range(1, 60)]
    due = start + phase * frequent
    due = await run_until(clock, follower, due, ticks[-1], go, ticks)

    assert "py-1" not in store.by, "took the lock of a leader that kept renewing"
    assert not follower.is_leader()
    info = follower.leader()
    assert info is not None
    assert info.leader_id == "go-1"

    # The Go leader dies: the follower takes over between the wait and the wait plus half an interval.
    last = store.by["go-1"][-1]
    await run_until(clock, follower, due, last + 2 * leader_timeout, go, [])
    taken = store.by["py-1"][0] - last
    wait = takeover_wait(frequent, leader_timeout)
    assert wait - 1e-6 <= taken <= wait + frequent / 2 + 1e-6


@pytest.mark.parametrize(("frequent", "leader_timeout"), TIMINGS)
async def test_our_own_pair_with_a_long_interval_keeps_one_leader_and_fails_over(
    frequent: float, leader_timeout: float
) -> None:
    clock = ManualClock()
    store = Writes(clock)
    electors = {
        name: Elector(
            store,
            KEY,
            elector_id=name,
            address=f"{name}:1",
            config=config(frequent, leader_timeout),
            clock=clock,
        )
        for name in ("a", "b")
    }
    due = dict.fromkeys(electors, clock.monotonic())
    alive = set(electors)
    leading_since: dict[str, float] = {}

    async def run_for(seconds: float) -> None:
        end = clock.monotonic() + seconds
        while True:
            name = min(sorted(alive), key=lambda n: due[n])
            if due[name] > end:
                clock.advance(end - clock.monotonic())
                return
            clock.advance(max(0.0, due[name] - clock.monotonic()))
            due[name] = clock.monotonic() + await electors[name].step()
            leaders = [n for n, e in electors.items() if e.is_leader()]
            assert len(leaders) <= 1, f"split brain at {clock.monotonic()}"
            for leader in leaders:
                leading_since.setdefault(leader, clock.monotonic())

    await electors["a"].step()  # a creates the lock
    await run_for(20 * leader_timeout)
    assert list(leading_since) == ["a"], "leadership moved while the leader renewed"
    alive.discard("a")
    await run_for(3 * leader_timeout)
    last = store.by["a"][-1]
    assert list(leading_since) == ["a", "b"]
    assert store.by["b"][0] - last >= takeover_wait(frequent, leader_timeout) - 1e-6
    assert leading_since["b"] - last > leader_timeout / 2, "took over before the old leader's lease ran out"


async def test_a_lock_a_go_leader_resigned_is_taken_over_at_once() -> None:
    clock = ManualClock()
    store = Writes(clock)
    go = GoLeader(store, clock)
    go.renew()
    follower = Elector(store, KEY, elector_id="py-1", address="py:1", config=config(5, 15), clock=clock)
    assert await follower.step() == 2.5  # a live Go leader: read again in half an interval
    clock.advance(1.0)
    go.resign()  # upstream's Stop(): hooks run (it stopped acting), then lastUpdated = zero time
    resigned = clock.monotonic()
    clock.advance(1.5)
    grace = await follower.step()

    assert store.by["py-1"] == [resigned + 1.5], "taken over at the first read, not after 10 s"
    assert grace == 1.0  # the normal grace gap: the Go leader had stopped before it wrote
    clock.advance(grace)
    await follower.step()
    assert follower.is_leader()


async def test_our_id_in_a_lock_an_earlier_go_run_resigned_resumes_without_the_long_grace() -> None:
    clock = ManualClock()
    store = Writes(clock)
    GoLeader(store, clock, leader_id="srv-1").resign()  # the Go server this one replaced, same --id
    elector = Elector(store, KEY, elector_id="srv-1", address="srv-1:1", config=config(5, 15), clock=clock)

    assert await elector.step() == 1.0  # not the 7.5 s kept for a lock of unknown provenance
    clock.advance(1.0)
    await elector.step()
    assert elector.is_leader()


@pytest.mark.parametrize("last_updated", [None, "not a time", "1970-01-01T00:00:00Z"])
async def test_only_gos_zero_time_means_resigned(last_updated: str | None) -> None:
    clock = ManualClock()
    store = Writes(clock)
    doc = {"leaderID": "go-1", "leaderAddr": "10.0.0.9:8991"}
    if last_updated is not None:
        doc["lastUpdated"] = last_updated
    store.put_if_match(KEY, json.dumps(doc).encode(), None)
    follower = Elector(store, KEY, elector_id="py-1", address="py:1", config=config(5, 15), clock=clock)

    await follower.step()
    assert store.by.get("py-1") is None, "a missing or unreadable time is judged by staleness alone"
