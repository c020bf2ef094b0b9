"""The shard's reconciler, provider sync and GC on an injected clock (real SQLite file, sim provider).

Driven in-process without gRPC so that time can jump: registration timeouts, consistency grace and
record retention are crossed by advancing a ManualClock instead of sleeping. The loop-lag guards
(recovery, a burst of group edits, a burst of agents reporting) run here too, with the interpreter
settings the server runs with: a ``LagProbe`` on the test's loop bounds the longest stall relative to
the work's own duration, the best of up to three runs (a loaded machine's scheduling pause, which CI
once saw stretch one stall to 1.8 s of a 3.8 s run, lands in one run; a stall of ours is in each).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from shard_helpers import Leader, claim_registration, next_leaders_cache, no_sleep, sample_shard_identity

from nstance.config import GroupUpdate, runtime_hash
from nstance.core.clock import ManualClock
from nstance.core.errors import FailedPrecondition, Unavailable
from nstance.core.ids import new_instance_id
from nstance.core.ratelimit import TokenBucket
from nstance.db import repo
from nstance.db.engine import Database, open_database
from nstance.db.rows import InstanceRow
from nstance.objectstore.memory import MemoryObjectStore
from nstance.pki.ca import create_ca
from nstance.pki.keys import generate_private_key
from nstance.providers.base import InstanceStatus, ProviderInstance, ProviderThrottled
from nstance.providers.sim import SimProvider
from nstance.server.agents.hub import HealthReport
from nstance.server.app import tune_gc
from nstance.server.reconcile import recovery
from nstance.server.reconcile.gc import gc_cycle
from nstance.server.reconcile.reconciler import READ_CONCURRENCY, Reconciler
from nstance.server.reconcile.recovery import rebuild_cache
from nstance.server.shard.build import build_shard
from nstance.server.state import records
from nstance.server.state.configstate import ConfigState
from nstance.server.state.limits import CreateLimiter
from nstance.server.state.looplag import LagProbe
from nstance.server.state.metrics import Metrics
from nstance.testing.requests import sample_create_request
from nstance.testing.shardproc import server_addrs, shard_config
from nstance.testing.waiting import eventually

KEY = ("default", "web")


class Harness:
    def __init__(
        self,
        tmp_path: Path,
        size: int,
        drain_timeout: str = "0s",
        limits: dict[str, int] | None = None,
        dynamic_groups: dict[str, dict[str, dict[str, object]]] | None = None,
    ) -> None:
        self.clock = ManualClock()
        self.store = MemoryObjectStore()
        config = shard_config(
            addrs=server_addrs(),
            groups={"web": {"template": "app", "size": size}},
            shard_extra={
                "default_drain_timeout": drain_timeout,
                "garbage_collection": {
                    "interval": "1m",
                    "registration_timeout": "5m",
                    "deleted_record_retention": "30m",
                },
                "limits": limits or {},
            },
        )
        self.store.put("config.jsonc", json.dumps(config).encode())
        if dynamic_groups is not None:
            self.store.put("groups.jsonc", json.dumps(dynamic_groups).encode())
        self.db: Database = open_database(tmp_path / "db" / "nstance.db")
        self.state = ConfigState(self.store, tmp_path / "config", clock=self.clock)
        self.state.load()
        self.sim = SimProvider(clock=self.clock, sleep=no_sleep)
        ca = create_ca(cluster_id="test")
        self.leader = Leader()
        built = build_shard(
            identity=sample_shard_identity(ca.cert_pem),
            store=self.store,
            cluster_store=MemoryObjectStore(),
            db=self.db,
            config=self.state,
            provider=self.sim,
            nonce_key=generate_private_key("ed25519"),  # type: ignore[arg-type]
            ca=ca,
            clock=self.clock,
            limiter=CreateLimiter(
                clock=self.clock, max_concurrent=8, bucket=TokenBucket(100, 100, self.clock)
            ),
            leadership=self.leader,
            metrics=Metrics(),
        )
        self.ctx = built.ctx
        self.shard = built.shard
        self.reconciler = Reconciler(self.ctx, self.shard.ops)

    async def reconcile(self) -> None:
        await self.reconciler.reconcile(KEY)

    def rows(self) -> list[InstanceRow]:
        with self.db.read_session() as session:
            return repo.list_active_instances(session, tenant="default", group_key="web")

    def live(self) -> dict[str, str]:
        return {
            vm.instance_id: pid for pid, vm in self.sim.vms.items() if vm.status != InstanceStatus.DELETED
        }

    def record(self, instance_id: str) -> dict[str, object] | None:
        for key in self.store.list("instance/"):
            doc: dict[str, object] = json.loads(self.store.get(key)[0])
            if doc["instance_id"] == instance_id:
                return doc
        return None


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path, size=2)
    yield harness
    harness.db.close()


async def test_a_new_terms_first_pass_reads_a_small_group_at_once_while_big_reads_queue(h: Harness) -> None:
    """After a takeover nothing is known of a group's size but the count: a group of a few rows is read
    on the loop, not queued behind the reads of big groups (here: every read slot taken)."""
    await h.reconcile()
    assert len(h.rows()) == 2
    fresh = Reconciler(h.ctx, h.shard.ops)  # the next term's reconciler
    for _ in range(READ_CONCURRENCY):
        await fresh._reads.acquire()  # big groups' reads hold every slot
    await fresh.enqueue_all()
    await asyncio.wait_for(fresh.reconcile(KEY), timeout=5)
    assert fresh.reconciles == 1


async def test_a_pass_over_every_group_marks_the_groups_short_of_or_over_their_size_first(
    tmp_path: Path,
) -> None:
    """A new leader first acts where the count and the size differ (here a group resized just before
    the failover, and a removed group still holding an instance), then checks the groups at their
    size; every group is marked either way."""
    groups = {"a-idle": {"template": "app", "size": 0}, "z-resized": {"template": "app", "size": 1}}
    h = Harness(tmp_path, size=2, dynamic_groups={"default": groups})
    try:
        await h.reconcile()  # web: 2 of 2
        with h.db.session() as session:
            repo.insert_instance(
                session,
                instance_id="left",
                tenant="default",
                group_key="b-removed",
                kind="knc",
                nonce="jwt-left",
                now=h.clock.now(),
            )
        fresh = Reconciler(h.ctx, h.shard.ops)  # the next term's reconciler, its queue not running
        await fresh.enqueue_all()
        order = [await fresh.queue.get() for _ in range(4)]
        assert order == [
            ("default", "b-removed"),
            ("default", "z-resized"),
            ("default", "a-idle"),
            ("default", "web"),
        ]
        await fresh.close()
    finally:
        h.db.close()


async def test_reconcile_creates_with_records_and_provider_ids(h: Harness) -> None:
    await h.reconcile()
    rows = h.rows()
    assert len(rows) == 2
    assert set(h.live()) == {r.id for r in rows}
    assert all(row.provider_id for row in rows)  # the cache has the provider ids at once
    await h.shard.ops.followups.settled()  # the records get them once the burst is over
    for row in rows:
        rec = h.record(row.id)
        assert rec is not None
        assert rec["provider_instance_id"] == row.provider_id
        assert rec["registration_jwt"] == row.nonce
    await h.reconcile()  # level-triggered: nothing more to do
    assert len(h.live()) == 2


async def test_a_delete_whose_provider_call_failed_is_finished_for_that_same_instance(h: Harness) -> None:
    # Found by the simulation (seed 104730012): the provider throttled a scale-down's delete after the
    # record said ``deleting``; the row stayed active, its agent reconnected, and the next plan drained
    # another member. The VM ran on under a ``deleting`` record that nothing finished.
    await h.reconcile()
    victim = h.rows()[0]
    h.sim.fail_next("delete_instance", ProviderThrottled("sim: delete_instance throttled"))
    with pytest.raises(ProviderThrottled):
        await h.shard.ops.delete(victim, "scale-down")
    assert (h.record(victim.id) or {})["status"] == "deleting"
    assert victim.id in h.live()
    [row] = [r for r in h.rows() if r.id == victim.id]
    assert row.drain_started_at is not None  # no longer counted toward the group's size
    assert row.delete_at is not None
    assert row.delete_at <= h.clock.now()  # due at once
    await h.reconcile()
    assert victim.id not in h.live()
    assert (h.record(victim.id) or {})["status"] == "deleted"
    assert len(h.live()) == 2  # the group got a replacement, and nothing else was retired


async def test_gc_replaces_instances_that_never_register(h: Harness) -> None:
    await h.reconcile()
    first = set(h.live())
    h.clock.advance(timedelta(minutes=4))
    report = await gc_cycle(h.ctx, h.shard.ops)
    assert report.dangling == []
    h.clock.advance(timedelta(minutes=2))
    report = await gc_cycle(h.ctx, h.shard.ops)
    assert set(report.dangling) == first
    assert report.groups == {KEY}
    assert h.live() == {}
    await h.reconcile()
    assert len(h.live()) == 2
    assert not first & set(h.live())


async def test_registered_instances_are_not_dangling(h: Harness) -> None:
    await h.reconcile()
    register_all(h)
    h.clock.advance(timedelta(hours=1))
    assert (await gc_cycle(h.ctx, h.shard.ops)).dangling == []


async def test_stopped_vm_is_replaced_after_the_next_sync(h: Harness) -> None:
    await h.reconcile()
    victim_id, victim_pid = next(iter(h.live().items()))
    h.sim.set_status(victim_pid, InstanceStatus.STOPPED)
    report = await gc_cycle(h.ctx, h.shard.ops)
    assert KEY in report.groups
    await h.reconcile()
    assert victim_id not in h.live()
    assert len(h.live()) == 2
    assert h.record(victim_id)["status"] == "deleted"  # type: ignore[index]


async def test_the_provider_sync_and_the_gc_cycle_hold_off_the_collector_until_their_data_is_gone(
    h: Harness,
) -> None:
    # At 100,000 instances the listing and the rows, alive only during the pass, filled the young
    # generations: one collection walked them all and stopped the loop for 120-150 ms.
    await h.reconcile()
    collector_on_while_listing: list[bool] = []
    listing = h.sim.list_instances

    async def list_instances(cluster_id: str, shard: str) -> list[ProviderInstance]:
        collector_on_while_listing.append(gc.isenabled())
        return await listing(cluster_id, shard)

    h.sim.list_instances = list_instances  # type: ignore[method-assign]
    assert gc.isenabled()
    await recovery.sync_provider(h.ctx, h.shard.ops)
    assert gc.isenabled()
    await gc_cycle(h.ctx, h.shard.ops)  # its own pass runs sync_provider inside it
    assert gc.isenabled()
    assert collector_on_while_listing == [False, False]


def test_a_hold_set_again_unchanged_is_not_reported_again_and_clearing_it_ends_the_degradation(
    h: Harness,
) -> None:
    # Every reconcile of every group sets its replacement hold (usually to None), so an unchanged
    # hold returns at once without recounting the holds for the metrics and /health. What is
    # reported and what /health says must stay as they were.
    safety = h.shard.ops.safety
    reported: list[str] = []

    def report_error(tenant: str, group: str, instance_id: str, message: str) -> None:
        reported.append(message)

    safety.report_error = report_error  # type: ignore[method-assign]
    safety.set_hold("unexplained-vms i-1", "VM i-1 is kept", tenant="default", group="web")
    safety.set_hold("unexplained-vms i-1", "VM i-1 is kept", tenant="default", group="web")
    assert reported == ["VM i-1 is kept"]
    assert [d.component for d in h.ctx.degraded.current()] == ["unexplained_vms"]
    safety.set_hold("unexplained-vms i-1", None)
    safety.set_hold("unexplained-vms i-1", None)
    assert h.ctx.degraded.current() == []
    assert safety.holds.reason("unexplained-vms i-1") is None


async def test_vm_with_our_tags_but_no_record_is_adopted_then_scaled_down(h: Harness) -> None:
    await h.reconcile()
    stray = await h.sim.create_instance(
        sample_create_request(
            cluster_id="test",
            shard="zone-a",
            token="stray",
            instance_id="app06h0hk4z9hsr93qmg461rr6zrm",
            kind="app",
            template="app",
            subnet_id="net-1",
            created_at=h.clock.now(),
        )
    )
    report = await gc_cycle(h.ctx, h.shard.ops)
    assert stray.instance_id in h.live()  # adopted from its tags, not deleted
    assert report.groups == {KEY}
    rec = h.record(stray.instance_id)
    assert rec is not None
    assert rec["group"] == "web"
    assert rec["provider_instance_id"] == stray.provider_id
    await h.reconcile()
    assert len(h.live()) == 2  # the group is one over its size: scaled down like any other member


async def test_vm_of_a_failed_create_is_deleted_as_an_orphan(h: Harness) -> None:
    await h.reconcile()
    victim_id, _victim_pid = next(iter(h.live().items()))
    with h.db.session() as session:
        repo.mark_create_failed(session, victim_id, now=h.clock.now())
    report = await gc_cycle(h.ctx, h.shard.ops)
    assert victim_id not in h.live()
    assert report.groups == {KEY}


async def test_vm_gone_at_the_provider_is_replaced_after_the_grace(h: Harness) -> None:
    await h.reconcile()
    victim_id, victim_pid = next(iter(h.live().items()))
    h.sim.vanish(victim_pid)
    await gc_cycle(h.ctx, h.shard.ops)
    assert victim_id in {r.id for r in h.rows()}  # listed late is not gone yet
    h.clock.advance(timedelta(minutes=2))
    await gc_cycle(h.ctx, h.shard.ops)
    assert victim_id not in {r.id for r in h.rows()}
    await h.reconcile()
    assert len(h.live()) == 2


async def test_a_vm_gone_because_of_a_running_delete_is_left_to_that_delete(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CI under load: an operator's DeleteInstance was still waiting for its provider call when the GC
    # cycle's provider sync found the VM gone, took it for one that vanished on its own, and deleted
    # the instance a second time as "gone-at-provider". The watcher saw that reason, not the
    # operator's request.
    await h.reconcile()
    victim = h.rows()[0]
    original = h.sim.delete_instance
    calls: list[str] = []
    inside, release = asyncio.Event(), asyncio.Event()

    async def slow_delete(instance_id: str, provider_id: str) -> None:
        calls.append(instance_id)
        await original(instance_id, provider_id)  # the VM is gone from here on
        if len(calls) == 1:
            inside.set()
            await release.wait()

    monkeypatch.setattr(h.sim, "delete_instance", slow_delete)
    deleting = asyncio.create_task(h.shard.ops.delete(victim, "operator-request"))
    await asyncio.wait_for(inside.wait(), 10)
    h.clock.advance(timedelta(minutes=2))  # past the listing's grace: a missing VM would count as gone
    report = await recovery.sync_provider(h.ctx, h.shard.ops)  # what each GC cycle runs first
    release.set()
    await asyncio.wait_for(deleting, 10)
    assert calls == [victim.id]
    assert victim.id not in report.gone
    assert (h.record(victim.id) or {})["status"] == "deleted"
    assert victim.id not in h.shard.ops.retirer.deleting


async def test_a_deleted_status_the_record_could_not_take_is_written_by_the_next_gc_cycle(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Simulation seed 925256116: a scale-down's record writes (``deleting``, then ``deleted``) both
    # failed, the VM was deleted and the row retired, and nothing looked at that record again: it kept
    # saying ``pending`` for a VM that no longer existed. (The create path's ``failed`` is owed the same
    # way: test_create_intent.py.)
    await h.reconcile()
    victim = h.rows()[0]
    original = MemoryObjectStore.put_if_match

    def refuse_instances(self: MemoryObjectStore, key: str, data: bytes, etag: str | None) -> str:
        if key.startswith("instance/"):
            raise Unavailable("object storage is unreachable")
        return original(self, key, data, etag)

    monkeypatch.setattr(MemoryObjectStore, "put_if_match", refuse_instances)
    status_before = (h.record(victim.id) or {})["status"]
    await h.shard.ops.delete(victim, "scale-down")
    assert victim.id not in h.live()
    assert victim.id not in {r.id for r in h.rows()}
    assert (h.record(victim.id) or {})["status"] == status_before  # neither write reached it
    assert (await gc_cycle(h.ctx, h.shard.ops)).rewritten == []  # storage still refuses: still owed
    monkeypatch.undo()
    report = await gc_cycle(h.ctx, h.shard.ops)
    assert report.rewritten == [victim.id]
    assert (h.record(victim.id) or {})["status"] == "deleted"
    assert (await gc_cycle(h.ctx, h.shard.ops)).rewritten == []  # paid once


async def test_a_registered_row_whose_vm_no_listing_shows_is_retired_after_the_grace(h: Harness) -> None:
    # The other half of seed 925256116: a rebuild brings back such a record's row - registered, no
    # provider id (its follow-up had failed too). A registered agent means the VM existed, so the sync
    # waits for a listing to show it; one that never does within the grace is gone.
    await h.reconcile()
    await h.shard.ops.followups.settled()
    victim = h.rows()[0]
    records.update_record(
        h.store, "default", victim.id, provider_instance_id="", status="pending", registered_at=h.clock.now()
    )
    h.sim.vanish(str(victim.provider_id))  # deleted by a leader that could not write the record
    await rebuild_cache(h.ctx, h.shard.ops)
    [row] = [r for r in h.rows() if r.id == victim.id]
    assert (row.provider_id, row.vm_unproven) == (None, False)
    await gc_cycle(h.ctx, h.shard.ops)
    assert victim.id in {r.id for r in h.rows()}  # a listing this soon may not show it yet
    h.clock.advance(timedelta(minutes=2))
    report = await gc_cycle(h.ctx, h.shard.ops)
    assert victim.id not in {r.id for r in h.rows()}
    assert (h.record(victim.id) or {})["status"] == "deleted"
    assert KEY in report.groups
    await h.reconcile()
    assert len(h.live()) == 2


async def test_deleted_records_are_purged_after_retention(h: Harness) -> None:
    await h.reconcile()
    ids = set(h.live())
    await h.shard.upsert_group("default", "web", GroupUpdate(size=0))
    await h.reconcile()
    assert h.live() == {}
    assert all(h.record(i) is not None for i in ids)
    h.clock.advance(timedelta(minutes=29))
    assert (await gc_cycle(h.ctx, h.shard.ops)).purged == []
    h.clock.advance(timedelta(minutes=2))
    report = await gc_cycle(h.ctx, h.shard.ops)
    assert set(report.purged) == ids
    assert all(h.record(i) is None for i in ids)


async def test_rebuild_cache_from_records_after_losing_sqlite(h: Harness, tmp_path: Path) -> None:
    await h.reconcile()
    await (
        h.shard.ops.followups.settled()
    )  # provider ids in the records (a VM whose record lacks it: adopted by tag)
    before = {r.id: r.provider_id for r in h.rows()}
    h.db = h.ctx.db = next_leaders_cache(h.db, tmp_path)
    groups = await rebuild_cache(h.ctx, h.shard.ops)
    assert groups == {KEY}
    assert {r.id: r.provider_id for r in h.rows()} == before
    await h.reconcile()
    assert len(h.live()) == 2  # nothing duplicated


async def test_a_server_that_lost_leadership_does_not_touch_the_provider(h: Harness) -> None:
    h.leader.leading = False
    await h.reconcile()
    assert h.sim.calls["create_instance"] == 0
    with pytest.raises(Exception, match="no longer the shard leader"):
        await gc_cycle(h.ctx, h.shard.ops)


def register_all(h: Harness) -> None:
    with h.db.session() as session:
        for row in repo.list_instances(session):
            claim_registration(session, row, h.clock.now())


async def test_scale_down_drains_registered_instances_until_ack_or_deadline(tmp_path: Path) -> None:
    h = Harness(tmp_path, size=3, drain_timeout="5m")
    await h.reconcile()
    register_all(h)
    ids = sorted(h.live())
    async with h.ctx.events.instances.subscribe("default") as live:
        await h.shard.upsert_group("default", "web", GroupUpdate(size=1))
        await h.reconcile()
        notices = [await anext(live) for _ in range(2)]
    assert {n.status for n in notices} == {"pending_deletion"}
    assert {n.delete_at for n in notices} == {h.clock.now() + timedelta(minutes=5)}
    draining = {n.instance_id for n in notices}
    assert len(h.live()) == 3  # nothing deleted before the operator drained the nodes
    assert {v.instance_id for v, _, _ in h.shard.draining_instances("default")} == draining

    keeper = (set(ids) - draining).pop()
    with pytest.raises(FailedPrecondition, match="not being drained"):
        await h.shard.acknowledge_drained("default", keeper)
    acked, waiting = sorted(draining)
    await h.shard.acknowledge_drained("default", acked)
    await h.reconcile()
    assert set(h.live()) == {keeper, waiting}
    h.clock.advance(timedelta(minutes=5, seconds=1))
    with h.db.session() as session:  # the keeper's agent kept reporting meanwhile
        repo.record_health_many(
            session,
            [{"instance_id": keeper, "health_at": h.clock.now(), "health": {}, "runtime_config_hash": None}],
        )
    await h.reconcile()
    assert set(h.live()) == {keeper}
    h.db.close()


def _record(iid: str, status: str, at: datetime) -> records.InstanceRecord:
    return records.InstanceRecord(
        instance_id=iid,
        tenant="default",
        group="web",
        created_at=at,
        last_updated=at,
        status=status,
        provider_instance_id=f"vm-{iid[-6:]}",
        registration_jwt=f"jwt-{iid}",
    )


async def test_rebuild_in_batches_restores_deletes_and_drops(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recovery, "REBUILD_BATCH", 2)  # several batches from six records
    now = h.clock.now()
    running = [str(new_instance_id("app")) for _ in range(4)]
    gone, stray, tomb = (str(new_instance_id("app")) for _ in range(3))
    for iid in running:
        records.write_record(h.store, _record(iid, "running", now))
    records.write_record(h.store, _record(gone, "deleted", now))
    records.write_record(h.store, _record(tomb, "deleted", now - timedelta(hours=1)))
    with h.db.session() as session:  # rows the cache holds: one whose record says deleted, one without
        for iid in (gone, stray):
            repo.insert_instance(
                session,
                instance_id=iid,
                tenant="default",
                group_key="web",
                kind="app",
                nonce=f"n-{iid}",
                now=now,
            )
    groups = await rebuild_cache(h.ctx, h.shard.ops)
    assert groups == {KEY}
    with h.db.read_session() as session:
        assert repo.live_instance_ids(session) == set(running)
        rows = repo.get_instances(session, [*running, gone, stray, tomb])
    by_id = {row.id: row for row in rows}
    assert all(by_id[iid].provider_status == "running" for iid in running)
    assert by_id[gone].deleted_at == now  # its row is marked deleted
    assert by_id[tomb].deleted_at == now - timedelta(hours=1)  # no row: a tombstone from the record
    assert stray not in by_id  # no record: the row is forgotten, not marked deleted


@pytest.fixture
def server_runtime() -> Iterator[None]:
    """The interpreter settings the server runs with (``tune_gc``), restored afterwards.

    Without them a test would measure what the daemon never does: a full collection walking every
    object the test session has accumulated, and worker threads keeping the GIL for 5 ms turns.
    """
    thresholds, switch = gc.get_threshold(), sys.getswitchinterval()
    tune_gc()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(switch)


async def least_stall(trial: Callable[[int], Awaitable[None]], *, bound: float, trials: int = 3) -> float:
    """Run ``trial(n)`` under a lag probe until its longest stall is under ``bound`` of its duration.

    Returns the smallest ratio seen. The code's own stalls are in every trial; a loaded machine's
    scheduling pause only adds to a trial, so the best of a few is the estimate (as ``timeit`` takes
    the minimum). A stall that is ours shows in all of them.
    """
    best = float("inf")
    for n in range(trials):
        async with probing() as probe:
            started = time.monotonic()
            await trial(n)
            took = time.monotonic() - started
        assert probe.samples > 0
        best = min(best, probe.max_lag / took)
        if best < bound:
            break
    return best


@contextlib.asynccontextmanager
async def probing(interval: float = 0.01) -> AsyncIterator[LagProbe]:
    """A lag probe running on this loop for the duration of the block (one more sample after it)."""
    probe = LagProbe(interval=interval)
    task = asyncio.create_task(probe.run())
    try:
        yield probe
        done = probe.samples
        await eventually(lambda: probe.samples > done, within=10, what="a probe sample after the work")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.usefixtures("server_runtime")
async def test_rebuilding_thousands_of_records_does_not_stall_the_event_loop(h: Harness) -> None:
    # One row at a time on the loop took about a millisecond per record: 6,000 records held the loop
    # for about 90 % of the rebuild. Batches in worker threads leave it free. The bound is relative to
    # the rebuild's own duration, so a loaded machine (which stretches both) does not make it flaky.
    now = h.clock.now()
    for _ in range(6000):
        records.write_record(h.store, _record(str(new_instance_id("app")), "running", now))

    async def rebuild(_: int) -> None:
        await rebuild_cache(h.ctx, h.shard.ops)

    # Run on the loop, the rebuild held it for 0.98 of its duration.
    ratio = await least_stall(rebuild, bound=0.5)
    with h.db.read_session() as session:
        assert len(repo.live_instance_ids(session)) == 6000
    assert ratio < 0.5


@pytest.mark.usefixtures("server_runtime")
async def test_a_burst_of_group_edits_in_a_large_shard_does_not_stall_the_event_loop(tmp_path: Path) -> None:
    # 5,000 groups in one tenant, 400 concurrent UpsertGroups: they fold into a few groups.jsonc
    # writes whose edits, serialisation, object-store write and snapshot update run in a worker
    # thread in short GIL-sharing steps. Applied on the loop, one batch of edits held it for most of
    # the burst. The bound is relative to the burst's own duration (a loaded machine stretches both).
    groups = {f"g{i:05d}": {"template": "app", "size": 0} for i in range(5000)}
    h = Harness(
        tmp_path, size=0, limits={"max_groups_per_tenant": 10_000}, dynamic_groups={"default": groups}
    )
    edited = range(0, 4000, 10)

    async def burst(n: int) -> None:
        await asyncio.gather(
            *(h.shard.upsert_group("default", f"g{i:05d}", GroupUpdate(size=n + 1)) for i in edited)
        )

    try:
        # 0.08 to 0.12 of the burst measured on an idle machine; the writer or the answers' queries
        # on the loop gave 0.59 and 0.68.
        ratio = await least_stall(burst, bound=0.45)
        snapshot = h.state.snapshot()
        assert snapshot is not None
        sizes = {snapshot.dynamic["default"][f"g{i:05d}"].size for i in edited}
        assert len(sizes) == 1  # every edit of the last burst landed
        assert h.store.get("groups.jsonc")[0].count(f'"size": {sizes.pop()}'.encode()) == len(edited)
        assert ratio < 0.45
    finally:
        h.db.close()


@pytest.mark.usefixtures("server_runtime")
async def test_thousands_of_agents_reconnecting_at_once_do_not_stall_the_event_loop(h: Harness) -> None:
    # 3,000 agents open their health streams in the same loop turn (a new leader, a network blip)
    # and report ten times each. Their instance rows were read one by one on the loop: that turn
    # held the loop for most of the run. Now they are read in bulk in a worker thread, and the
    # reports are written in batches on the database-writer thread.
    now = h.clock.now()
    ids = [str(new_instance_id("app")) for _ in range(3000)]
    for iid in ids:
        records.write_record(h.store, _record(iid, "running", now))
    await rebuild_cache(h.ctx, h.shard.ops)
    merged = h.state.merged(*KEY)
    assert merged is not None
    in_sync = runtime_hash(merged)  # agents in sync: no files to push (pushing is not measured here)
    rng = random.Random(15)

    async def agent(iid: str) -> None:
        async def reports() -> AsyncIterator[HealthReport]:
            for count in range(10):
                yield HealthReport(instance_id=iid, count=count, metrics={"cpu": 0.5}, config_hash=in_sync)
                await asyncio.sleep(rng.uniform(0, 0.2))  # agents report at their own pace

        await h.shard.agents.health(iid, reports())

    async def reconnect(_: int) -> None:
        await asyncio.gather(*(agent(iid) for iid in ids))
        await h.shard.agents.flushed()

    # Measured 0.21 of the run (loaded machine) with the bulk reads; the per-agent reads on the loop
    # held it for 0.7 (19.9 s of 28.2 s).
    ratio = await least_stall(reconnect, bound=0.45)
    await h.shard.agents.close()
    with h.db.read_session() as session:
        rows = repo.get_instances(session, ids)
    assert len(rows) == 3000
    assert all(row.health_at is not None for row in rows)
    assert ratio < 0.45
