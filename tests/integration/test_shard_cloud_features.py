"""The shard server's use of provider capabilities: load balancers, images and the leader address.

In-process on an injected clock (real SQLite file, in-memory object store, sim provider), so that
deregistration delays, image refresh intervals and leadership changes are crossed without sleeping.
Instances report health through the real AgentHub path; the sim keeps load balancer membership the
way a cloud does (a deleted VM leaves its target groups; a deregistered one drains for a delay).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from shard_helpers import Leader, next_leaders_cache, no_sleep, sample_shard_identity

from nstance.config import GroupUpdate, apply_upsert
from nstance.core.clock import ManualClock
from nstance.core.errors import InvalidArgument, Unavailable
from nstance.core.ratelimit import TokenBucket
from nstance.db import repo
from nstance.db.engine import Database, open_database
from nstance.db.rows import InstanceRow
from nstance.objectstore.memory import MemoryObjectStore
from nstance.pki.ca import create_ca
from nstance.pki.keys import generate_private_key
from nstance.providers.base import CreateRequest, InstanceStatus, ProviderInstance, ProviderUnavailable
from nstance.providers.features import TargetState
from nstance.providers.sim import SimProvider
from nstance.server.agents.hub import HealthReport
from nstance.server.reconcile.images import ImageService
from nstance.server.reconcile.reconciler import Reconciler
from nstance.server.reconcile.recovery import rebuild_cache, sync_provider
from nstance.server.shard.build import build_shard
from nstance.server.state.configstate import ConfigState
from nstance.server.state.dynamic_groups import edit_dynamic_groups
from nstance.server.state.events import ErrorEventData
from nstance.server.state.limits import CreateLimiter
from nstance.server.state.metrics import InstrumentedProvider, Metrics
from nstance.testing.shardproc import server_addrs, shard_config
from nstance.testing.waiting import eventually

KEY = ("default", "web")
LB = {
    "provider": "aws",
    "target_groups": [{"arn": "arn:aws:elasticloadbalancing:tg/web", "target_port": 30080}],
}
IMAGE = {
    "provider": "aws",
    "filters": [{"name": "name", "values": ["debian-12-*"]}],
    "owners": ["136693071363"],
}


class RecordingSim(SimProvider):
    """The sim, remembering every create request (to see the rendered args)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.requests: list[CreateRequest] = []

    async def create_instance(self, request: CreateRequest) -> ProviderInstance:
        self.requests.append(request)
        return await super().create_instance(request)


@dataclass
class Harness:
    tmp_path: Path
    size: int = 2
    drain_timeout: str = "0s"
    template_extra: dict[str, Any] = field(default_factory=dict)
    config_extra: dict[str, Any] = field(default_factory=dict)
    shard_extra: dict[str, Any] = field(default_factory=dict)
    own_provider_id: str = ""
    sim: RecordingSim | None = None
    clock: ManualClock = field(default_factory=ManualClock)
    provider: Any = None  # another provider than the sim (the AWS provider on moto)
    infra: dict[str, Any] = field(default_factory=lambda: {"provider": "sim"})

    def __post_init__(self) -> None:
        self.store = MemoryObjectStore()
        self.write_config()
        self.db: Database = open_database(self.tmp_path / "db" / "nstance.db")
        self.state = ConfigState(self.store, self.tmp_path / "config", clock=self.clock)
        self.state.load()
        if self.sim is None:
            self.sim = RecordingSim(clock=self.clock, sleep=no_sleep, lb_deregistration_delay=30)
        self.errors: list[ErrorEventData] = []
        self.leader = Leader()
        self.metrics = Metrics()
        ca = create_ca(cluster_id="test")
        built = build_shard(
            identity=sample_shard_identity(ca.cert_pem),
            store=self.store,
            cluster_store=MemoryObjectStore(),
            db=self.db,
            config=self.state,
            provider=InstrumentedProvider(self.provider or self.sim, self.metrics),
            nonce_key=generate_private_key("ed25519"),  # type: ignore[arg-type]
            ca=ca,
            clock=self.clock,
            limiter=CreateLimiter(
                clock=self.clock, max_concurrent=8, bucket=TokenBucket(100, 100, self.clock)
            ),
            leadership=self.leader,
            metrics=self.metrics,
            own_provider_id=self.own_provider_id,
        )
        self.ctx = built.ctx
        self.ctx.events.errors.publish = self.errors.append  # type: ignore[method-assign, assignment]
        self.shard = built.shard
        self.reconciler = Reconciler(self.ctx, self.shard.ops)

    def write_config(self) -> None:
        config = shard_config(
            addrs=server_addrs(),
            provider=self.infra["provider"],
            provider_options=self.infra.get("options"),
            groups={"web": {"template": "app", "size": self.size, "load_balancers": ["web-lb"]}},
            shard_extra={"default_drain_timeout": self.drain_timeout, **self.shard_extra},
            template_extra=self.template_extra,
        )
        config["load_balancers"] = {"web-lb": LB}
        config.update(self.config_extra)
        self.store.put("config.jsonc", json.dumps(config).encode())

    @property
    def vms(self) -> RecordingSim:
        assert self.sim is not None
        return self.sim

    async def reconcile(self) -> None:
        await self.reconciler.reconcile(KEY)

    def rows(self) -> list[InstanceRow]:
        with self.db.read_session() as session:
            return repo.list_active_instances(session, tenant="default", group_key="web")

    def live(self) -> set[str]:
        return {pid for pid, vm in self.vms.vms.items() if vm.status != InstanceStatus.DELETED}

    async def report(self, *instance_ids: str) -> None:
        """One health report from each instance's agent, through the hub, then the batch flush."""
        for iid in instance_ids:

            async def one(iid: str = iid) -> AsyncIterator[HealthReport]:
                yield HealthReport(instance_id=iid, count=1)

            await self.shard.agents.health(iid, one())
        await self.shard.ops.lbs.flush()


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.db.close()


# ---- load balancers ----------------------------------------------------------------------------


async def test_an_instance_joins_its_groups_load_balancer_once_its_agent_reports(h: Harness) -> None:
    await h.reconcile()
    rows = h.rows()
    assert len(rows) == 2
    assert h.vms.lb_members("web-lb") == {}  # created, but not up yet: no traffic

    await h.report(rows[0].id)

    assert h.vms.lb_members("web-lb") == {rows[0].provider_id: TargetState.HEALTHY}
    await h.report(rows[0].id, rows[1].id)
    assert set(h.vms.lb_members("web-lb")) == {r.provider_id for r in rows}
    assert h.vms.calls["register_targets"] == 2  # the already-registered one is not sent again
    with h.db.read_session() as session:
        assert {m.status for m in repo.lb_members(session, "web-lb")} == {"registered"}


async def test_scale_down_deletes_a_vm_only_after_its_deregistration_is_confirmed(h: Harness) -> None:
    await h.reconcile()
    rows = h.rows()
    await h.report(*(r.id for r in rows))
    await h.shard.upsert_group("default", "web", GroupUpdate(size=1))

    await h.reconcile()

    draining = [pid for pid, state in h.vms.lb_members("web-lb").items() if state == TargetState.DRAINING]
    assert len(draining) == 1
    assert draining[0] in h.live()  # still running: connections drain for 30 s
    victim = next(r for r in rows if r.provider_id == draining[0])
    assert h.metrics.lb_deregistrations_waiting._value.get() == 1
    await h.report(victim.id)  # its agent still reports: it must not be registered again
    assert h.vms.lb_members("web-lb")[victim.provider_id or ""] == TargetState.DRAINING

    h.clock.advance(10)
    await h.reconcile()
    assert victim.provider_id in h.live()

    h.clock.advance(21)
    await h.reconcile()
    assert h.live() == {r.provider_id for r in rows if r.id != victim.id}
    assert [r.id for r in h.rows()] == [r.id for r in rows if r.id != victim.id]
    assert h.errors == []  # waiting for a load balancer is not an error
    assert h.metrics.lb_deregistrations_waiting._value.get() == 0


async def test_a_delete_held_for_its_load_balancer_is_finished_by_the_next_leader(
    h: Harness, tmp_path: Path
) -> None:
    # DeleteInstance answers "deleting" while the load balancer drains the VM. The record says so at
    # once: before, only this leader's cache did, and a leader taking over kept the VM for ever.
    await h.reconcile()
    rows = h.rows()
    await h.report(*(r.id for r in rows))
    target = rows[0]

    assert await h.shard.delete_instance("default", target.id) == "deleting"
    assert target.provider_id in h.live()
    (record_key,) = [k for k in h.store.list("instance/") if target.id in h.store.get(k)[0].decode()]
    assert json.loads(h.store.get(record_key)[0])["status"] == "deleting"

    # The leader goes; the next one knows only the records (a fresh cache), not the request.
    h.db = h.ctx.db = next_leaders_cache(h.db, tmp_path)
    await rebuild_cache(h.ctx, h.shard.ops)
    assert target.provider_id in h.live()  # the load balancer still drains it

    h.clock.advance(31)
    await sync_provider(h.ctx, h.shard.ops)  # the GC cycle's provider sync, then the group's reconcile
    await h.reconcile()
    assert target.provider_id not in h.live()
    assert json.loads(h.store.get(record_key)[0])["status"] == "deleted"


async def test_a_delete_that_cannot_be_recorded_is_refused(h: Harness) -> None:
    # The record is missing (lost): "deleting" would be a promise nothing keeps. The operator is
    # asked to retry; the GC cycle writes the record back from the cache meanwhile.
    await h.reconcile()
    rows = h.rows()
    await h.report(*(r.id for r in rows))
    target = rows[0]
    (record_key,) = [k for k in h.store.list("instance/") if target.id in h.store.get(k)[0].decode()]
    h.store.delete(record_key)

    with pytest.raises(Unavailable, match="its record is missing"):
        await h.shard.delete_instance("default", target.id)
    assert target.provider_id in h.live()


async def test_a_drain_takes_the_instance_out_of_its_load_balancer_at_once(tmp_path: Path) -> None:
    h = Harness(tmp_path, drain_timeout="5m")
    try:
        await h.reconcile()
        rows = h.rows()
        await h.report(*(r.id for r in rows))
        await h.shard.upsert_group("default", "web", GroupUpdate(size=1))

        await h.reconcile()  # a registered victim is drained (5 m for the operator to empty the node)

        # Deregistration starts in the background the moment the drain starts (nothing waits for it).
        def states() -> list[TargetState]:
            return sorted(h.vms.lb_members("web-lb").values())

        await eventually(
            lambda: states() == [TargetState.DRAINING, TargetState.HEALTHY], within=10, what="deregistration"
        )
        assert len(h.live()) == 2  # deleted only on ack or after the drain timeout
    finally:
        h.db.close()


async def test_a_failed_registration_is_reported_and_retried_later(h: Harness) -> None:
    await h.reconcile()
    row = h.rows()[0]
    h.vms.fail_next("register_targets", ProviderUnavailable("elb: internal error"))

    await h.report(row.id)

    assert h.vms.lb_members("web-lb") == {}
    assert len(h.errors) == 1
    assert "cannot register 1 instances with load balancer web-lb: elb: internal error" in h.errors[0].error
    assert h.errors[0].instance_id == row.id
    await h.report(row.id)  # too soon: not retried yet
    assert h.vms.calls["register_targets"] == 1
    h.clock.advance(31)
    await h.report(row.id)
    assert h.vms.lb_members("web-lb") == {row.provider_id: TargetState.HEALTHY}


async def test_a_new_leader_registers_again_and_a_gone_vm_is_not_waited_for(h: Harness) -> None:
    await h.reconcile()
    rows = h.rows()
    await h.report(*(r.id for r in rows))
    await h.shard.ops.lbs.close()  # leadership changed hands: nothing is known in memory

    await h.report(rows[0].id)
    assert h.vms.calls["register_targets"] == 2  # registered again; the provider treats it as a no-op

    h.vms.vanish(rows[1].provider_id or "")  # the cloud reclaimed the VM, and its target membership
    h.clock.advance(timedelta(minutes=10))  # past the provider's consistency grace
    await sync_provider(h.ctx, h.shard.ops)
    assert rows[1].id not in {r.id for r in h.rows()}  # nothing attached: deleted without waiting


# ---- images ------------------------------------------------------------------------------------


def _image_harness(tmp_path: Path, image: dict[str, Any], **kwargs: Any) -> Harness:
    return Harness(
        tmp_path,
        template_extra={"args": {"ImageId": "{{ .Image.debian }}"}},
        config_extra={"images": {"debian": image}},
        **kwargs,
    )


async def test_creates_use_the_image_resolved_at_leadership_and_cached_in_sqlite(tmp_path: Path) -> None:
    h = _image_harness(tmp_path, IMAGE)
    try:
        await h.shard.start_leading()
        try:
            await eventually(
                lambda: len(h.vms.requests) == 2, within=10, what="the first reconcile's creates"
            )
            image_id = h.ctx.resolved_images["debian"]
            assert image_id.startswith("img-")
            assert [r.args["ImageId"] for r in h.vms.requests] == [image_id, image_id]
            assert h.vms.calls["lookup_image"] == 1
        finally:
            await h.shard.stop_leading(grace=1)

        # Another server (another process, same SQLite cache) reuses the answer within the interval...
        second = ImageService(h.ctx)
        await second.refresh()
        assert h.vms.calls["lookup_image"] == 1
        # ...and asks again once it is older than image_refresh_interval (6 h by default).
        h.clock.advance(timedelta(hours=6, seconds=1))
        resolution = await second.refresh()
        assert resolution.sources == {"debian": "lookup"}
        assert h.vms.calls["lookup_image"] == 2
    finally:
        h.db.close()


async def test_a_changed_image_entry_is_looked_up_again(tmp_path: Path) -> None:
    h = _image_harness(tmp_path, IMAGE)
    try:
        service = ImageService(h.ctx)
        first = (await service.refresh()).images["debian"]
        h.config_extra["images"] = {
            "debian": {**IMAGE, "filters": [{"name": "name", "values": ["debian-13-*"]}]}
        }
        h.write_config()
        h.state.load(True)

        second = await service.refresh()

        assert second.sources == {"debian": "lookup"}
        assert second.images["debian"] != first
    finally:
        h.db.close()


async def test_a_group_edit_does_not_check_the_images_but_a_config_refresh_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Images are set in config.jsonc: this server's groups.jsonc writes cannot change them, and the
    # check that each one kicked ran on the loop between the edited group's reconcile steps.
    h = _image_harness(tmp_path, IMAGE)
    try:
        kicks: list[str] = []
        monkeypatch.setattr(h.shard.images, "kick", lambda: kicks.append("kick"))

        await h.shard.upsert_group("default", "batch", GroupUpdate(template="app", size=1))
        await h.shard.delete_group("default", "batch")
        assert kicks == []

        await h.shard.refresh_config()
        assert kicks == ["kick"]
    finally:
        h.db.close()


async def test_an_image_that_cannot_be_resolved_fails_creates_with_the_reason(tmp_path: Path) -> None:
    h = _image_harness(tmp_path, IMAGE, size=1)
    try:
        h.vms.fail_next("lookup_image", ProviderUnavailable("DescribeImages was denied"))
        service = ImageService(h.ctx)
        resolution = await service.refresh()
        assert resolution.errors == {"debian": "DescribeImages was denied"}
        assert h.errors[-1].error == "DescribeImages was denied"
        assert h.metrics.image_errors._value.get() == 1

        await h.reconcile()

        assert h.vms.requests == []
        messages = [e.error for e in h.errors]
        assert any(
            "templates.app.args.ImageId: line 1: executing at <.Image.debian>: "
            'undefined variable "Image.debian"; the image could not be resolved: DescribeImages was denied'
            in m
            for m in messages
        ), messages
    finally:
        h.db.close()


async def test_a_fallback_image_keeps_creates_going_when_the_lookup_fails(tmp_path: Path) -> None:
    h = _image_harness(tmp_path, {**IMAGE, "fallback": "ami-0fallback"}, size=1)
    try:
        h.vms.fail_next("lookup_image", ProviderUnavailable("throttled"))
        await ImageService(h.ctx).refresh()
        await h.reconcile()
        assert [r.args["ImageId"] for r in h.vms.requests] == ["ami-0fallback"]
    finally:
        h.db.close()


# ---- instance types ----------------------------------------------------------------------------


async def test_a_group_update_with_an_instance_type_of_another_arch_is_refused(h: Harness) -> None:
    with pytest.raises(
        InvalidArgument, match=r'groups\.default\.web\.instance_type: instance type "m7g\.large"'
    ):
        await h.shard.upsert_group("default", "web", GroupUpdate(instance_type="m7g.large"))
    view = await h.shard.upsert_group("default", "web", GroupUpdate(instance_type="m7i.large"))
    assert view.instance_type == "m7i.large"


# ---- leader address ----------------------------------------------------------------------------


async def test_the_leader_address_follows_leadership(tmp_path: Path) -> None:
    network = {"leader_network": {"ip": "127.0.0.1"}}
    first = Harness(tmp_path / "a", size=0, shard_extra=network, own_provider_id="sim-server-a")
    second = Harness(
        tmp_path / "b", size=0, shard_extra=network, own_provider_id="sim-server-b", sim=first.sim
    )
    try:
        await first.shard.leader_net.hold()
        assert first.vms.leader_holder("127.0.0.1") == "sim-server-a"
        assert first.shard.leader_net.status == "127.0.0.1 ready"
        assert first.metrics.leader_network._value.get() == 1

        # The first leader died without releasing; the next one takes the address over.
        await second.shard.leader_net.hold()
        assert first.vms.leader_holder("127.0.0.1") == "sim-server-b"
        await first.shard.leader_net.release()  # the old leader comes back and steps down: no effect
        assert first.vms.leader_holder("127.0.0.1") == "sim-server-b"

        await second.shard.leader_net.release()
        assert first.vms.leader_holder("127.0.0.1") == ""
    finally:
        first.db.close()
        second.db.close()


async def test_without_its_own_vm_id_the_server_says_how_to_give_it(tmp_path: Path) -> None:
    h = Harness(tmp_path, size=0, shard_extra={"leader_network": {"ip": "127.0.0.1"}})
    try:
        await h.shard.leader_net.hold()
        assert "--provider-instance-id" in h.shard.leader_net.status
        assert h.vms.leader_holder("127.0.0.1") == ""
    finally:
        h.db.close()


# ---- config changes nobody announced ----------------------------------------------------------


async def test_the_leader_picks_up_a_groups_change_it_was_not_told_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the simulation: a groups.jsonc write whose answer was lost left the leader on the old size."""
    from nstance.server.leadership import session as session_module

    monkeypatch.setattr(session_module, "CONFIG_CHECK_INTERVAL", 0.05)
    h = Harness(tmp_path, size=1)
    try:
        await h.shard.start_leading()
        try:
            await eventually(lambda: len(h.live()) == 1, within=10, what="the first instance")
            # A groups.jsonc write that landed although its caller saw it fail (the answer was lost).
            config = h.state.snapshot().config  # type: ignore[union-attr]
            edit_dynamic_groups(
                h.store, lambda current: apply_upsert(config, current, "default", "web", GroupUpdate(size=3))
            )
            await eventually(lambda: len(h.live()) == 3, within=10, what="the leader noticing the new size")
        finally:
            await h.shard.stop_leading(grace=1)
    finally:
        h.db.close()
