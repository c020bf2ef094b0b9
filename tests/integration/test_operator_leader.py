"""Lease election between operator replicas, on the Kubernetes API emulator with a real shard server.

What a user sees: of two replicas exactly one runs the controllers; when it stops the other takes over
(at its next poll when the Lease was released, within the lease duration when it was not); a leader
that cannot renew its Lease stops acting at once, before anyone else may start; the Lease object
carries holder, duration, times and transitions as client-go writes them; a replica always stops when
told to — even when the stop arrives just as a Lease write completes — and a released Lease stays free
for a standby.

Every wait is bounded and fails with what it waited for (a replica that does not stop fails with the
place it is stuck at) instead of running into the suite's timeout. Nothing is proven by a pause or a
stopwatch: "never took over" and "took over at once" are counted in Lease reads, "stopped first" is the
order of recorded starts and stops.
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nstance.operator.context import OperatorContext
from nstance.operator.kube import CONFIGMAPS, LEASES, SECRETS, Kube, KubeError, load_configuration
from nstance.operator.leader import LeaseElector
from nstance.operator.runtime import OperatorRuntime, RuntimeOptions
from nstance.operator.settings import build_settings
from nstance.testing.kubeapi import KubeAPIServer
from nstance.testing.shardproc import (
    LocalCluster,
    ServerProcess,
    free_port,
    server_addrs,
    shard_config,
    start_leader,
)
from nstance.testing.waiting import eventually

LEASE = "nstance-operator-leader-election"
DURATION, RENEW, DEADLINE = 2.0, 0.3, 1.2
STOP_WITHIN = 15.0
"""A cancelled replica normally ends in well under a second; this much means it hangs."""
POLLS_PAST_EXPIRY = math.ceil(DURATION / RENEW) + 2
"""A standby's Lease reads start at least RENEW apart and it takes over a Lease left unchanged for
DURATION; so this many reads span more than DURATION, and a standby that made them without taking over
saw the Lease renewed all along (counted reads, not a pause, prove the absence)."""


@dataclass
class Activity:
    """Start/stop of the controllers of each replica, in order, with monotonic times."""

    events: list[tuple[str, str, float]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self, name: str, what: str) -> None:
        self.events.append((name, what, time.monotonic()))
        self.changed.set()

    def active(self) -> set[str]:
        running: set[str] = set()
        for name, what, _ in self.events:
            (running.add if what == "start" else running.discard)(name)
        return running

    def max_concurrent(self) -> int:
        running: set[str] = set()
        most = 0
        for name, what, _ in self.events:
            (running.add if what == "start" else running.discard)(name)
            most = max(most, len(running))
        return most

    def when(self, name: str, what: str) -> float:
        return [t for n, w, t in self.events if (n, w) == (name, what)][-1]

    async def wait(self, check: Callable[[], bool], what: str, within: float = 15.0) -> None:
        await eventually(
            check, within=within, what=lambda: f"{what}; controllers: {self.summary()}", wake=self.changed
        )

    def summary(self) -> str:
        start = self.events[0][2] if self.events else 0.0
        return ", ".join(f"{name} {what} at +{at - start:.2f}s" for name, what, at in self.events) or "none"


class Probe:
    """Stands in for the sync manager: records while it runs."""

    def __init__(self, name: str, activity: Activity, ctx: OperatorContext) -> None:
        self.name, self.activity, self.ctx = name, activity, ctx

    async def run(self) -> None:
        self.activity.record(self.name, "start")
        try:
            await asyncio.Event().wait()
        finally:
            self.activity.record(self.name, "stop")


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, dict[str, str], Path]]:
    root = tmp_path_factory.mktemp("leader")
    cluster = LocalCluster(root / "bucket")
    cluster.init()
    addrs = server_addrs()
    cluster.write_config("zone-a", shard_config(shard="zone-a", addrs=addrs))
    process: ServerProcess = start_leader(cluster, root / "server", shard="zone-a")
    try:
        yield cluster, addrs, root
    finally:
        process.stop()


@pytest.fixture
async def emulator(
    tmp_path: Path, shard: tuple[LocalCluster, dict[str, str], Path]
) -> AsyncIterator[tuple[KubeAPIServer, Kube, Path, Path]]:
    cluster, addrs, root = shard
    identity = cluster.operator_identity(root / "identity")
    config = tmp_path / "config.yaml"
    reg, op = addrs["registration_addr"], addrs["operator_addr"]
    shards = f"shards:\n  zone-a: {{registration_addr: '{reg}', operator_addr: '{op}'}}\n"
    config.write_text(f"cluster_id: test\ntenant: default\n{shards}")
    async with KubeAPIServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        kube = Kube.from_configuration(await load_configuration(str(kubeconfig)))
        ca = (identity / "ca.crt").read_text()
        await kube.create(
            CONFIGMAPS, {"metadata": {"name": "nstance-cluster-ca"}, "data": {"ca.crt": ca}}, "default"
        )
        data = {
            "tls.crt": base64.b64encode((identity / "identity.crt").read_bytes()).decode(),
            "tls.key": base64.b64encode((identity / "identity.key").read_bytes()).decode(),
        }
        secret = {"metadata": {"name": "nstance-operator-cert"}, "type": "kubernetes.io/tls", "data": data}
        await kube.create(SECRETS, secret, "default")
        try:
            yield server, kube, kubeconfig, config
        finally:
            await kube.close()


def replica(name: str, kubeconfig: Path, config: Path, activity: Activity) -> OperatorRuntime:
    settings = build_settings(
        namespace="default",
        kubeconfig=str(kubeconfig),
        config_file=config,
        health_addr=f"127.0.0.1:{free_port()}",
        disable_webhooks=True,
        leader_elect_lease_duration=f"{DURATION}s",
        leader_elect_renew_interval=f"{RENEW}s",
        leader_elect_renew_deadline=f"{DEADLINE}s",
        holder_identity=name,
        environ={},
    )

    async def no_cluster(ctx: OperatorContext) -> None:
        return None

    return OperatorRuntime(
        settings,
        options=RuntimeOptions(run_kopf=False),
        ensure_cluster=no_cluster,
        components=[("probe", lambda ctx: Probe(name, activity, ctx))],
    )


async def stop(*tasks: asyncio.Task[Any]) -> None:
    """Cancel replicas (or electors) and wait, bounded, until they have ended; one that does not end
    fails the test with the place it is stuck at."""
    for task in tasks:
        task.cancel()
    _, pending = await asyncio.wait(tasks, timeout=STOP_WITHIN)
    stuck = []
    for task in pending:
        where = io.StringIO()
        task.print_stack(file=where)
        stuck.append(f"{task.get_name()}:\n{where.getvalue()}")
    if stuck:
        pytest.fail(f"did not stop within {STOP_WITHIN:g}s of being cancelled:\n" + "\n".join(stuck))
    for task in tasks:
        if not task.cancelled() and (error := task.exception()) is not None:
            raise AssertionError(f"{task.get_name()} failed instead of stopping: {error!r}") from error


def start(runtime: OperatorRuntime, name: str) -> asyncio.Task[None]:
    return asyncio.create_task(runtime.run(), name=f"replica {name}")


async def test_exactly_one_replica_acts_and_a_released_lease_is_taken_over_at_once(
    emulator: tuple[KubeAPIServer, Kube, Path, Path],
) -> None:
    _, kube, kubeconfig, config = emulator
    activity = Activity()
    a, b = replica("a", kubeconfig, config, activity), replica("b", kubeconfig, config, activity)
    tasks = {"a": start(a, "a"), "b": start(b, "b")}
    try:
        await activity.wait(lambda: len(activity.active()) == 1, "one replica to lead")
        leader = next(iter(activity.active()))
        other = "b" if leader == "a" else "a"
        # The standby keeps reading the renewed Lease and never takes it over.
        standby = await gate({"a": a, "b": b}[other])
        await eventually(
            lambda: standby.reads >= POLLS_PAST_EXPIRY, what=f"{POLLS_PAST_EXPIRY} Lease reads by {other}"
        )
        assert activity.active() == {leader}
        assert activity.max_concurrent() == 1
        lease = await kube.get(LEASES, LEASE, "default")
        assert lease is not None
        spec = lease["spec"]
        assert spec["holderIdentity"] == leader
        assert spec["leaseDurationSeconds"] == 2
        assert spec["renewTime"].endswith("Z")
        assert spec["leaseTransitions"] == 0
        ready = {name: runtime.readiness() for name, runtime in (("a", a), ("b", b))}
        assert ready[other][0]
        assert ready[other][1].startswith(f"standby: following Lease default/{LEASE} (held by {leader})")

        await stop(tasks.pop(leader))  # graceful: the Lease is released
        released_at = standby.reads
        await activity.wait(
            lambda: activity.active() == {other},
            f"{other} to take the released Lease over",
            within=DURATION + 3,
        )
        # At once: at its next read (counted, so a slow machine cannot fail it), not after the duration.
        assert standby.reads - released_at <= 1
        assert activity.max_concurrent() == 1
        lease = await kube.get(LEASES, LEASE, "default")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == other
        assert lease["spec"]["leaseTransitions"] == 1
    finally:
        await stop(*tasks.values())


async def test_a_crashed_leader_is_replaced_within_the_lease_duration(
    emulator: tuple[KubeAPIServer, Kube, Path, Path],
) -> None:
    _, _, kubeconfig, config = emulator
    activity = Activity()
    a = replica("a", kubeconfig, config, activity)
    task_a = start(a, "a")
    b = replica("b", kubeconfig, config, activity)
    task_b: asyncio.Task[None] | None = None
    try:
        await activity.wait(lambda: activity.active() == {"a"}, "a to lead")
        task_b = start(b, "b")
        watcher = await gate(b)
        await eventually(
            lambda: b.elector is not None and b.elector.holder == "a", what="b to follow a's Lease"
        )

        # A crash: no release, no more renewals.
        assert a.elector is not None

        async def no_release() -> None:
            return None

        a.elector.release = no_release  # type: ignore[method-assign]
        crashed_at = time.monotonic()
        reads_at_crash = watcher.reads
        await stop(task_a)
        assert "a" not in activity.active()
        await activity.wait(
            lambda: activity.active() == {"b"}, "b to take over the expired Lease", within=DURATION + 3
        )
        took = activity.when("b", "start") - crashed_at
        assert took >= DURATION - 2 * RENEW  # b waited for the Lease to expire...
        # ...and took it over at one of its first reads after that (counted, so a slow machine, which
        # stretches the time between reads, cannot fail it).
        assert watcher.reads - reads_at_crash <= POLLS_PAST_EXPIRY
    finally:
        await stop(task_a, *([task_b] if task_b is not None else []))


class Unreachable:
    """A Kube whose Lease calls hang (a partition between the leader and the API server)."""

    def __init__(self, real: Kube) -> None:
        self.real = real

    async def get(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()

    async def replace(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()

    async def create(self, *args: Any, **kwargs: Any) -> Any:
        raise KubeError(503, "ServiceUnavailable", "partitioned")


async def test_a_leader_that_cannot_renew_stops_acting_before_anyone_else_starts(
    emulator: tuple[KubeAPIServer, Kube, Path, Path],
) -> None:
    _, _, kubeconfig, config = emulator
    activity = Activity()
    a = replica("a", kubeconfig, config, activity)
    task_a = start(a, "a")
    b = replica("b", kubeconfig, config, activity)
    task_b: asyncio.Task[None] | None = None
    try:
        await activity.wait(lambda: activity.active() == {"a"}, "a to lead")
        task_b = start(b, "b")
        await eventually(
            lambda: b.elector is not None and b.elector.holder == "a", what="b to follow a's Lease"
        )
        assert a.elector is not None
        a.elector.kube = Unreachable(a.kube)  # type: ignore[assignment]
        await activity.wait(
            lambda: "a" not in activity.active(), "a to stop acting without its Lease", within=DURATION + 3
        )
        assert not a.readiness()[0] or a.readiness()[1].startswith("standby")
        await activity.wait(
            lambda: activity.active() == {"b"}, "b to take over the unrenewed Lease", within=DURATION + 3
        )
        # Fencing: a stopped acting before b began (b waits until the Lease went unrenewed for
        # DURATION on its own clock; a stops RENEW_DEADLINE after its last renewal began).
        assert activity.when("a", "stop") < activity.when("b", "start")
        assert activity.max_concurrent() == 1
        assert task_a.done() is False  # the replica stays up, as a standby
    finally:
        await stop(task_a, *([task_b] if task_b is not None else []))


class Gated:
    """The elector's Kube with a hook on its Lease writes, to time a cancel or a release exactly, and
    a count of the Lease calls it began (a standby's reads are its polls)."""

    def __init__(self, real: Kube) -> None:
        self.real = real
        self.reads = 0
        self.writes = 0
        self.hold_before: asyncio.Event | None = None
        """While set, the next write waits for this event before it reaches the API server."""
        self.hold_after: asyncio.Event | None = None
        """While set, the next write waits for this event after the API server has answered it."""
        self.held = asyncio.Event()

    async def get(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        return await self.real.get(*args, **kwargs)

    async def create(self, *args: Any, **kwargs: Any) -> Any:
        self.writes += 1
        return await self.real.create(*args, **kwargs)

    async def replace(self, *args: Any, **kwargs: Any) -> Any:
        self.writes += 1
        before, self.hold_before = self.hold_before, None
        if before is not None:
            self.held.set()
            await before.wait()
        result = await self.real.replace(*args, **kwargs)
        after, self.hold_after = self.hold_after, None
        if after is not None:
            self.held.set()
            await after.wait()
        return result


async def gate(runtime: OperatorRuntime) -> Gated:
    """Put a (counting) Gated between a replica's elector and the API server, once it has one."""
    await eventually(lambda: runtime.elector is not None, what="the replica's elector")
    assert runtime.elector is not None
    gated = Gated(runtime.elector.kube)
    runtime.elector.kube = gated  # type: ignore[assignment]
    return gated


def elector(kube: Gated, name: str) -> LeaseElector:
    return LeaseElector(
        kube,  # type: ignore[arg-type]
        "default",
        LEASE,
        name,
        lease_duration=DURATION,
        renew_interval=RENEW,
        renew_deadline=DEADLINE,
    )


async def until(event: asyncio.Event, what: str, within: float = 10.0) -> None:
    """Await ``event`` (an event, not polled state: the test acts in the turn it is set)."""
    try:
        async with asyncio.timeout(within):
            await event.wait()
    except TimeoutError:
        raise AssertionError(f"timed out after {within:g}s waiting for {what}") from None


async def test_a_replica_stopped_just_as_its_lease_write_completes_stops_and_renews_no_more(
    emulator: tuple[KubeAPIServer, Kube, Path, Path],
) -> None:
    _, kube, _, _ = emulator
    gated = Gated(kube)
    a = elector(gated, "a")
    task = asyncio.create_task(a.run(), name="elector a")
    try:
        await until(_leading(a), "a to take the Lease")
        # The next renewal reaches the API server; the stop arrives in the same turn of the event loop
        # in which its answer is handed back (Python 3.11's wait_for lost such a cancel).
        answer = gated.hold_after = asyncio.Event()
        await until(gated.held, "a renewal")
        answer.set()
        await asyncio.sleep(0)
        await stop(task)
        writes = gated.writes
        # A standby takes the Lease over only once it went unrenewed for DURATION: that it does, and
        # that a wrote nothing meanwhile, proves a renews no more.
        b = elector(Gated(kube), "b")
        standby = asyncio.create_task(b.run(), name="elector b")
        try:
            await until(_leading(b), "b to take the unrenewed Lease over")
            assert gated.writes == writes, "a stopped elector kept renewing its Lease"
        finally:
            await stop(standby)
    finally:
        await stop(task)


async def test_a_release_during_a_renewal_leaves_the_lease_free_for_a_standby(
    emulator: tuple[KubeAPIServer, Kube, Path, Path],
) -> None:
    _, kube, _, _ = emulator
    gated = Gated(kube)
    a = elector(gated, "a")
    task = asyncio.create_task(a.run(), name="elector a")
    try:
        await until(_leading(a), "a to take the Lease")
        # A renewal is on its way to the API server when the replica shuts down.
        resume = gated.hold_before = asyncio.Event()
        await until(gated.held, "a renewal")
        releasing = asyncio.create_task(a.release(), name="release")
        await asyncio.sleep(0)
        resume.set()
        done, _ = await asyncio.wait([releasing], timeout=STOP_WITHIN)
        assert done, f"release() did not finish within {STOP_WITHIN:g}s"
        assert not a.is_leader()
        assert task.done(), "release() left the election loop running"
        # The Lease stays free: neither the renewal in flight nor a later poll takes it back. A standby
        # finds it free at its first read and takes it at once; a writes nothing more.
        writes = gated.writes
        lease = await kube.get(LEASES, LEASE, "default")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "", "the released Lease was taken back"
        watcher = Gated(kube)
        b = elector(watcher, "b")
        standby = asyncio.create_task(b.run(), name="elector b")
        try:
            await until(_leading(b), "b to take the released Lease")
            assert watcher.reads == 1, "the released Lease was not free at b's first read"
            assert gated.writes == writes, "a wrote the Lease after its release"
            assert not a.is_leader()
        finally:
            await stop(standby)
    finally:
        await stop(task)


def _leading(candidate: LeaseElector) -> asyncio.Event:
    leading = asyncio.Event()
    candidate.on_change.append(lambda now: leading.set() if now else None)
    if candidate.is_leader():
        leading.set()
    return leading
