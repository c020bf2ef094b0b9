"""The sim provider's cloud-like behaviour: token buckets, latency, eventual consistency, boot time,
failure injection, seeded determinism, persistence across restarts, and building it from config."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from nstance.config.resources import ImageConfig, ImageFilterConfig, LoadBalancerConfig, TargetGroupConfig
from nstance.config.shard import InfraConfig
from nstance.core.clock import ManualClock
from nstance.core.errors import FailedPrecondition, InvalidArgument
from nstance.providers.base import (
    CreateRequest,
    InstanceNotFound,
    InstanceStatus,
    ProviderInvalidRequest,
    ProviderThrottled,
    ProviderUnavailable,
)
from nstance.providers.factory import create_provider
from nstance.providers.features import LbTarget, TargetState
from nstance.providers.local import LocalProvider
from nstance.providers.sim import LEADER_METHODS, SimProvider, sim_provider_from_options
from nstance.testing.requests import sample_create_request


def req(token: str | None = None, cluster_id: str = "c1", shard: str = "s1") -> CreateRequest:
    return sample_create_request(cluster_id=cluster_id, shard=shard, token=token, userdata=b"")


class RecordingSleep:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


# ---- token buckets -----------------------------------------------------------------------------


async def test_request_bucket_allows_a_burst_then_throttles_until_it_refills(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock, request_bucket=(5, 2.0))
    for _ in range(5):
        await sim.create_instance(req())

    with pytest.raises(ProviderThrottled, match="request bucket"):
        await sim.create_instance(req())
    assert sim.throttled_calls == 1
    assert sim.launch_count == 5

    clock.advance(0.5)  # 2 tokens/s: one token back
    await sim.create_instance(req())
    with pytest.raises(ProviderThrottled):
        await sim.create_instance(req())
    assert sim.launch_count == 6
    assert sim.throttled_calls == 2


async def test_instance_bucket_limits_launches_independently_of_requests(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock, request_bucket=(100, 10.0), instance_bucket=(3, 0.5))
    for _ in range(3):
        await sim.create_instance(req())
    with pytest.raises(ProviderThrottled, match="instance bucket"):
        await sim.create_instance(req())

    clock.advance(1.0)  # half a token per second: one more launch after 2 s, not 1 s
    with pytest.raises(ProviderThrottled):
        await sim.create_instance(req())
    clock.advance(1.0)
    await sim.create_instance(req())
    assert sim.launch_count == 4


async def test_a_retried_create_is_not_charged_to_the_buckets(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock, request_bucket=(1, 0.0), instance_bucket=(1, 0.0))
    request = req()
    first = await sim.create_instance(request)

    again = await sim.create_instance(request)

    assert again.provider_id == first.provider_id
    assert sim.throttled_calls == 0
    with pytest.raises(ProviderThrottled):
        await sim.create_instance(req())


async def test_deletes_use_the_request_bucket(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock, request_bucket=(2, 0.0))
    made = await sim.create_instance(req())
    await sim.delete_instance(made.instance_id, made.provider_id)

    with pytest.raises(ProviderThrottled):
        await sim.delete_instance(made.instance_id, made.provider_id)


# ---- latency, visibility, boot -----------------------------------------------------------------


async def test_every_call_waits_the_latency_through_the_injected_sleep(clock: ManualClock) -> None:
    sleep = RecordingSleep()
    sim = SimProvider(clock=clock, sleep=sleep, latency=0.25)
    made = await sim.create_instance(req())
    await sim.get_instance(made.instance_id, made.provider_id)
    await sim.list_instances("c1", "s1")

    assert sleep.waits == [0.25, 0.25, 0.25]


async def test_latency_jitter_is_bounded_and_reproducible(clock: ManualClock) -> None:
    async def waits(seed: int) -> list[float]:
        sleep = RecordingSleep()
        sim = SimProvider(clock=clock, sleep=sleep, seed=seed, latency=1.0, latency_jitter=0.5)
        for _ in range(20):
            await sim.list_instances("c1", "s1")
        return sleep.waits

    first = await waits(3)
    assert all(0.5 <= w <= 1.5 for w in first)
    assert len(set(first)) > 10
    assert await waits(3) == first
    assert await waits(4) != first


async def test_new_vm_is_invisible_until_the_consistency_window_passes(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock, not_found_after_create=5.0)
    made = await sim.create_instance(req())

    with pytest.raises(InstanceNotFound):
        await sim.get_instance(made.instance_id, made.provider_id)
    assert await sim.list_instances("c1", "s1") == []

    clock.advance(5.0)
    assert (await sim.get_instance(made.instance_id, made.provider_id)).provider_id == made.provider_id
    assert [i.provider_id for i in await sim.list_instances("c1", "s1")] == [made.provider_id]


async def test_vm_is_pending_while_booting_then_running(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock, boot_time=30.0)
    made = await sim.create_instance(req())
    assert made.status == InstanceStatus.PENDING

    clock.advance(29.0)
    assert (await sim.get_instance(made.instance_id, made.provider_id)).status == InstanceStatus.PENDING
    clock.advance(1.0)
    assert (await sim.get_instance(made.instance_id, made.provider_id)).status == InstanceStatus.RUNNING


async def test_deleted_vm_reports_deleted_for_a_while_then_is_not_found(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock, deleted_retention=60.0)
    made = await sim.create_instance(req())
    await sim.delete_instance(made.instance_id, made.provider_id)

    assert (await sim.get_instance(made.instance_id, made.provider_id)).status == InstanceStatus.DELETED
    assert await sim.list_instances("c1", "s1") == []
    clock.advance(60.0)
    with pytest.raises(InstanceNotFound):
        await sim.get_instance(made.instance_id, made.provider_id)


async def test_forced_status_imitates_a_crashed_vm(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock)
    made = await sim.create_instance(req())
    sim.set_status(made.provider_id, InstanceStatus.STOPPED)

    assert (await sim.get_instance(made.instance_id, made.provider_id)).status == InstanceStatus.STOPPED
    sim.set_status(made.provider_id, None)
    assert (await sim.get_instance(made.instance_id, made.provider_id)).status == InstanceStatus.RUNNING


async def test_full_subnets_report_no_capacity(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock)
    sim.full_subnets = {"subnet-a"}

    assert await sim.check_subnet_capacity("subnet-a") is False
    assert await sim.check_subnet_capacity("subnet-b") is True


# ---- failure injection -------------------------------------------------------------------------


async def test_fail_next_fails_that_many_calls_without_launching(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock)
    sim.fail_next("create_instance", ProviderUnavailable("boom"), times=2)
    request = req()

    for _ in range(2):
        with pytest.raises(ProviderUnavailable, match="boom"):
            await sim.create_instance(request)
    assert sim.launch_count == 0
    await sim.create_instance(request)
    assert sim.launch_count == 1
    assert sim.calls["create_instance"] == 3


async def test_a_create_that_fails_after_launching_is_recovered_by_retrying_with_its_token(
    clock: ManualClock,
) -> None:
    sim = SimProvider(clock=clock)
    sim.fail_next("create_instance", ProviderUnavailable("response lost"), after_effect=True)
    request = req()

    with pytest.raises(ProviderUnavailable):
        await sim.create_instance(request)
    assert sim.launch_count == 1  # the cloud launched it anyway
    retried = await sim.create_instance(request)

    assert sim.launch_count == 1
    assert [i.provider_id for i in await sim.list_instances("c1", "s1")] == [retried.provider_id]


async def test_failure_rate_is_seeded_and_can_be_turned_off(clock: ManualClock) -> None:
    async def pattern(seed: int) -> list[bool]:
        sim = SimProvider(clock=clock, seed=seed)
        sim.set_failure_rate("list_instances", 0.5, lambda: ProviderUnavailable("flaky"))
        out = []
        for _ in range(40):
            try:
                await sim.list_instances("c1", "s1")
                out.append(True)
            except ProviderUnavailable:
                out.append(False)
        sim.set_failure_rate("list_instances", 0.0, lambda: ProviderUnavailable("flaky"))
        await sim.list_instances("c1", "s1")  # off again: no error
        return out

    first = await pattern(11)
    assert 5 < first.count(False) < 35
    assert await pattern(11) == first


async def test_throttle_probability_throttles_some_calls_and_counts_them(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock, seed=2, throttle_probability=0.3)
    throttled = 0
    for _ in range(50):
        try:
            await sim.create_instance(req())
        except ProviderThrottled:
            throttled += 1

    assert 3 < throttled < 30
    assert sim.throttled_calls == throttled
    assert sim.launch_count == 50 - throttled


def test_unknown_method_names_are_refused(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock)
    with pytest.raises(InvalidArgument, match="create_instance"):
        sim.fail_next("create", ProviderUnavailable("x"))


# ---- determinism, observability, persistence ---------------------------------------------------


async def test_same_seed_gives_the_same_provider_ids(clock: ManualClock) -> None:
    async def ids(seed: int) -> list[str]:
        sim = SimProvider(clock=clock, seed=seed)
        return [(await sim.create_instance(req())).provider_id for _ in range(5)]

    first = await ids(42)
    assert all(re.fullmatch(r"sim-[0-9a-f]{12}", pid) for pid in first)
    assert len(set(first)) == 5
    assert await ids(42) == first
    assert await ids(43) != first


async def test_create_times_and_vms_show_what_was_launched(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock)
    a = await sim.create_instance(req())
    clock.advance(2.0)
    b = await sim.create_instance(req())
    await sim.delete_instance(a.instance_id, a.provider_id)

    assert sim.create_times == [1000.0, 1002.0]
    assert {pid: vm.status for pid, vm in sim.vms.items()} == {
        a.provider_id: InstanceStatus.DELETED,
        b.provider_id: InstanceStatus.RUNNING,
    }
    with pytest.raises(TypeError):
        sim.vms["x"] = b  # type: ignore[index]


async def test_state_file_lets_a_restarted_process_see_the_same_vms(
    clock: ManualClock, tmp_path: Path
) -> None:
    path = tmp_path / "sim" / "vms.json"
    before = SimProvider(clock=clock, state_path=path)
    kept_request = req()
    kept = await before.create_instance(kept_request)
    gone = await before.create_instance(req())
    await before.delete_instance(gone.instance_id, gone.provider_id)

    after = SimProvider(clock=clock, state_path=path)

    assert [i.provider_id for i in await after.list_instances("c1", "s1")] == [kept.provider_id]
    assert (await after.get_instance(gone.instance_id, gone.provider_id)).status == InstanceStatus.DELETED
    replay = await after.create_instance(kept_request)
    assert replay.provider_id == kept.provider_id
    assert after.launch_count == 0
    fresh = await after.create_instance(req())
    assert fresh.provider_id not in (kept.provider_id, gone.provider_id)
    assert fresh.ip4 not in (kept.ip4, gone.ip4)


async def test_providers_sharing_a_state_file_see_each_others_changes(
    clock: ManualClock, tmp_path: Path
) -> None:
    """A leader and a standby built at the same time: neither acts on a stale table or undoes the other."""
    path = tmp_path / "vms.json"
    leader = SimProvider(clock=clock, seed=9, state_path=path)
    standby = SimProvider(clock=clock, seed=9, state_path=path)  # same seed: same id sequence

    made = await leader.create_instance(req())
    assert [i.provider_id for i in await standby.list_instances("c1", "s1")] == [made.provider_id]
    second = await standby.create_instance(req())
    assert second.provider_id != made.provider_id
    await standby.delete_instance(made.instance_id, made.provider_id)
    third = await leader.create_instance(req())  # must not write back its old view of ``made``

    listed = {i.provider_id for i in await standby.list_instances("c1", "s1")}
    assert listed == {second.provider_id, third.provider_id}
    assert (await leader.get_instance("", made.provider_id)).status == InstanceStatus.DELETED


def _call_log(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_call_log_attributes_every_leader_call_to_its_caller_in_order(
    clock: ManualClock, tmp_path: Path
) -> None:
    state, calls = tmp_path / "vms.json", tmp_path / "calls.jsonl"
    old = SimProvider(clock=clock, state_path=state, calls_path=calls, caller="s1")
    new = SimProvider(clock=clock, seed=1, state_path=state, calls_path=calls, caller="s2")

    vm = await old.create_instance(req())
    await old.get_instance(vm.instance_id, vm.provider_id)  # reads are not logged
    await old.list_instances("c1", "s1")
    clock.advance(1.5)
    target = LbTarget(vm.instance_id, vm.provider_id)
    await new.register_targets("web", _lb(), [target])
    await new.deregister_targets("web", _lb(), [target])
    await new.assign_leader_network(vm.provider_id, "10.0.0.10", "")
    await new.release_leader_network(vm.provider_id, "10.0.0.10", "")  # any server may release its own
    new.fail_next("delete_instance", ProviderUnavailable("lost"))
    with pytest.raises(ProviderUnavailable):
        await new.delete_instance(vm.instance_id, vm.provider_id)  # refused before any effect: not logged
    await new.delete_instance(vm.instance_id, vm.provider_id)

    lines = _call_log(calls)
    assert [(c["method"], c["server"]) for c in lines] == [
        ("create_instance", "s1"),
        ("register_targets", "s2"),
        ("deregister_targets", "s2"),
        ("assign_leader_network", "s2"),
        ("delete_instance", "s2"),
    ]
    assert set(LEADER_METHODS) == {c["method"] for c in lines}
    assert all(c["instance_ids"] == [vm.instance_id] for c in lines)
    assert all(c["provider_ids"] == [vm.provider_id] for c in lines)
    assert all(c["pid"] == os.getpid() for c in lines)
    start = clock.now().timestamp() - 1.5
    assert [c["t"] for c in lines] == [start] + [start + 1.5] * 4  # the injected clock, when it took effect


async def test_call_log_records_a_call_that_failed_after_taking_effect_and_an_idempotent_repeat(
    clock: ManualClock, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.jsonl"
    sim = SimProvider(clock=clock, calls_path=calls, caller="s1", latency=0.5)
    request = req(token="tok-1")
    sim.fail_next("create_instance", ProviderUnavailable("timed out"), after_effect=True)
    arrived = clock.now().timestamp()
    with pytest.raises(ProviderUnavailable):
        await sim.create_instance(request)
    await sim.create_instance(request)

    lines = _call_log(calls)
    assert [c["method"] for c in lines] == ["create_instance", "create_instance"]
    assert lines[0]["started"] == arrived
    assert len({tuple(c["provider_ids"]) for c in lines}) == 1  # the same VM both times


async def test_call_log_is_off_by_default_and_set_by_option_with_the_server_id_from_the_environment(
    clock: ManualClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await SimProvider(clock=clock).create_instance(req())
    quiet = sim_provider_from_options({"state_file": "vms.json"}, clock=clock, base_dir=tmp_path)
    await quiet.create_instance(req())
    assert sorted(os.listdir(tmp_path)) == ["vms.json", "vms.json.lock"]

    monkeypatch.setenv("NSTANCE_SERVER_ID", "server-b")
    sim = sim_provider_from_options({"calls_file": "log/calls.jsonl"}, clock=clock, base_dir=tmp_path)
    await sim.create_instance(req())
    assert [c["server"] for c in _call_log(tmp_path / "log" / "calls.jsonl")] == ["server-b"]
    with pytest.raises(InvalidArgument, match=r"^shard\.infra\.options\.calls_file: must be a non-empty"):
        sim_provider_from_options({"calls_file": ""}, clock=clock, base_dir=tmp_path)


def test_a_corrupt_state_file_is_reported_with_its_path(clock: ManualClock, tmp_path: Path) -> None:
    path = tmp_path / "vms.json"
    path.write_text("{not json")

    with pytest.raises(FailedPrecondition, match=re.escape(str(path))):
        SimProvider(clock=clock, state_path=path)


# ---- construction from config ------------------------------------------------------------------


async def test_options_configure_latency_buckets_and_state_file(clock: ManualClock, tmp_path: Path) -> None:
    sleep = RecordingSleep()
    sim = sim_provider_from_options(
        {
            "seed": 5,
            "latency": "100ms",
            "boot_time": 10,
            "request_bucket": {"capacity": 1, "refill_per_second": 0},
            "state_file": "sim-state.json",
        },
        clock=clock,
        base_dir=tmp_path,
        sleep=sleep,
    )
    made = await sim.create_instance(req())

    assert sleep.waits == [pytest.approx(0.1)]
    assert made.status == InstanceStatus.PENDING
    assert (tmp_path / "sim-state.json").exists()
    with pytest.raises(ProviderThrottled):
        await sim.create_instance(req())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bogus": 1}, "shard.infra.options.bogus: unknown option for the sim provider; allowed: seed"),
        ({"latency": "5 parsecs"}, "shard.infra.options.latency: invalid duration"),
        ({"latency": -1}, "shard.infra.options.latency: must not be negative"),
        ({"seed": "x"}, "shard.infra.options.seed: must be an integer"),
        ({"throttle_probability": 2}, "shard.infra.options.throttle_probability: must be a number between"),
        (
            {"request_bucket": {"capacity": 5}},
            "shard.infra.options.request_bucket.refill_per_second: is required",
        ),
        (
            {"instance_bucket": {"capacity": 5, "refill_per_second": 1, "burst": 2}},
            "shard.infra.options.instance_bucket.burst: unknown key",
        ),
    ],
)
def test_bad_options_name_their_config_path(
    clock: ManualClock, tmp_path: Path, options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        sim_provider_from_options(options, clock=clock, base_dir=tmp_path)
    assert str(info.value).startswith(message)


async def test_factory_builds_every_provider_and_names_missing_options(
    clock: ManualClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = create_provider(
        InfraConfig(provider="sim", region="r1", zone="z1", options={"seed": 1}),
        clock=clock,
        base_dir=tmp_path,
    )
    assert sim.kind == "sim"
    assert (await sim.create_instance(req())).zone == "z1"

    local = create_provider(
        InfraConfig(provider="local", region="r1", zone="z1", options={}), clock=clock, base_dir=tmp_path
    )
    assert isinstance(local, LocalProvider)
    assert local.base_dir == tmp_path / "local-instances"

    aws = create_provider(
        InfraConfig(provider="aws", region="us-east-1", zone="us-east-1a"), clock=clock, base_dir=tmp_path
    )
    assert aws.kind == "aws"
    await aws.close()

    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    monkeypatch.delenv("PROXMOX_API_URL", raising=False)
    for name in ("gcp", "proxmox"):
        with pytest.raises(InvalidArgument, match=r"shard\.infra\.options"):
            create_provider(
                InfraConfig(provider=name, region="r1", zone="z1"),  # type: ignore[arg-type]
                clock=clock,
                base_dir=tmp_path,
            )


# ---- load balancers, leader address, images, instance types ---------------------------------------


def _lb() -> LoadBalancerConfig:
    return LoadBalancerConfig(provider="aws", target_groups=[TargetGroupConfig(arn="arn:tg", target_port=80)])


async def test_load_balancer_members_turn_healthy_then_drain_for_the_delay(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock, lb_health_delay=10, lb_deregistration_delay=30)
    vm = await sim.create_instance(req())
    target = LbTarget(vm.instance_id, vm.provider_id)

    await sim.register_targets("web", _lb(), [target])
    assert await sim.target_states("web", _lb(), [target]) == {vm.instance_id: TargetState.REGISTERED}
    clock.advance(10)
    assert sim.lb_members("web") == {vm.provider_id: TargetState.HEALTHY}

    await sim.deregister_targets("web", _lb(), [target])
    clock.advance(29)
    assert await sim.target_states("web", _lb(), [target]) == {vm.instance_id: TargetState.DRAINING}
    clock.advance(1)
    assert await sim.target_states("web", _lb(), [target]) == {vm.instance_id: TargetState.DEREGISTERED}
    assert sim.lb_members("web") == {}


async def test_a_deleted_vm_leaves_its_load_balancers_and_cannot_join_one(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock)
    vm = await sim.create_instance(req())
    target = LbTarget(vm.instance_id, vm.provider_id)
    await sim.register_targets("web", _lb(), [target])

    await sim.delete_instance(vm.instance_id, vm.provider_id)

    assert sim.lb_members("web") == {}
    with pytest.raises(ProviderInvalidRequest, match="does not exist"):
        await sim.register_targets("web", _lb(), [target])


async def test_the_leader_address_has_one_holder_and_only_it_releases(
    clock: ManualClock, tmp_path: Path
) -> None:
    path = tmp_path / "sim.json"
    first, second = SimProvider(clock=clock, state_path=path), SimProvider(clock=clock, state_path=path)

    await first.assign_leader_network("vm-a", "10.0.0.10", "")
    await second.assign_leader_network("vm-b", "10.0.0.10", "")
    await first.release_leader_network("vm-a", "10.0.0.10", "")  # not the holder: no effect

    assert first.leader_holder("10.0.0.10") == "vm-b"
    await second.release_leader_network("vm-b", "10.0.0.10", "")
    assert first.leader_holder("10.0.0.10") == ""


async def test_image_lookups_are_deterministic_and_can_fail(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock)
    image = ImageConfig(provider="aws", filters=[ImageFilterConfig(name="name", values=["debian-12-*"])])
    other = ImageConfig(provider="aws", filters=[ImageFilterConfig(name="name", values=["debian-13-*"])])

    first = await sim.lookup_image("debian", image)

    assert first.startswith("img-")
    assert await sim.lookup_image("debian", image) == first
    assert await sim.lookup_image("debian", other) != first
    sim.fail_next("lookup_image", ProviderUnavailable("image service down"))
    with pytest.raises(ProviderUnavailable):
        await sim.lookup_image("debian", image)


async def test_ec2_shaped_instance_types_must_match_the_arch(clock: ManualClock) -> None:
    sim = SimProvider(clock=clock)
    await sim.check_instance_type("m7g.large", "arm64", template="app", where="groups.t.g.instance_type")
    await sim.check_instance_type("sim.small", "arm64", template="app", where="x")  # unknown shape: passes
    with pytest.raises(
        ProviderInvalidRequest, match=r'groups\.t\.g\.instance_type: instance type "t4g\.small"'
    ):
        await sim.check_instance_type("t4g.small", "amd64", template="app", where="groups.t.g.instance_type")
