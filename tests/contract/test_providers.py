"""The Provider contract, run against ``sim``, ``local``, ``aws`` (moto), ``gcp`` (the GCE fake) and
``proxmox`` (fakepve).

What a shard server relies on: a created VM can be fetched and is listed under its cluster and shard
only; a retried create with the same idempotency token returns the same VM without launching another;
delete makes the VM go away and may be repeated; unknown VMs raise InstanceNotFound. Where a provider
has the optional capabilities (``nstance.providers.features``), they behave alike too: registering
with a load balancer twice is harmless, deregistering takes the VM out and may be repeated, and the
leader address has one holder that only it can release.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from fakepve import FakePve  # type: ignore[import-untyped]
from fakepve.certs import make_cert  # type: ignore[import-untyped]
from google.auth.credentials import AnonymousCredentials
from moto import mock_aws

from nstance.config.resources import LoadBalancerConfig, TargetGroupConfig
from nstance.core.clock import ManualClock
from nstance.core.ids import new_instance_id
from nstance.providers.aws import AwsProvider
from nstance.providers.aws.calls import client_config
from nstance.providers.base import (
    CreateRequest,
    InstanceNotFound,
    InstanceStatus,
    Provider,
    ProviderInvalidRequest,
)
from nstance.providers.features import (
    LbTarget,
    TargetState,
    image_lookup,
    instance_type_check,
    leader_networking,
    load_balancing,
    own_instance,
)
from nstance.providers.gcp import GcpProvider
from nstance.providers.local import LocalProvider
from nstance.providers.proxmox import ProxmoxProvider
from nstance.providers.proxmox.client import Endpoint, PveClient
from nstance.providers.proxmox.vmid import VmidAllocator
from nstance.providers.sim import SimProvider
from nstance.testing.gcefake import GceFake
from nstance.testing.requests import sample_create_request

AWS_REGION = "us-east-1"
AWS_ZONE = "us-east-1a"
GCE_ZONE = "us-central1-a"


@dataclass
class LeaderSetup:
    """How one cloud carries the leader address, and who holds it now."""

    ip: str
    interface_id: str
    holder: Callable[[], Any]  # the provider id holding the address ("" for none); may be async


@dataclass
class Harness:
    provider: Provider
    launches: Callable[[], int]  # how many VMs the provider has actually started so far
    # What this cloud needs in every request (a real instance type, subnet and image).
    defaults: dict[str, Any] = field(default_factory=dict)
    subnet: str = "subnet-a"
    kind: str = ""
    lb: LoadBalancerConfig | None = None  # a load balancer of this cloud, when it has them
    other_lbs: tuple[LoadBalancerConfig, ...] = ()  # other shapes of load balancer it takes
    leader: LeaderSetup | None = None

    def request(self, cluster_id: str = "c1", shard: str = "s1", token: str | None = None) -> CreateRequest:
        base = sample_create_request(cluster_id=cluster_id, shard=shard, token=token)
        return replace(base, **self.defaults) if self.defaults else base


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def _no_sleep(_: float) -> None:
    return None


@pytest.fixture(params=["sim", "local", "aws", "gcp", "proxmox"])
async def harness(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Harness]:
    clock = ManualClock()
    if request.param == "aws":
        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
        }.items():
            monkeypatch.setenv(name, value)
        for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
            monkeypatch.delenv(name, raising=False)
        with mock_aws():
            ec2 = boto3.client("ec2", region_name=AWS_REGION, config=client_config())
            elbv2 = boto3.client("elbv2", region_name=AWS_REGION, config=client_config())
            vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
            subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20", AvailabilityZone=AWS_ZONE)
            subnet_id = subnet["Subnet"]["SubnetId"]
            aws = AwsProvider(ec2=ec2, elbv2=elbv2, clock=clock, zone=AWS_ZONE, sleep=_no_sleep)
            group = elbv2.create_target_group(
                Name="web", Protocol="TCP", Port=80, VpcId=vpc, TargetType="instance"
            )
            arn = group["TargetGroups"][0]["TargetGroupArn"]
            eni = ec2.create_network_interface(SubnetId=subnet_id, PrivateIpAddress="10.0.0.10")
            eni_id = eni["NetworkInterface"]["NetworkInterfaceId"]

            def aws_launches() -> int:
                pages = ec2.get_paginator("describe_instances").paginate()
                return sum(len(r["Instances"]) for page in pages for r in page["Reservations"])

            defaults = {
                "instance_type": "t3.micro",
                "subnet_id": subnet_id,
                "args": {"ImageId": "ami-12c6146b"},
            }
            yield Harness(
                aws,
                aws_launches,
                defaults,
                subnet_id,
                kind="aws",
                lb=LoadBalancerConfig(
                    provider="aws", target_groups=[TargetGroupConfig(arn=arn, target_port=80)]
                ),
                leader=LeaderSetup("10.0.0.10", eni_id, lambda: aws.leader_network.attached_to(eni_id)),
            )
            await aws.close()
        return
    if request.param == "gcp":
        with GceFake(project="proj-1", zones=(GCE_ZONE,)) as fake:
            fake.add_machine_type("small")
            fake.add_subnetwork("subnet-a")
            fake.add_network_endpoint_group("neg-web")
            fake.add_instance_group("ig-web")
            gcp = GcpProvider(
                project=fake.project,
                zone=GCE_ZONE,
                clock=clock,
                endpoint=fake.endpoint,
                credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                sleep=_no_sleep,
            )
            image = "projects/debian-cloud/global/images/family/debian-12"

            def alias_holder() -> str:
                for vm in fake.instances():
                    for nic in vm.get("networkInterfaces", []):
                        if any(r.get("ipCidrRange") == "10.0.0.200/32" for r in nic.get("aliasIpRanges", [])):
                            return str(vm["id"])
                return ""

            yield Harness(
                gcp,
                lambda: len(fake.instances()),
                {"args": {"SourceImage": image}},
                kind="gcp",
                lb=LoadBalancerConfig(provider="google", network_endpoint_groups=["neg-web"]),
                other_lbs=(
                    LoadBalancerConfig.model_validate({"provider": "gcp", "instance_group_name": "ig-web"}),
                ),
                leader=LeaderSetup("10.0.0.200", "", alias_holder),
            )
            await gcp.close()
        return
    if request.param == "proxmox":
        certfile, keyfile, _ = make_cert(str(tmp_path))
        pve = FakePve(host="127.0.0.1", port=0)
        pve.apitokens["root@pam!nstance"] = "contract-secret"
        pve.add_ceph_storage("ceph")
        pve.add_vm(
            9000,
            "debian-tmpl",
            status="stopped",
            template=True,
            config={"template": 1, "memory": 1024, "cores": 1, "scsi0": "ceph:base-9000-disk-0,size=8G"},
        )
        await pve.start(certfile, keyfile)
        endpoint = Endpoint(
            api_url=pve.url + "/api2/json",
            token_id="root@pam!nstance",
            token_secret="contract-secret",
            verify=certfile,
        )
        proxmox = ProxmoxProvider(
            PveClient(endpoint), clock=clock, allocator=VmidAllocator(tmp_path / "vmid.json")
        )

        def clones() -> int:
            return sum(1 for t in pve.tasklog if t["type"] == "qmclone")

        yield Harness(
            proxmox, clones, {"args": {"TemplateVMID": 9000}, "subnet_id": "vmbr0"}, "vmbr0", kind="proxmox"
        )
        await proxmox.close()
        await pve.stop()
        return
    if request.param == "sim":
        sim = SimProvider(clock=clock, seed=1)
        yield Harness(
            sim,
            lambda: sim.launch_count,
            kind="sim",
            lb=LoadBalancerConfig(
                provider="aws", target_groups=[TargetGroupConfig(arn="arn:tg/web", target_port=80)]
            ),
            leader=LeaderSetup("10.0.0.10", "", lambda: sim.leader_holder("10.0.0.10")),
        )
        await sim.close()
        return
    base = tmp_path / "instances"
    local = LocalProvider(base, clock=clock, stop_instances_on_close=True)

    def launched_pids() -> set[int]:
        pids: set[int] = set()
        for meta in base.glob("*/instance.json"):
            pid = json.loads(meta.read_text())["pid"]
            if pid is not None:
                pids.add(pid)
        return pids

    yield Harness(local, lambda: len(launched_pids()), kind="local")
    pids = launched_pids()
    await local.close()
    assert [pid for pid in pids if not _pid_gone(pid)] == [], "an agent process outlived the test"


async def test_created_vm_can_be_fetched_and_is_listed_only_under_its_cluster_and_shard(
    harness: Harness,
) -> None:
    provider = harness.provider
    mine = harness.request()
    made = await provider.create_instance(mine)
    other_cluster = await provider.create_instance(harness.request(cluster_id="c2"))
    other_shard = await provider.create_instance(harness.request(shard="s2"))

    assert made.instance_id == mine.instance_id
    assert made.provider_id
    assert made.status in (InstanceStatus.PENDING, InstanceStatus.RUNNING)
    assert (made.cluster_id, made.shard, made.group, made.kind) == ("c1", "s1", "web", "web")

    got = await provider.get_instance(mine.instance_id, made.provider_id)
    assert got.provider_id == made.provider_id
    assert got.instance_id == mine.instance_id

    listed = await provider.list_instances("c1", "s1")
    assert [i.provider_id for i in listed] == [made.provider_id]
    assert [i.provider_id for i in await provider.list_instances("c2", "s1")] == [other_cluster.provider_id]
    assert [i.provider_id for i in await provider.list_instances("c1", "s2")] == [other_shard.provider_id]
    assert await provider.list_instances("c3", "s1") == []


async def test_create_with_a_seen_token_returns_the_same_vm_and_launches_nothing(harness: Harness) -> None:
    request = harness.request()
    first = await harness.provider.create_instance(request)
    assert harness.launches() == 1

    again = await harness.provider.create_instance(request)

    assert again.provider_id == first.provider_id
    assert harness.launches() == 1
    assert len(await harness.provider.list_instances("c1", "s1")) == 1


async def test_a_token_cannot_be_reused_for_another_instance(harness: Harness) -> None:
    await harness.provider.create_instance(harness.request(token="shared"))

    with pytest.raises(ProviderInvalidRequest, match="shared"):
        await harness.provider.create_instance(harness.request(token="shared"))
    assert harness.launches() == 1


async def test_deleted_vm_is_gone_and_delete_can_be_repeated(harness: Harness) -> None:
    provider = harness.provider
    request = harness.request()
    made = await provider.create_instance(request)
    kept = await provider.create_instance(harness.request())

    await provider.delete_instance(request.instance_id, made.provider_id)

    try:
        after = await provider.get_instance(request.instance_id, made.provider_id)
    except InstanceNotFound:
        pass
    else:
        assert after.status == InstanceStatus.DELETED
    assert [i.provider_id for i in await provider.list_instances("c1", "s1")] == [kept.provider_id]
    await provider.delete_instance(request.instance_id, made.provider_id)  # no error the second time
    assert (await provider.get_instance(kept.instance_id, kept.provider_id)).status != InstanceStatus.DELETED


async def test_delete_of_a_vm_that_never_existed_is_not_an_error(harness: Harness) -> None:
    instance_id = new_instance_id("web")
    await harness.provider.delete_instance(instance_id, "")
    with pytest.raises(InstanceNotFound):
        await harness.provider.get_instance(instance_id, "")


async def test_get_by_instance_id_alone_finds_the_vm(harness: Harness) -> None:
    """After a crash the server may know only the instance id it chose."""
    request = harness.request()
    made = await harness.provider.create_instance(request)

    got = await harness.provider.get_instance(request.instance_id, "")

    assert got.provider_id == made.provider_id


async def test_subnets_have_capacity_by_default(harness: Harness) -> None:
    assert await harness.provider.check_subnet_capacity(harness.subnet) is True


# ---- optional capabilities ---------------------------------------------------------------------

#: What each provider offers beyond the Provider protocol (docs/server.md lists the same).
CAPABILITIES = {
    "sim": {"images", "instance_types", "load_balancers", "leader_network"},
    "aws": {"images", "instance_types", "load_balancers", "leader_network", "own_instance"},
    "gcp": {"instance_types", "load_balancers", "leader_network", "own_instance"},
    "local": set(),
    "proxmox": set(),
}


def test_each_provider_offers_the_documented_capabilities(harness: Harness) -> None:
    probes = {
        "images": image_lookup,
        "instance_types": instance_type_check,
        "load_balancers": load_balancing,
        "leader_network": leader_networking,
        "own_instance": own_instance,
    }
    offered = {name for name, probe in probes.items() if probe(harness.provider) is not None}
    assert offered == CAPABILITIES[harness.kind]


async def _holder(harness: Harness) -> str:
    assert harness.leader is not None
    result = harness.leader.holder()
    if hasattr(result, "__await__"):
        result = await result
    return str(result)


async def test_load_balancer_registration_is_repeatable_and_deregistration_takes_the_vm_out(
    harness: Harness,
) -> None:
    provider = load_balancing(harness.provider)
    if provider is None or harness.lb is None:
        pytest.skip(f"{harness.kind} has no load balancers")
    made = [await harness.provider.create_instance(harness.request(token=f"lb-{i}")) for i in range(2)]
    targets = [LbTarget(m.instance_id, m.provider_id, m.ip4) for m in made]
    attached = {TargetState.REGISTERED, TargetState.HEALTHY}

    for lb in (harness.lb, *harness.other_lbs):
        await provider.register_targets("web", lb, targets)
        await provider.register_targets("web", lb, targets)  # again: harmless

        states = await provider.target_states("web", lb, targets)
        assert set(states) == {t.instance_id for t in targets}
        assert set(states.values()) <= attached, lb

        await provider.deregister_targets("web", lb, targets[:1])
        await provider.deregister_targets("web", lb, targets[:1])  # again: nothing to do

        states = await provider.target_states("web", lb, targets)
        assert states[targets[0].instance_id] == TargetState.DEREGISTERED, lb  # no delay configured here
        assert states[targets[1].instance_id] in attached, lb


async def test_the_leader_address_has_one_holder_and_only_the_holder_releases_it(harness: Harness) -> None:
    provider = leader_networking(harness.provider)
    if provider is None or harness.leader is None:
        pytest.skip(f"{harness.kind} cannot move a leader address")
    ip, interface = harness.leader.ip, harness.leader.interface_id
    old, new = [await harness.provider.create_instance(harness.request(token=f"srv-{i}")) for i in range(2)]

    await provider.assign_leader_network(old.provider_id, ip, interface)
    assert await _holder(harness) == old.provider_id
    await provider.assign_leader_network(new.provider_id, ip, interface)  # the old leader died holding it
    assert await _holder(harness) == new.provider_id
    await provider.assign_leader_network(new.provider_id, ip, interface)  # again: no change
    assert await _holder(harness) == new.provider_id

    await provider.release_leader_network(old.provider_id, ip, interface)  # not the holder: no effect
    assert await _holder(harness) == new.provider_id
    await provider.release_leader_network(new.provider_id, ip, interface)
    assert await _holder(harness) == ""
