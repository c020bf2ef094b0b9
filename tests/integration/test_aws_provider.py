"""The AWS EC2 provider against moto: in-process (``mock_aws``) and once against a real ``moto_server``.

Faults AWS produces but moto does not (RequestLimitExceeded, InvalidInstanceID.NotFound right after a
create, a lost RunInstances response, a draining target) are injected with botocore's ``before-call``
and ``after-call`` events on the provider's own clients, so every other byte goes through moto.
"""

from __future__ import annotations

import asyncio
import base64
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ReadTimeoutError
from botocore.validate import validate_parameters
from moto import mock_aws

from nstance.config.loader import load_config_file
from nstance.config.merge import all_group_keys, merged_group
from nstance.config.resources import ImageConfig, ImageFilterConfig, LoadBalancerConfig, TargetGroupConfig
from nstance.core.backoff import Backoff
from nstance.core.clock import ManualClock
from nstance.core.errors import InvalidArgument
from nstance.providers.aws import AwsProvider, aws_provider_from_options, target_groups_from_config
from nstance.providers.aws.args import client_token, run_instances_params
from nstance.providers.aws.calls import client_config
from nstance.providers.aws.provider import region_from_zone
from nstance.providers.aws.status import status_from_state
from nstance.providers.base import (
    CreateRequest,
    InstanceNotFound,
    InstanceStatus,
    ProviderInvalidRequest,
    ProviderThrottled,
    ProviderUnavailable,
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
from nstance.providers.images import CachedImage, MemoryImageCache, resolve_images
from nstance.testing.metadata import MetadataServer
from nstance.testing.motoserver import MotoServer
from nstance.testing.requests import sample_create_request

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "aws" / "config.jsonc"
REGION = "us-east-1"
ZONE = "us-east-1a"
AMI = "ami-0123456789abcdef0"  # moto launches any AMI id


class Faults:
    """Queued AWS errors per operation, answered by botocore before the request leaves the client."""

    def __init__(self, *clients: Any) -> None:
        self.queued: dict[str, deque[tuple[int, str]]] = {}
        self.lost: dict[str, int] = {}
        for client in clients:
            client.meta.events.register("before-call.*.*", self._before)
            client.meta.events.register("after-call.*.*", self._after)

    def fail(self, operation: str, code: str, times: int = 1, status: int = 400) -> None:
        """The next ``times`` calls of ``operation`` (e.g. ``RunInstances``) fail with ``code``."""
        self.queued.setdefault(operation, deque()).extend([(status, code)] * times)

    def lose_response(self, operation: str, times: int = 1) -> None:
        """The next ``times`` calls take effect in moto, then time out on the way back."""
        self.lost[operation] = self.lost.get(operation, 0) + times

    def _before(self, model: Any, **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        queue = self.queued.get(model.name)
        if not queue:
            return None
        status, code = queue.popleft()
        parsed = {
            "Error": {"Code": code, "Message": f"injected {code}"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        }
        return AWSResponse("https://ec2.invalid/", status, {}, None), parsed

    def _after(self, model: Any, **_: Any) -> None:
        if self.lost.get(model.name, 0) > 0:
            self.lost[model.name] -= 1
            raise ReadTimeoutError(endpoint_url="https://ec2.invalid/")


@dataclass
class World:
    provider: AwsProvider
    ec2: Any
    elbv2: Any
    clock: ManualClock
    faults: Faults
    subnet_id: str
    vpc_id: str
    sleeps: list[float] = field(default_factory=list)

    def request(self, **changes: Any) -> CreateRequest:
        base = sample_create_request(
            instance_type="t3.micro", subnet_id=self.subnet_id, args={"ImageId": AMI}, group="web"
        )
        return replace(base, **changes)

    def all_instances(self) -> list[dict[str, Any]]:
        pages = self.ec2.get_paginator("describe_instances").paginate()
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def _make_world(ec2: Any, elbv2: Any, **provider_options: Any) -> World:
    vpc_id = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet_id = ec2.create_subnet(VpcId=vpc_id, CidrBlock="10.0.0.0/20", AvailabilityZone=ZONE)["Subnet"][
        "SubnetId"
    ]
    clock = ManualClock()
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    provider = AwsProvider(
        ec2=ec2,
        elbv2=elbv2,
        clock=clock,
        zone=ZONE,
        sleep=fake_sleep,
        backoff=Backoff(base=0.5, cap=8.0, rng=random.Random(7)),
        **provider_options,
    )
    return World(provider, ec2, elbv2, clock, Faults(ec2, elbv2), subnet_id, vpc_id, sleeps)


@pytest.fixture
def world(aws_env: None) -> Iterator[World]:
    with mock_aws():
        config = client_config()
        ec2 = boto3.client("ec2", region_name=REGION, config=config)
        elbv2 = boto3.client("elbv2", region_name=REGION, config=config)
        yield _make_world(ec2, elbv2, page_size=5)


def _tags(raw: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}


# ---- create ------------------------------------------------------------------------------------


async def test_create_launches_one_tagged_spot_instance_with_the_userdata(world: World) -> None:
    request = world.request(
        spot=True,
        userdata=b"#!/bin/sh\necho hello\n",
        tags={"team": "infra"},
        args={"ImageId": AMI, "MetadataOptions": {"HttpTokens": "required"}},
    )

    made = await world.provider.create_instance(request)

    assert made.instance_id == request.instance_id
    assert made.provider_id.startswith("i-")
    assert made.status == InstanceStatus.PENDING
    assert (made.cluster_id, made.shard, made.group, made.kind) == ("c1", "s1", "web", "web")
    assert (made.instance_type, made.subnet_id, made.zone) == ("t3.micro", world.subnet_id, ZONE)
    assert made.ip4.startswith("10.0.")
    [raw] = world.all_instances()
    tags = _tags(raw)
    assert {k: v for k, v in tags.items() if k.startswith("nstance:") and k != "nstance:created-at"} == {
        "nstance:managed": "true",
        "nstance:instance-id": request.instance_id,
        "nstance:cluster-id": "c1",
        "nstance:shard": "s1",
        "nstance:tenant": "default",
        "nstance:group": "web",
        "nstance:template": "web",
        "nstance:kind": "web",
        "nstance:client-token": client_token(request),
    }
    assert tags["nstance:created-at"] == request.created_at.isoformat()
    assert tags["team"] == "infra"
    assert tags["Name"] == request.instance_id
    assert raw["InstanceLifecycle"] == "spot"
    assert raw["ClientToken"] == client_token(request)
    assert len(raw["ClientToken"]) <= 64
    userdata = world.ec2.describe_instance_attribute(InstanceId=made.provider_id, Attribute="userData")
    assert base64.b64decode(userdata["UserData"]["Value"]) == request.userdata


async def test_args_may_not_set_what_nstance_owns_and_need_an_image(world: World) -> None:
    for key in ("InstanceType", "SubnetId", "UserData", "MinCount", "MaxCount", "ClientToken"):
        with pytest.raises(ProviderInvalidRequest, match=rf"templates\.web\.args\.{key}: Nstance sets"):
            await world.provider.create_instance(world.request(args={"ImageId": AMI, key: "x"}))
    with pytest.raises(ProviderInvalidRequest, match=r"templates\.web\.args\.ImageId"):
        await world.provider.create_instance(world.request(args={}))
    with pytest.raises(ProviderInvalidRequest, match=r"tags\.nstance:group: the nstance: prefix is reserved"):
        await world.provider.create_instance(world.request(tags={"nstance:group": "x"}))
    with pytest.raises(
        ProviderInvalidRequest, match=r"(?s)templates\.web\.args: AWS RunInstances refused.*Unknown parameter"
    ):
        await world.provider.create_instance(world.request(args={"ImageId": AMI, "NotAParam": 1}))
    assert world.all_instances() == []


async def test_instance_type_must_run_the_template_arch_and_the_answer_is_cached(world: World) -> None:
    with pytest.raises(
        ProviderInvalidRequest, match=r"groups\.default\.web\.instance_type: .*m7g\.large.*arm64"
    ):
        await world.provider.create_instance(world.request(instance_type="m7g.large", arch="amd64"))
    with pytest.raises(ProviderInvalidRequest, match=r"\"small\" is not an EC2 instance type"):
        await world.provider.create_instance(world.request(instance_type="small"))
    assert world.all_instances() == []

    await world.provider.create_instance(world.request(instance_type="m7g.large", arch="arm64"))
    await world.provider.create_instance(world.request(instance_type="m7g.large", arch="arm64"))

    assert len(world.all_instances()) == 2
    assert world.provider.caller.sent["describe_instance_types"] == 2  # m7g.large once, "small" once


async def test_a_retried_create_returns_the_first_vm_and_a_reused_token_is_refused(world: World) -> None:
    request = world.request()
    first = await world.provider.create_instance(request)

    again = await world.provider.create_instance(request)
    restarted = AwsProvider(ec2=world.ec2, clock=world.clock)  # a new server process knows nothing
    after_restart = await restarted.create_instance(request)

    assert again.provider_id == first.provider_id
    assert after_restart.provider_id == first.provider_id
    assert after_restart.status == InstanceStatus.RUNNING  # read back from EC2, not remembered
    assert len(world.all_instances()) == 1
    await world.provider.create_instance(world.request(idempotency_token="tok-shared"))
    with pytest.raises(ProviderInvalidRequest, match="'tok-shared' was already used"):
        await world.provider.create_instance(world.request(idempotency_token="tok-shared"))
    assert len(world.all_instances()) == 2


async def test_a_lost_runinstances_response_is_retried_without_a_second_launch(world: World) -> None:
    world.faults.lose_response("RunInstances")
    request = world.request()

    made = await world.provider.create_instance(request)

    [raw] = world.all_instances()
    assert made.provider_id == raw["InstanceId"]
    assert _tags(raw)["nstance:instance-id"] == request.instance_id
    assert len(world.sleeps) == 1


async def test_request_limit_exceeded_is_retried_with_growing_backoff(world: World) -> None:
    world.faults.fail("RunInstances", "RequestLimitExceeded", times=3)

    made = await world.provider.create_instance(world.request())

    assert [i["InstanceId"] for i in world.all_instances()] == [made.provider_id]
    assert len(world.sleeps) == 3
    assert world.sleeps[0] < world.sleeps[1] < world.sleeps[2]
    assert world.provider.caller.throttled["run_instances"] == 3


async def test_throttling_that_does_not_stop_raises_provider_throttled(world: World) -> None:
    world.faults.fail("DescribeInstances", "RequestLimitExceeded", times=5)

    with pytest.raises(ProviderThrottled, match="DescribeInstances still throttled after 5 attempts"):
        await world.provider.list_instances("c1", "s1")

    assert len(world.sleeps) == 4
    assert await world.provider.list_instances("c1", "s1") == []  # the next call goes through


async def test_server_errors_are_retried_and_client_errors_are_not(world: World) -> None:
    world.faults.fail("DescribeSubnets", "InternalError", times=2, status=500)
    assert await world.provider.check_subnet_capacity(world.subnet_id) is True
    assert len(world.sleeps) == 2

    world.faults.fail("RunInstances", "UnauthorizedOperation", times=1, status=403)
    with pytest.raises(ProviderInvalidRequest, match=r"RunInstances was denied.*IAM action"):
        await world.provider.create_instance(world.request())
    world.faults.fail("RunInstances", "InsufficientInstanceCapacity", times=1)
    with pytest.raises(ProviderUnavailable, match=r"InsufficientInstanceCapacity.*retry later"):
        await world.provider.create_instance(world.request())
    assert world.all_instances() == []


# ---- get, list, delete -------------------------------------------------------------------------


async def test_not_found_right_after_create_is_tolerated_and_later_is_not(world: World) -> None:
    request = world.request()
    made = await world.provider.create_instance(request)
    world.faults.fail("DescribeInstances", "InvalidInstanceID.NotFound", times=2)

    by_provider_id = await world.provider.get_instance(request.instance_id, made.provider_id)
    assert by_provider_id.provider_id == made.provider_id
    assert by_provider_id.status == InstanceStatus.PENDING

    world.clock.advance(timedelta(minutes=6))
    with pytest.raises(InstanceNotFound, match=made.provider_id):
        await world.provider.get_instance(request.instance_id, made.provider_id)
    got = await world.provider.get_instance(request.instance_id, made.provider_id)
    assert got.provider_id == made.provider_id


async def test_delete_right_after_create_waits_until_ec2_sees_the_instance(world: World) -> None:
    made = await world.provider.create_instance(world.request())
    world.faults.fail("TerminateInstances", "InvalidInstanceID.NotFound", times=2)

    await world.provider.delete_instance(made.instance_id, made.provider_id)

    [raw] = world.all_instances()
    assert raw["State"]["Name"] in ("shutting-down", "terminated")
    assert len(world.sleeps) == 2


async def test_delete_makes_the_vm_gone_and_can_be_repeated(world: World) -> None:
    request = world.request()
    made = await world.provider.create_instance(request)
    kept = await world.provider.create_instance(world.request())

    await world.provider.delete_instance(request.instance_id, made.provider_id)

    after = await world.provider.get_instance(request.instance_id, made.provider_id)
    assert after.status in (InstanceStatus.DELETING, InstanceStatus.DELETED)
    assert [i.provider_id for i in await world.provider.list_instances("c1", "s1")] == [kept.provider_id]
    await world.provider.delete_instance(request.instance_id, made.provider_id)
    await world.provider.delete_instance("", "i-0123456789abcdef0")  # never existed
    world.clock.advance(timedelta(minutes=6))
    await world.provider.delete_instance(kept.instance_id, "")  # by instance id alone
    assert await world.provider.list_instances("c1", "s1") == []


async def test_get_by_instance_id_alone_and_unknown_instances(world: World) -> None:
    request = world.request()
    made = await world.provider.create_instance(request)

    got = await world.provider.get_instance(request.instance_id, "")

    assert got.provider_id == made.provider_id
    assert got.status == InstanceStatus.RUNNING
    with pytest.raises(InstanceNotFound):
        await world.provider.get_instance("web-unknown", "")
    with pytest.raises(InstanceNotFound):
        await world.provider.get_instance("", "i-0123456789abcdef0")
    with pytest.raises(ProviderInvalidRequest, match=f"belongs to instance {request.instance_id}"):
        await world.provider.get_instance("web-other", made.provider_id)


async def test_list_reads_every_page_and_only_this_cluster_and_shard(world: World) -> None:
    mine = [await world.provider.create_instance(world.request()) for _ in range(7)]
    await world.provider.create_instance(world.request(shard="s2"))
    await world.provider.create_instance(world.request(cluster_id="c2"))
    world.ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, InstanceType="t3.micro")  # not ours
    world.provider.caller.sent.clear()

    listed = await world.provider.list_instances("c1", "s1")

    assert sorted(i.provider_id for i in listed) == sorted(m.provider_id for m in mine)
    assert {(i.cluster_id, i.shard, i.group) for i in listed} == {("c1", "s1", "web")}
    assert world.provider.caller.sent["describe_instances"] == 2  # page size 5


async def test_listed_instances_carry_what_adoption_needs(world: World) -> None:
    """Tenant, template and on-demand come back from the tags, so a lost record can be rebuilt."""
    plain = await world.provider.create_instance(world.request())
    extra = await world.provider.create_instance(world.request(on_demand=True))
    listed = {i.provider_id: i for i in await world.provider.list_instances("c1", "s1")}
    assert (listed[plain.provider_id].tenant, listed[plain.provider_id].template) == ("default", "web")
    assert not listed[plain.provider_id].on_demand
    assert listed[extra.provider_id].on_demand


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ({"Name": "pending", "Code": 0}, InstanceStatus.PENDING),
        ({"Name": "running", "Code": 16}, InstanceStatus.RUNNING),
        ({"Name": "shutting-down", "Code": 32}, InstanceStatus.DELETING),
        ({"Name": "terminated", "Code": 48}, InstanceStatus.DELETED),
        ({"Name": "stopping", "Code": 64}, InstanceStatus.STOPPING),
        ({"Name": "stopped", "Code": 80}, InstanceStatus.STOPPED),
        ({"Code": 272}, InstanceStatus.RUNNING),  # high byte is internal to EC2
        ({"Name": "rebooting"}, InstanceStatus.UNKNOWN),
        (None, InstanceStatus.UNKNOWN),
    ],
)
def test_ec2_states_map_to_normalised_statuses(state: dict[str, Any] | None, status: InstanceStatus) -> None:
    assert status_from_state(state) == status


async def test_stopped_instance_reads_as_stopped(world: World) -> None:
    made = await world.provider.create_instance(world.request())
    world.ec2.stop_instances(InstanceIds=[made.provider_id])

    got = await world.provider.get_instance(made.instance_id, made.provider_id)

    assert got.status in (InstanceStatus.STOPPING, InstanceStatus.STOPPED)


# ---- subnets -----------------------------------------------------------------------------------


async def test_subnet_capacity_needs_more_than_ten_free_addresses(world: World) -> None:
    small = world.ec2.create_subnet(VpcId=world.vpc_id, CidrBlock="10.0.16.0/28", AvailabilityZone=ZONE)
    small_id = small["Subnet"]["SubnetId"]  # a /28 has 11 usable addresses on AWS
    assert await world.provider.check_subnet_capacity(small_id) is True

    await world.provider.create_instance(world.request(subnet_id=small_id))

    assert await world.provider.check_subnet_capacity(small_id) is False
    with pytest.raises(ProviderInvalidRequest, match=r'shard\.subnet_pools: subnet "subnet-a"'):
        await world.provider.check_subnet_capacity("subnet-a")


# ---- images ------------------------------------------------------------------------------------


def _image(name: str, *, sort: str = "creation-date", order: str = "desc", fallback: str = "") -> ImageConfig:
    return ImageConfig(
        provider="aws",
        filters=[ImageFilterConfig(name="name", values=[name])],
        owners=["self"],
        sort=sort,  # type: ignore[arg-type]
        order=order,  # type: ignore[arg-type]
        fallback=fallback,
    )


async def test_images_are_looked_up_sorted_cached_and_fall_back(world: World) -> None:
    source = world.ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    ids = {
        name: world.ec2.create_image(InstanceId=source, Name=name)["ImageId"]
        for name in ("debian-12-b", "debian-12-c", "debian-12-a")
    }
    images = {
        "last": _image("debian-12-*", sort="name", order="desc"),
        "first": _image("debian-12-*", sort="name", order="asc"),
        "missing": _image("ubuntu-*", fallback="ami-fallback"),
        "broken": _image("centos-*"),
    }
    cache = MemoryImageCache()
    interval = timedelta(hours=6)

    async def resolve(wanted: dict[str, ImageConfig], **kwargs: Any) -> Any:
        return await resolve_images(
            world.provider.lookup_image,
            wanted,
            cache=cache,
            now=world.clock.now(),
            refresh_interval=interval,
            **kwargs,
        )

    first = await resolve(images)

    assert dict(first.images) == {
        "last": ids["debian-12-c"],
        "first": ids["debian-12-a"],
        "missing": "ami-fallback",
    }
    assert first.sources["missing"] == "fallback"
    assert "images.broken: no available image matches" in first.errors["broken"]

    world.provider.caller.sent.clear()
    cached = await resolve({"last": images["last"]})
    assert cached.sources == {"last": "cache"}
    assert world.provider.caller.sent == {}

    world.clock.advance(timedelta(hours=7))  # past image_refresh_interval
    world.faults.fail("DescribeImages", "UnauthorizedOperation", status=403)
    stale = await resolve({"last": images["last"]})
    assert (stale.images["last"], stale.sources["last"]) == (ids["debian-12-c"], "stale-cache")

    newer = world.ec2.create_image(InstanceId=source, Name="debian-12-d")["ImageId"]
    forced = await resolve({"last": images["last"]}, force=True)
    assert (forced.images["last"], forced.sources["last"]) == (newer, "lookup")


async def test_image_sort_by_creation_date_picks_newest_or_oldest(world: World) -> None:
    def answer(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        images = [
            {
                "ImageId": "ami-old",
                "Name": "z",
                "CreationDate": "2024-01-01T00:00:00.000Z",
                "State": "available",
            },
            {
                "ImageId": "ami-new",
                "Name": "a",
                "CreationDate": "2025-06-01T00:00:00.000Z",
                "State": "available",
            },
            {
                "ImageId": "ami-broken",
                "Name": "b",
                "CreationDate": "2026-01-01T00:00:00.000Z",
                "State": "failed",
            },
        ]
        return AWSResponse("https://ec2.invalid/", 200, {}, None), {"Images": images}

    world.ec2.meta.events.register_first("before-call.ec2.DescribeImages", answer)
    cache = MemoryImageCache()

    got = await resolve_images(
        world.provider.lookup_image,
        {"newest": _image("x"), "oldest": _image("x", order="asc")},
        cache=cache,
        now=world.clock.now(),
        refresh_interval=timedelta(hours=6),
    )

    assert dict(got.images) == {"newest": "ami-new", "oldest": "ami-old"}
    assert cache.get_image("newest") == CachedImage("ami-new", world.clock.now())


# ---- load balancers ----------------------------------------------------------------------------


def _target_group(world: World, name: str) -> str:
    group = world.elbv2.create_target_group(
        Name=name, Protocol="TCP", Port=30080, VpcId=world.vpc_id, TargetType="instance"
    )
    return str(group["TargetGroups"][0]["TargetGroupArn"])


def _target(made: Any) -> LbTarget:
    return LbTarget(instance_id=made.instance_id, provider_id=made.provider_id, ip4=made.ip4)


async def test_targets_are_registered_in_batches_and_deregistration_is_confirmed(world: World) -> None:
    arn_a, arn_b = _target_group(world, "tg-a"), _target_group(world, "tg-b")
    lb = LoadBalancerConfig(
        provider="aws",
        target_groups=[
            TargetGroupConfig(arn=arn_a, target_port=30080),
            TargetGroupConfig(arn=arn_b, target_port=30443),
        ],
    )
    made = [
        await world.provider.create_instance(world.request(instance_id=f"web-{i}", idempotency_token=f"t{i}"))
        for i in range(3)
    ]
    targets = [_target(m) for m in made]
    world.provider.caller.sent.clear()

    await world.provider.register_targets("ingress", lb, targets)

    assert world.provider.caller.sent["register_targets"] == 2  # one call per target group
    states = await world.provider.target_states("ingress", lb, targets)
    assert states == {t.instance_id: TargetState.HEALTHY for t in targets}
    health = world.elbv2.describe_target_health(TargetGroupArn=arn_b)["TargetHealthDescriptions"]
    assert sorted((h["Target"]["Id"], h["Target"]["Port"]) for h in health) == sorted(
        (m.provider_id, 30443) for m in made
    )

    await world.provider.deregister_targets("ingress", lb, targets[:1])

    states = await world.provider.target_states("ingress", lb, targets)
    assert states[targets[0].instance_id] == TargetState.DEREGISTERED
    assert states[targets[1].instance_id] == TargetState.HEALTHY
    await world.provider.deregister_targets("ingress", lb, targets[:1])  # again: nothing to do


async def test_a_draining_or_half_attached_target_is_not_deregistered_yet(world: World) -> None:
    arn_a, arn_b = _target_group(world, "tg-d1"), _target_group(world, "tg-d2")
    lb = LoadBalancerConfig(
        provider="aws",
        target_groups=[
            TargetGroupConfig(arn=arn_a, target_port=30080),
            TargetGroupConfig(arn=arn_b, target_port=80),
        ],
    )
    made = await world.provider.create_instance(world.request())
    target = _target(made)
    world.elbv2.register_targets(TargetGroupArn=arn_a, Targets=[{"Id": made.provider_id, "Port": 30080}])

    half = await world.provider.target_states("ingress", lb, [target])
    assert half == {made.instance_id: TargetState.PARTIALLY_REGISTERED}

    def draining(**kwargs: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        if kwargs["params"]["body"].get("TargetGroupArn") != arn_a:
            return None
        description = {
            "Target": {"Id": made.provider_id, "Port": 30080},
            "TargetHealth": {"State": "draining"},
        }
        return AWSResponse("https://x.invalid/", 200, {}, None), {"TargetHealthDescriptions": [description]}

    world.elbv2.meta.events.register_first(
        "before-call.elastic-load-balancing-v2.DescribeTargetHealth", draining
    )
    assert await world.provider.target_states("ingress", lb, [target]) == {
        made.instance_id: TargetState.DRAINING
    }


async def test_a_deleted_target_group_holds_nothing_and_cannot_be_registered_with(world: World) -> None:
    arn = _target_group(world, "tg-gone")
    lb = LoadBalancerConfig(provider="aws", target_groups=[TargetGroupConfig(arn=arn, target_port=80)])
    made = await world.provider.create_instance(world.request())
    world.elbv2.delete_target_group(TargetGroupArn=arn)

    assert await world.provider.target_states("web", lb, [_target(made)]) == {
        made.instance_id: TargetState.DEREGISTERED
    }
    await world.provider.deregister_targets("web", lb, [_target(made)])
    with pytest.raises(
        ProviderInvalidRequest, match=r"load_balancers\.web\.target_groups\[0\]\.arn: target group"
    ):
        await world.provider.register_targets("web", lb, [_target(made)])


async def test_upstream_v1_target_group_arns_register_on_the_groups_default_port(world: World) -> None:
    arn = _target_group(world, "tg-v1")
    lb = LoadBalancerConfig.model_validate({"provider": "aws", "target_group_arns": [arn]})
    made = await world.provider.create_instance(world.request())
    await world.provider.register_targets("ingress", lb, [_target(made)])
    health = world.elbv2.describe_target_health(TargetGroupArn=arn)["TargetHealthDescriptions"]
    assert [(h["Target"]["Id"], h["Target"]["Port"]) for h in health] == [(made.provider_id, 30080)]
    assert await world.provider.target_states("ingress", lb, [_target(made)]) == {
        made.instance_id: TargetState.HEALTHY
    }
    await world.provider.deregister_targets("ingress", lb, [_target(made)])
    assert await world.provider.target_states("ingress", lb, [_target(made)]) == {
        made.instance_id: TargetState.DEREGISTERED
    }
    world.elbv2.delete_target_group(TargetGroupArn=arn)
    with pytest.raises(
        ProviderInvalidRequest, match=r"load_balancers\.ingress\.target_group_arns\[0\]: target group"
    ):
        await world.provider.register_targets("ingress", lb, [_target(made)])


def test_load_balancers_of_another_provider_are_refused() -> None:
    lb = LoadBalancerConfig(provider="google", network_endpoint_groups=["n1"])
    with pytest.raises(ProviderInvalidRequest, match=r'load_balancers\.neg\.provider: is "google"'):
        target_groups_from_config("neg", lb)


def test_the_aws_provider_offers_every_capability(world: World) -> None:
    for probe in (image_lookup, instance_type_check, load_balancing, leader_networking, own_instance):
        assert probe(world.provider) is world.provider


# ---- leader network ----------------------------------------------------------------------------


async def test_leader_eni_moves_to_the_new_leader_and_is_released_only_by_its_holder(world: World) -> None:
    eni = world.ec2.create_network_interface(SubnetId=world.subnet_id, PrivateIpAddress="10.0.0.10")
    eni_id = eni["NetworkInterface"]["NetworkInterfaceId"]
    old = await world.provider.create_instance(world.request())
    new = await world.provider.create_instance(world.request())

    async def holder() -> str:
        return await world.provider.leader_network.attached_to(eni_id)

    await world.provider.assign_leader_network(old.provider_id, "10.0.0.10", eni_id)
    assert await holder() == old.provider_id
    await world.provider.assign_leader_network(new.provider_id, "10.0.0.10", eni_id)
    assert await holder() == new.provider_id

    await world.provider.release_leader_network(old.provider_id, "10.0.0.10", eni_id)  # not the holder
    assert await holder() == new.provider_id
    await world.provider.release_leader_network(new.provider_id, "10.0.0.10", eni_id)
    assert await holder() == ""

    with pytest.raises(
        ProviderInvalidRequest, match=r'shard\.leader_network\.ip: "10\.0\.0\.99" is not an address'
    ):
        await world.provider.assign_leader_network(new.provider_id, "10.0.0.99", eni_id)
    with pytest.raises(ProviderInvalidRequest, match=r"shard\.leader_network\.interface_id"):
        await world.provider.assign_leader_network(new.provider_id, "10.0.0.10", "")


async def test_own_instance_id_comes_from_imdsv2(world: World) -> None:
    with MetadataServer() as metadata:
        metadata.aws_life_cycle = "on-demand"
        metadata.aws_instance_id = "i-0feedfacecafe0001"
        provider = AwsProvider(
            ec2=world.ec2,
            clock=world.clock,
            environ={"AWS_EC2_METADATA_SERVICE_ENDPOINT": metadata.url + "/"},
        )
        assert await provider.own_instance_id() == "i-0feedfacecafe0001"
        assert ("PUT", "/latest/api/token") in metadata.requests
        metadata.aws_life_cycle = None  # answers 404, as a machine outside AWS would
        with pytest.raises(ProviderUnavailable, match="--provider-instance-id"):
            await provider.own_instance_id()


# ---- options and a real moto_server ------------------------------------------------------------


def test_options_are_checked_by_path(aws_env: None, tmp_path: Path) -> None:
    clock = ManualClock()
    with pytest.raises(InvalidArgument, match=r"shard\.infra\.options\.bucket: unknown option"):
        aws_provider_from_options({"bucket": "x"}, clock=clock, base_dir=tmp_path, zone=ZONE)
    with pytest.raises(
        InvalidArgument, match=r"shard\.infra\.options\.page_size: must be a whole number from 5 to 1000"
    ):
        aws_provider_from_options({"page_size": 2}, clock=clock, base_dir=tmp_path, zone=ZONE)
    with pytest.raises(
        InvalidArgument, match=r"shard\.infra\.options\.max_attempts: must be a whole number of at least 1"
    ):
        aws_provider_from_options({"max_attempts": 0}, clock=clock, base_dir=tmp_path, zone=ZONE)
    with pytest.raises(InvalidArgument, match=r"shard\.infra\.options\.region: cannot tell the AWS region"):
        aws_provider_from_options({}, clock=clock, base_dir=tmp_path, zone="dev")
    assert region_from_zone("eu-central-1b") == "eu-central-1"
    assert region_from_zone("us-gov-west-1a") == "us-gov-west-1"
    provider = aws_provider_from_options({}, clock=clock, base_dir=tmp_path, zone="eu-west-2c")
    assert provider.ec2.meta.region_name == "eu-west-2"
    assert provider.kind == "aws"


@pytest.mark.slow
async def test_against_moto_server(aws_env: None, tmp_path: Path) -> None:
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    with MotoServer() as server:
        provider = aws_provider_from_options(
            {"endpoint_url": server.endpoint_url, "page_size": 5},
            clock=ManualClock(),
            base_dir=tmp_path,
            zone=ZONE,
            sleep=fake_sleep,
        )
        faults = Faults(provider.ec2)
        ec2 = provider.ec2
        vpc_id = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
        subnet_id = ec2.create_subnet(VpcId=vpc_id, CidrBlock="10.1.0.0/24", AvailabilityZone=ZONE)["Subnet"][
            "SubnetId"
        ]
        base = sample_create_request(instance_type="t3.micro", subnet_id=subnet_id, args={"ImageId": AMI})
        faults.fail("RunInstances", "RequestLimitExceeded", times=2)

        made = [
            await provider.create_instance(replace(base, instance_id=f"web-{i}", idempotency_token=f"t{i}"))
            for i in range(6)
        ]

        assert len(sleeps) == 2
        assert await provider.check_subnet_capacity(subnet_id) is True
        listed = await provider.list_instances("c1", "s1")
        assert sorted(i.provider_id for i in listed) == sorted(m.provider_id for m in made)
        again = await provider.create_instance(replace(base, instance_id="web-0", idempotency_token="t0"))
        assert again.provider_id == made[0].provider_id
        await provider.delete_instance("web-0", made[0].provider_id)
        assert len(await provider.list_instances("c1", "s1")) == 5
        assert (await provider.get_instance("web-1", "")).provider_id == made[1].provider_id
        await provider.close()


# ---- the shipped example -----------------------------------------------------------------------


async def test_every_example_group_makes_a_valid_runinstances_request(world: World) -> None:
    config = load_config_file(EXAMPLE)
    shape = world.ec2.meta.service_model.operation_model("RunInstances").input_shape
    checked = []
    for tenant, group in all_group_keys(config, {}):
        merged = merged_group(config, {}, tenant, group)
        args = dict(merged.args, ImageId=AMI)  # "{{ .Image.debian }}" once the server has rendered it
        request = world.request(
            tenant=tenant,
            group=group,
            template=merged.template,
            kind=merged.kind,
            arch=merged.arch,
            instance_type=merged.instance_type,
            args=args,
        )

        params = run_instances_params(request)
        params["UserData"] = base64.b64encode(params["UserData"]).decode()  # as botocore's hook does
        validate_parameters(params, shape)  # raises on any bad field
        await world.provider.check_instance_type(
            merged.instance_type, merged.arch, template=merged.template, where=f"groups.{tenant}.{group}"
        )
        if merged.load_balancers:
            groups = [
                g
                for name in merged.load_balancers
                for g in target_groups_from_config(name, config.load_balancers[name])
            ]
            assert [g.port for g in groups] == [30080, 30443]
        checked.append((tenant, group))
    assert checked == [
        ("default", "control"),
        ("default", "ingress"),
        ("default", "main"),
        ("team-a", "apps"),
    ]


async def test_concurrent_creates_of_one_instance_launch_it_once(world: World) -> None:
    request = world.request()

    made = await asyncio.gather(*(world.provider.create_instance(request) for _ in range(3)))

    assert len({m.provider_id for m in made}) == 1
    assert len(world.all_instances()) == 1
