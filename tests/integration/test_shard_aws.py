"""A shard on EC2 (moto, in-process): the server's images, target groups and leader ENI end to end.

The same in-process harness as ``test_shard_cloud_features`` (real SQLite, injected clock), but the
provider is the real ``AwsProvider`` on boto3 talking to moto: the AMI in RunInstances comes from a
DescribeImages lookup, instances join the target group once their agents report, a scale-down
deregisters before it terminates, and the leader ENI is attached to the server's own instance.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from shard_helpers import no_sleep
from test_shard_cloud_features import Harness

from nstance.config import GroupUpdate
from nstance.core.backoff import Backoff
from nstance.core.clock import ManualClock
from nstance.providers.aws import AwsProvider
from nstance.providers.aws.calls import client_config
from nstance.server.leadership.leadernet import LeaderAddress

REGION = "us-east-1"


@pytest.fixture
def aws(aws_env: None) -> Iterator[dict[str, Any]]:
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION, config=client_config())
        elbv2 = boto3.client("elbv2", region_name=REGION, config=client_config())
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20", AvailabilityZone="us-east-1a")
        subnet_id = subnet["Subnet"]["SubnetId"]
        base = ec2.run_instances(ImageId="ami-0123456789abcdef0", MinCount=1, MaxCount=1)["Instances"][0]
        ami = ec2.create_image(InstanceId=base["InstanceId"], Name="debian-12-amd64-20261101")["ImageId"]
        server_vm = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, SubnetId=subnet_id)["Instances"][0]
        eni = ec2.create_network_interface(SubnetId=subnet_id, PrivateIpAddress="10.0.0.10")
        group = elbv2.create_target_group(
            Name="web", Protocol="TCP", Port=30080, VpcId=vpc, TargetType="instance"
        )
        yield {
            "ec2": ec2,
            "elbv2": elbv2,
            "subnet_id": subnet_id,
            "ami": ami,
            "server_vm": server_vm["InstanceId"],
            "eni": eni["NetworkInterface"]["NetworkInterfaceId"],
            "target_group": group["TargetGroups"][0]["TargetGroupArn"],
        }


def _harness(tmp_path: Path, aws: dict[str, Any]) -> Harness:
    clock = ManualClock()
    h = Harness(
        tmp_path,
        infra={"provider": "aws"},
        own_provider_id=aws["server_vm"],
        template_extra={"instance_type": "t3.micro", "args": {"ImageId": "{{ .Image.debian }}"}},
        config_extra={
            "images": {
                "debian": {"provider": "aws", "filters": [{"name": "name", "values": ["debian-12-amd64-*"]}]}
            },
            "load_balancers": {
                "web-lb": {
                    "provider": "aws",
                    "target_groups": [{"arn": aws["target_group"], "target_port": 30080}],
                }
            },
        },
        shard_extra={
            "subnet_pools": {"default": [aws["subnet_id"]]},
            "leader_network": {"ip": "10.0.0.10", "interface_id": aws["eni"]},
        },
        provider=AwsProvider(
            ec2=aws["ec2"],
            elbv2=aws["elbv2"],
            clock=clock,
            zone="us-east-1a",
            sleep=no_sleep,
            backoff=Backoff(base=0.01, cap=0.02, rng=random.Random(1)),
        ),
        clock=clock,
    )
    # The leader IP is an address in the VPC, not on this test machine: treat it as configured.
    h.shard.session.leader_net = LeaderAddress(h.ctx, bindable=lambda _ip: True)
    return h


def _targets(aws: dict[str, Any]) -> set[str]:
    health = aws["elbv2"].describe_target_health(TargetGroupArn=aws["target_group"])
    return {d["Target"]["Id"] for d in health["TargetHealthDescriptions"]}


def _running(aws: dict[str, Any], ids: set[str]) -> dict[str, str]:
    pages = aws["ec2"].get_paginator("describe_instances").paginate(InstanceIds=sorted(ids))
    return {
        i["InstanceId"]: i["State"]["Name"] for p in pages for r in p["Reservations"] for i in r["Instances"]
    }


async def test_a_shard_on_ec2_uses_images_target_groups_and_the_leader_eni(
    tmp_path: Path, aws: dict[str, Any]
) -> None:
    h = _harness(tmp_path, aws)
    try:
        await h.shard.images.refresh()
        assert h.ctx.resolved_images == {"debian": aws["ami"]}

        await h.reconcile()
        rows = h.rows()
        ids = {r.provider_id or "" for r in rows}
        described = aws["ec2"].describe_instances(InstanceIds=sorted(ids))["Reservations"]
        assert {i["ImageId"] for r in described for i in r["Instances"]} == {aws["ami"]}

        await h.report(*(r.id for r in rows))
        assert _targets(aws) == ids

        await h.shard.upsert_group("default", "web", GroupUpdate(size=1))
        await h.reconcile()
        (kept,) = h.rows()
        assert _targets(aws) == {kept.provider_id}
        states = _running(aws, ids)
        assert states.pop(kept.provider_id or "") == "running"
        assert set(states.values()) <= {"shutting-down", "terminated"}

        await h.shard.leader_net.hold()
        attachment = aws["ec2"].describe_network_interfaces(NetworkInterfaceIds=[aws["eni"]])[
            "NetworkInterfaces"
        ][0]["Attachment"]
        assert attachment["InstanceId"] == aws["server_vm"]
        assert h.shard.leader_net.status == "10.0.0.10 ready"
        await h.shard.leader_net.release()
        eni = aws["ec2"].describe_network_interfaces(NetworkInterfaceIds=[aws["eni"]])["NetworkInterfaces"][0]
        assert eni["Status"] == "available"
    finally:
        h.db.close()
