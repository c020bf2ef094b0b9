"""Bad, missing or unreadable state never destroys a fleet: corrupt and lost instance records, the
mass-deletion brake, and creates that race the provider re-list (sim provider, real SQLite file)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from shard_helpers import next_leaders_cache
from test_shard_gc import KEY, Harness, register_all

from nstance.config import GroupUpdate
from nstance.core.errors import Unavailable
from nstance.core.ids import new_instance_id
from nstance.db import repo
from nstance.providers.base import CreateRequest, ProviderInstance
from nstance.server.reconcile.gc import gc_cycle
from nstance.server.reconcile.recovery import rebuild_cache, sync_provider
from nstance.server.reconcile.restore import restore_missing_records
from nstance.server.shard.api import InstanceRequest
from nstance.server.state.records import record_key
from nstance.testing.requests import sample_create_request
from nstance.testing.waiting import eventually


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path, size=3)
    yield harness
    harness.db.close()


def lose_cache(h: Harness, tmp_path: Path) -> None:
    h.db = h.ctx.db = next_leaders_cache(h.db, tmp_path)


def delete_records(h: Harness) -> None:
    """Every instance record gone from object storage (a bad lifecycle rule, a script, by hand)."""
    for key in list(h.store.list("instance/")):
        h.store.delete(key)


async def new_leader(h: Harness) -> None:
    await rebuild_cache(h.ctx, h.shard.ops)
    await sync_provider(h.ctx, h.shard.ops)


async def make_vm(h: Harness, **changes: Any) -> None:
    """A VM of group ``web`` as a leader of this shard makes it (tags included), with no row or record."""
    request = sample_create_request(
        cluster_id="test",
        shard="zone-a",
        kind="app",
        template="app",
        subnet_id="net-1",
        created_at=h.clock.now(),
    )
    await h.sim.create_instance(dataclasses.replace(request, **changes))


def key_of(instance_id: str) -> str:
    return record_key("default", instance_id)


@pytest.mark.parametrize(
    "damage",
    [b"\x00garbage\xff", b"", b'{"instance_id": 7, "tenant": "default", "group": "web"}'],
    ids=["garbage", "empty", "wrong-type"],
)
async def test_a_corrupt_record_is_reported_and_still_claims_its_vm(
    h: Harness, tmp_path: Path, damage: bytes
) -> None:
    await h.reconcile()
    await h.shard.ops.followups.settled()
    victim = sorted(h.live())[0]
    h.store.put(key_of(victim), damage)
    lose_cache(h, tmp_path)
    async with h.ctx.events.errors.subscribe("default") as errors:
        await new_leader(h)
        await gc_cycle(h.ctx, h.shard.ops)
        first = await asyncio.wait_for(anext(errors), 5)
    assert victim in h.live()  # not deleted as an orphan
    assert "unreadable instance record" in first.error
    assert victim in first.instance_id
    assert h.ctx.metrics.unreadable_records._value.get() == 1
    assert "cannot be read" in (h.shard.ops.holds.summary() or "")
    assert victim in (h.shard.ops.holds.summary() or "")


async def test_an_instance_whose_record_is_unreadable_is_refused_not_unknown(
    h: Harness, tmp_path: Path
) -> None:
    # "unknown" tells the operator there is nothing to delete, while the VM runs on (kept for the
    # unreadable record): it must retry once the record is repaired instead.
    await h.reconcile()
    await h.shard.ops.followups.settled()
    victim = sorted(h.live())[0]
    good = h.store.get(key_of(victim))[0]
    h.store.put(key_of(victim), b"\x00garbage\xff")
    lose_cache(h, tmp_path)
    await new_leader(h)

    with pytest.raises(Unavailable, match="cannot be read; retry once it is repaired"):
        await h.shard.delete_instance("default", victim)
    with pytest.raises(Unavailable, match="cannot be read"):  # nor "not found" to a status query
        await h.shard.instance_status("default", victim)
    assert victim in h.live()
    assert await h.shard.delete_instance("default", "app" + "0" * 23) == "unknown"

    h.store.put(key_of(victim), good)  # repaired: the next GC cycle reads it again
    await gc_cycle(h.ctx, h.shard.ops)
    assert await h.shard.delete_instance("default", victim) == "deleted"
    assert victim not in h.live()


async def test_a_deleted_instance_prefix_is_rebuilt_by_adoption(h: Harness, tmp_path: Path) -> None:
    await h.reconcile()
    spare = h.ctx.config.merged("default", "web")
    assert spare is not None
    on_demand = await h.shard.ops.create(spare, on_demand=True)
    before = dict(h.live())
    assert len(before) == 4
    delete_records(h)
    lose_cache(h, tmp_path)
    await new_leader(h)
    await h.reconcile()
    assert h.live() == before  # nothing deleted, nothing recreated
    assert h.sim.calls["delete_instance"] == 0
    rec = h.record(on_demand.instance_id)
    assert rec is not None
    assert rec["on_demand"] is True
    assert rec["provider_instance_id"] == before[on_demand.instance_id]


async def test_an_instance_type_changed_after_adoption_rotates_the_adopted_vms(
    h: Harness, tmp_path: Path
) -> None:
    # Adopted VMs have no recorded infra hash. Their instance type is known (the provider lists it),
    # so a change made after the adoption still reaches them; before, they kept the old type for ever.
    await h.shard.upsert_group("default", "web", GroupUpdate(instance_type="m7i.large"))
    await h.reconcile()
    before = dict(h.live())
    delete_records(h)
    lose_cache(h, tmp_path)
    await new_leader(h)
    await h.reconcile()
    assert h.live() == before  # the adoption alone rotates nothing: the instance type is the group's
    assert all(row.infra_config_hash is None for row in h.rows())

    await h.shard.upsert_group("default", "web", GroupUpdate(instance_type="m7i.xlarge"))
    for _ in range(len(before) * 2):  # one rotation per pass: a replacement, then the old VM goes
        await h.reconcile()
    types = {vm.instance_type for vm in h.sim.vms.values() if vm.instance_id in h.live()}
    assert types == {"m7i.xlarge"}
    assert len(h.live()) == len(before)
    assert not set(before) & set(h.live())


async def adopt_one_from_a_retired_template(h: Harness, tmp_path: Path) -> tuple[dict[str, str], str]:
    """The group's instances (id -> provider id) and one of them, made from template "retired", all
    adopted by a new leader after their records and its cache were lost."""
    await h.reconcile()
    before = dict(h.live())
    stale = sorted(before)[0]
    h.sim._records[before[stale]].template = "retired"  # a VM made from an older template
    delete_records(h)
    lose_cache(h, tmp_path)
    await new_leader(h)
    return before, stale


async def test_an_adopted_vm_made_from_another_template_is_rotated(h: Harness, tmp_path: Path) -> None:
    # The adopted record takes the template the VM's tags name, not the group's current one: a VM
    # made from a template the group has left since is drift, found without a recorded hash.
    before, stale = await adopt_one_from_a_retired_template(h, tmp_path)
    assert (h.record(stale) or {}).get("config", {})["template"] == "retired"  # type: ignore[index]

    for _ in range(2 * len(before)):
        await h.reconcile()
    assert stale not in h.live()
    assert set(before) - {stale} <= set(h.live())  # the others run the group's template: kept


async def test_a_record_written_back_from_the_cache_keeps_the_template_an_adopted_vm_runs(
    h: Harness, tmp_path: Path
) -> None:
    # A record written back from a cache row took the group's current template. For an adopted VM (no
    # infra hash) the next leader then saw no drift, and the VM kept its old template for ever
    # (simulation seed 547780810).
    before, stale = await adopt_one_from_a_retired_template(h, tmp_path)
    delete_records(h)  # lost again; this time the leader's cache still has the rows
    restored = await restore_missing_records(h.ctx, h.shard.ops, settle=timedelta(0))
    assert stale in restored
    assert (h.record(stale) or {}).get("config", {})["template"] == "retired"  # type: ignore[index]

    lose_cache(h, tmp_path)
    await new_leader(h)  # rebuilt from the written-back records
    for _ in range(2 * len(before)):
        await h.reconcile()
    assert stale not in h.live()
    assert set(before) - {stale} <= set(h.live())


async def test_orphan_deletions_are_braked_per_group(h: Harness) -> None:
    await h.shard.upsert_group("default", "web", GroupUpdate(size=8))
    await h.reconcile()
    ids = sorted(h.live())
    with h.db.session() as session:
        for iid in ids:
            repo.mark_create_failed(session, iid, now=h.clock.now())
    async with h.ctx.events.errors.subscribe("default") as errors:
        report = await sync_provider(h.ctx, h.shard.ops)
        held = await asyncio.wait_for(anext(errors), 5)
    assert len(report.orphans_deleted) == 5
    assert len(h.live()) == 3
    assert "orphan deletions per" in held.error
    assert "orphan-deletions default/web" in (h.shard.ops.holds.summary() or "")
    h.clock.advance(timedelta(minutes=11))
    report = await sync_provider(h.ctx, h.shard.ops)
    assert len(report.orphans_deleted) == 3
    assert h.shard.ops.holds.summary() is None


async def test_most_of_a_group_going_silent_at_once_is_held_not_replaced(h: Harness) -> None:
    await h.reconcile()
    register_all(h)
    h.reconciler.leading_since = h.clock.now()
    before = set(h.live())
    h.clock.advance(timedelta(minutes=10))  # three missed health intervals for every agent
    await h.reconcile()
    assert set(h.live()) == before
    assert h.sim.calls["create_instance"] == 3
    assert "stopped reporting at once" in (h.shard.ops.holds.summary() or "")


async def test_one_silent_instance_is_still_replaced(h: Harness) -> None:
    await h.reconcile()
    register_all(h)
    h.reconciler.leading_since = h.clock.now()
    silent = sorted(h.live())[0]
    h.clock.advance(timedelta(minutes=10))
    with h.db.session() as session:
        repo.record_health_many(
            session,
            [
                {"instance_id": iid, "health_at": h.clock.now(), "health": {}, "runtime_config_hash": None}
                for iid in h.live()
                if iid != silent
            ],
        )
    await h.reconcile()
    assert silent not in h.live()
    assert h.shard.ops.holds.summary() is None


async def test_a_vm_made_by_another_leader_for_an_on_demand_id_that_failed_here_is_adopted(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sim seed 971000969. The intent record of an on-demand create could not be written here, so no VM
    # was asked for, and the row stayed as a tombstone. The operator's retry of that id made the VM on
    # another leader, whose record was then lost. This server, leading again, took the VM for an
    # orphan of its own failed create and deleted it. A tombstone that no record backs, of an on-demand
    # instance that never had a VM here, now goes with the rebuild, so the VM is adopted from its tags.
    await h.reconcile()
    iid = str(new_instance_id("app"))
    real_put = h.store.put_if_match

    def put_if_match(key: str, data: bytes, etag: str | None) -> str:
        if key == key_of(iid):
            raise Unavailable("object storage unreachable (test)")
        return real_put(key, data, etag)

    monkeypatch.setattr(h.store, "put_if_match", put_if_match)
    with pytest.raises(Unavailable, match="cannot write instance records"):
        await h.shard.create_instance("default", InstanceRequest(group="web", instance_id=iid))
    monkeypatch.undo()
    assert h.sim.calls["create_instance"] == 3  # the group's three: no VM was asked for here
    with h.db.read_session() as session:
        tombstone = repo.get_instance(session, iid)
    assert tombstone is not None
    assert tombstone.deleted_at is not None

    await make_vm(h, instance_id=iid)  # as the other leader made it; its record is lost
    await new_leader(h)
    assert iid in h.live()
    assert h.sim.calls["delete_instance"] == 0
    rec = h.record(iid)
    assert rec is not None
    assert rec["status"] != "deleted"


async def test_a_create_finishing_during_the_relist_is_not_retired(h: Harness) -> None:
    """Rows are read right after the listing, a create completes while the sync awaits a provider call,
    then the sync judges the rows: before the fix a row read without its provider id was compared with
    the fresh in-flight set and retired as ``create-interrupted``."""
    await make_vm(
        h
    )  # a VM no row explains: the sync awaits the provider (or storage) for it before judging the rows
    listed = asyncio.Event()
    real_list, real_create, real_delete = h.sim.list_instances, h.sim.create_instance, h.sim.delete_instance

    async def list_then_release(cluster_id: str, shard: str) -> list[ProviderInstance]:
        out = await real_list(cluster_id, shard)
        listed.set()
        return out

    async def create_after_listing(request: CreateRequest) -> ProviderInstance:
        await listed.wait()
        return await real_create(request)

    async def slow_delete(instance_id: str, provider_id: str) -> None:
        await reconcile  # the creates finish while this provider call is outstanding
        await real_delete(instance_id, provider_id)

    h.sim.list_instances = list_then_release  # type: ignore[method-assign]
    h.sim.create_instance = create_after_listing  # type: ignore[method-assign]
    h.sim.delete_instance = slow_delete  # type: ignore[method-assign]
    reconcile = asyncio.create_task(h.reconcile())
    await eventually(lambda: len(h.shard.ops.in_flight) == 3)
    report = await sync_provider(h.ctx, h.shard.ops)
    await reconcile
    assert report.gone == []
    created = {row.id for row in h.rows() if row.provider_id}
    assert len(created) >= 3
    assert created <= set(h.live())


async def test_records_deleted_under_a_running_leader_are_written_back_from_the_cache(h: Harness) -> None:
    await h.reconcile()
    await h.shard.ops.followups.settled()
    register_all(h)
    before = dict(h.live())
    delete_records(h)
    report = await gc_cycle(h.ctx, h.shard.ops)
    assert sorted(report.restored) == sorted(before)
    assert h.live() == before
    for iid, provider_id in before.items():
        rec = h.record(iid)
        assert rec is not None
        assert rec["provider_instance_id"] == provider_id
        assert rec["registered_at"]  # what only the cache knew is kept
        assert rec["restored_at"]


async def test_a_repaired_record_brings_its_instance_back_without_a_leadership_change(
    h: Harness, tmp_path: Path
) -> None:
    await h.reconcile()
    await h.shard.ops.followups.settled()
    victim = sorted(h.live())[0]
    original, _ = h.store.get(key_of(victim))
    h.store.put(key_of(victim), b"")
    lose_cache(h, tmp_path)
    await new_leader(h)
    assert victim not in {r.id for r in h.rows()}
    h.store.put(key_of(victim), original)  # a person restores it
    report = await gc_cycle(h.ctx, h.shard.ops)
    assert KEY in report.groups
    assert victim in {r.id for r in h.rows()}
    assert h.shard.ops.unreadable == []
    assert h.ctx.metrics.unreadable_records._value.get() == 0
    assert h.shard.ops.holds.summary() is None


async def test_a_repaired_record_brings_a_kept_row_up_to_date(h: Harness) -> None:
    """The row of an unreadable record is kept as this server last had it; another leader may have
    registered the agent meanwhile (sim seed 952005298). Once the record reads again the row takes its
    word, so a replay of the nonce meets the registration in SQLite too."""
    await h.reconcile()
    await h.shard.ops.followups.settled()
    victim = sorted(h.live())[0]
    doc = json.loads(h.store.get(key_of(victim))[0])
    h.store.put(key_of(victim), b"")
    await new_leader(h)  # the cache is kept: the victim's row stays, unregistered
    row = next(r for r in h.rows() if r.id == victim)
    assert row.registered_at is None
    doc.update(
        registered_at=h.clock.now().isoformat(),
        cert_serial="5eed",
        hostname="node-7",
        private_ipv4="10.9.8.7",
    )
    h.store.put(key_of(victim), json.dumps(doc).encode())  # repaired, with that other registration
    await gc_cycle(h.ctx, h.shard.ops)
    row = next(r for r in h.rows() if r.id == victim)
    assert (row.cert_serial, row.hostname, row.ip4) == ("5eed", "node-7", "10.9.8.7")
    assert row.registered_at is not None
    assert h.shard.ops.unreadable == []


async def test_a_repaired_record_is_not_blamed_for_the_silence_while_it_was_unreadable(
    h: Harness, tmp_path: Path
) -> None:
    """While its record was unreadable the instance had no cache row and its agent's streams were
    refused; the row that comes back must not carry that silence (the record's old timestamps)."""
    await h.reconcile()
    await h.shard.ops.followups.settled()
    victim = sorted(h.live())[0]
    original, _ = h.store.get(key_of(victim))
    doc = json.loads(original)
    doc["registered_at"] = h.clock.now().isoformat()  # a registered agent, reporting all along
    h.store.put(key_of(victim), b"")
    lose_cache(h, tmp_path)
    await new_leader(h)
    register_all(h)
    h.reconciler.leading_since = h.clock.now()
    h.clock.advance(timedelta(minutes=10))  # long past the term's window: its agent was refused all along
    h.store.put(key_of(victim), json.dumps(doc).encode())  # a person repairs it
    report = await gc_cycle(h.ctx, h.shard.ops)
    assert KEY in report.groups

    def report_health(skip: str) -> None:
        now = h.clock.now()
        batch = [
            {"instance_id": iid, "health_at": now, "health": {}, "runtime_config_hash": None}
            for iid in h.live()
            if iid != skip
        ]
        with h.db.session() as session:
            repo.record_health_many(session, batch)

    report_health(victim)  # the others report; the victim's agent has not reconnected yet
    await h.reconcile()
    assert victim in h.live()
    h.clock.advance(timedelta(minutes=10))  # now it has been silent for a whole window since its return
    report_health(victim)
    await h.reconcile()
    assert victim not in h.live()
