"""The gcp provider against the GCE REST fake, through the real google-cloud-compute REST client.

What a shard server relies on: VMs carry the nstance-* labels and are listed by cluster and shard
across pages; creates are idempotent per token (requestId) and per name; deletes tolerate absence;
throttling and 5xx are retried with backoff and then reported as the right error; a VM that is not yet
visible after its insert is not an error; an instance type of the wrong arch is refused before launch;
operations are waited on the configured endpoint (never compute.googleapis.com). And the capabilities:
VMs join and leave load balancers through network endpoint groups (or upstream v1's unmanaged instance
groups), the leader alias IP follows the
leader without ever being held twice, the server learns its own VM id from the metadata server, and
config validation can check a machine type's architecture.
"""

from __future__ import annotations

import json
import logging
import socket
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from nstance.config.loader import load_config_file
from nstance.config.merge import all_group_keys, merged_group
from nstance.config.resources import LoadBalancerConfig
from nstance.config.schema import ServerConfig
from nstance.core.backoff import Backoff
from nstance.core.clock import ManualClock
from nstance.core.errors import InvalidArgument
from nstance.core.ids import new_instance_id
from nstance.providers.base import (
    CreateRequest,
    InstanceNotFound,
    InstanceStatus,
    ProviderInvalidRequest,
    ProviderThrottled,
    ProviderUnavailable,
)
from nstance.providers.features import (
    ImageLookup,
    InstanceTypeCheck,
    LbTarget,
    LeaderNetworking,
    LoadBalancing,
    OwnInstance,
    TargetState,
)
from nstance.providers.gcp import GcpProvider, gcp_provider_from_options, request_id_for
from nstance.providers.gcp.instancegroups import group_ref
from nstance.providers.gcp.labels import label_key, label_value, merge_labels
from nstance.providers.gcp.loadbalancers import neg_refs
from nstance.providers.gcp.neghealth import forwarding_rule_serves
from nstance.providers.gcp.resources import subnetwork_path
from nstance.providers.gcp.status import map_status
from nstance.testing.gcefake import GceFake
from nstance.testing.metadata import MetadataServer
from nstance.testing.requests import sample_create_request

ZONE = "us-central1-a"
IMAGE = "projects/debian-cloud/global/images/family/debian-12"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gcp" / "config.jsonc"
UPSTREAM = Path(__file__).resolve().parents[1] / "fixtures" / "upstream"


class Sleeps:
    """An injected sleep that records the delays instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def fake() -> Iterator[GceFake]:
    with GceFake(project="proj-1", zones=(ZONE,)) as running:
        running.add_subnetwork("workers", cidr="10.20.0.0/24")
        yield running


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def make_provider(fake: GceFake, sleeps: Sleeps, *, page_size: int = 500, **overrides: Any) -> GcpProvider:
    return GcpProvider(
        project=fake.project,
        zone=ZONE,
        clock=ManualClock(),
        endpoint=fake.endpoint,
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        page_size=page_size,
        max_attempts=4,
        backoff=Backoff(base=0.5, cap=8.0, jitter=0.0),
        sleep=sleeps,
        **overrides,
    )


@pytest.fixture
async def provider(fake: GceFake, sleeps: Sleeps) -> AsyncIterator[GcpProvider]:
    made = make_provider(fake, sleeps)
    yield made
    await made.close()


def req(cluster_id: str = "c1", shard: str = "s1", **changes: Any) -> CreateRequest:
    changes.setdefault("instance_type", "e2-medium")
    changes.setdefault("subnet_id", "workers")
    changes.setdefault("args", {"SourceImage": IMAGE})
    return sample_create_request(cluster_id=cluster_id, shard=shard, **changes)


def group_request(config: ServerConfig, tenant: str, group: str, **changes: Any) -> CreateRequest:
    """A create request for a new VM of ``tenant``/``group`` of ``config``, with its merged settings."""
    merged = merged_group(config, {}, tenant, group)
    return req(
        tenant=tenant,
        group=group,
        template=merged.template,
        kind=merged.kind,
        arch=merged.arch,
        instance_type=merged.instance_type,
        subnet_id=config.shard.subnet_pools[merged.subnet_pool][0],
        args=merged.args,
        instance_id=new_instance_id(merged.kind),
        **changes,
    )


def vm(fake: GceFake, name: str) -> dict[str, Any]:
    return next(i for i in fake.instances() if i["name"] == name)


# ---- create / get / list / delete --------------------------------------------------------------


async def test_created_vm_has_nstance_labels_and_is_listed_only_under_its_cluster_and_shard(
    fake: GceFake, provider: GcpProvider
) -> None:
    request = req(
        tags={"Team": "Platform", "cost:center": "R&D 42"}, userdata=b"#cloud-config\nhostname: x\n"
    )
    made = await provider.create_instance(request)
    other_cluster = await provider.create_instance(req(cluster_id="c2"))
    other_shard = await provider.create_instance(req(shard="s2"))

    assert made.instance_id == request.instance_id
    assert made.provider_id.isdigit()
    assert made.status == InstanceStatus.RUNNING
    assert (made.cluster_id, made.shard, made.group, made.kind) == ("c1", "s1", "web", "web")
    assert (made.instance_type, made.subnet_id, made.zone) == ("e2-medium", "workers", ZONE)
    assert made.ip4.startswith("10.20.0.")
    assert made.hostname == f"{request.instance_id}.{ZONE}.c.proj-1.internal"

    raw = vm(fake, request.instance_id)
    labels = raw["labels"]
    assert labels["nstance-managed"] == "true"
    assert labels["nstance-instance-id"] == request.instance_id
    assert (labels["nstance-cluster-id"], labels["nstance-shard"]) == ("c1", "s1")
    assert (labels["nstance-group"], labels["nstance-instance-kind"]) == ("web", "web")
    assert labels["nstance-created-at"] == "2026-01-01t00-00-00z"
    assert labels["team"] == "platform"
    assert labels["cost_center"] == "r-d-42"
    assert raw["networkInterfaces"][0]["subnetwork"].endswith(
        "/projects/proj-1/regions/us-central1/subnetworks/workers"
    )
    assert {"key": "user-data", "value": "#cloud-config\nhostname: x\n"} in raw["metadata"]["items"]
    assert raw["scheduling"]["provisioningModel"] == "STANDARD"

    got = await provider.get_instance(request.instance_id, made.provider_id)
    assert got.provider_id == made.provider_id
    assert (await provider.get_instance("", made.provider_id)).instance_id == request.instance_id
    assert [i.provider_id for i in await provider.list_instances("c1", "s1")] == [made.provider_id]
    assert [i.provider_id for i in await provider.list_instances("c2", "s1")] == [other_cluster.provider_id]
    assert [i.provider_id for i in await provider.list_instances("c1", "s2")] == [other_shard.provider_id]
    assert await provider.list_instances("c3", "s1") == []


async def test_listed_vms_carry_what_adoption_needs(fake: GceFake, provider: GcpProvider) -> None:
    """Tenant, template and on-demand come back from the labels, so a lost record can be rebuilt."""
    plain = await provider.create_instance(req())
    extra = await provider.create_instance(req(on_demand=True))
    assert vm(fake, extra.instance_id)["labels"]["nstance-on-demand"] == "true"
    assert "nstance-on-demand" not in vm(fake, plain.instance_id)["labels"]
    listed = {i.provider_id: i for i in await provider.list_instances("c1", "s1")}
    assert (listed[plain.provider_id].tenant, listed[plain.provider_id].template) == ("default", "web")
    assert (listed[plain.provider_id].on_demand, listed[extra.provider_id].on_demand) == (False, True)


async def test_list_reads_every_page(fake: GceFake, sleeps: Sleeps) -> None:
    provider = make_provider(fake, sleeps, page_size=2)
    made = {(await provider.create_instance(req())).provider_id for _ in range(5)}
    await provider.create_instance(req(shard="s2"))

    listed = await provider.list_instances("c1", "s1")

    assert {i.provider_id for i in listed} == made
    lists = fake.calls("instances.list")
    assert len(lists) == 3
    assert [bool(c.query.get("pageToken")) for c in lists] == [False, True, True]
    assert all(c.query["maxResults"] == "2" for c in lists)
    await provider.close()


async def test_delete_removes_the_vm_and_tolerates_absence(fake: GceFake, provider: GcpProvider) -> None:
    doomed_request = req()
    doomed = await provider.create_instance(doomed_request)
    kept = await provider.create_instance(req())

    await provider.delete_instance(doomed_request.instance_id, doomed.provider_id)

    with pytest.raises(InstanceNotFound):
        await provider.get_instance(doomed_request.instance_id, doomed.provider_id)
    assert [i.provider_id for i in await provider.list_instances("c1", "s1")] == [kept.provider_id]
    await provider.delete_instance(doomed_request.instance_id, doomed.provider_id)  # again: no error
    await provider.delete_instance("web-never-existed", "")
    await provider.delete_instance("", kept.provider_id)  # by GCE id alone
    assert fake.instances() == []
    assert fake.calls("zoneOperations.wait"), "deletes must be waited on the configured endpoint"


async def test_a_vm_recreated_under_the_same_name_is_not_the_old_provider_id(
    fake: GceFake, provider: GcpProvider
) -> None:
    request = req()
    first = await provider.create_instance(request)
    await provider.delete_instance(request.instance_id, first.provider_id)
    second = await provider.create_instance(
        req(instance_id=request.instance_id, idempotency_token="another-token")
    )

    assert second.provider_id != first.provider_id
    with pytest.raises(InstanceNotFound):
        await provider.get_instance(request.instance_id, first.provider_id)
    assert (await provider.get_instance(request.instance_id, "")).provider_id == second.provider_id


async def test_gce_statuses_are_normalised(fake: GceFake, provider: GcpProvider) -> None:
    request = req()
    made = await provider.create_instance(request)
    fake.set_status(request.instance_id, "TERMINATED")
    assert (
        await provider.get_instance(request.instance_id, made.provider_id)
    ).status == InstanceStatus.STOPPED
    fake.set_status(request.instance_id, "REPAIRING")
    assert (
        await provider.get_instance(request.instance_id, made.provider_id)
    ).status == InstanceStatus.REPAIRING
    assert map_status("PROVISIONING") == map_status("STAGING") == InstanceStatus.PENDING
    assert map_status("SUSPENDED") == InstanceStatus.SUSPENDED
    assert map_status("SOMETHING_NEW") == InstanceStatus.UNKNOWN


# ---- idempotency -------------------------------------------------------------------------------


async def test_retried_create_returns_the_same_vm_via_the_request_id(
    fake: GceFake, provider: GcpProvider
) -> None:
    request = req()
    first = await provider.create_instance(request)
    again = await provider.create_instance(request)

    assert again.provider_id == first.provider_id
    assert len(fake.instances()) == 1
    inserts = fake.calls("instances.insert")
    assert [c.query["requestId"] for c in inserts] == [request_id_for(request.idempotency_token)] * 2


async def test_retried_create_after_the_request_id_expired_returns_the_existing_vm(
    fake: GceFake, provider: GcpProvider
) -> None:
    request = req()
    first = await provider.create_instance(request)
    fake.forget_request_ids()

    again = await provider.create_instance(request)

    assert again.provider_id == first.provider_id
    assert [c.status for c in fake.calls("instances.insert")] == [200, 409]
    assert len(fake.instances()) == 1


async def test_same_name_with_another_token_is_refused(fake: GceFake, provider: GcpProvider) -> None:
    request = req()
    await provider.create_instance(request)

    with pytest.raises(ProviderInvalidRequest, match="another idempotency token"):
        await provider.create_instance(req(instance_id=request.instance_id, idempotency_token="other"))
    assert len(fake.instances()) == 1


async def test_a_token_cannot_be_reused_for_another_instance(fake: GceFake, provider: GcpProvider) -> None:
    await provider.create_instance(req(token="shared"))

    with pytest.raises(ProviderInvalidRequest, match="shared"):
        await provider.create_instance(req(token="shared"))
    assert len(fake.instances()) == 1


# ---- retries, eventual consistency and operations ----------------------------------------------


async def test_throttled_insert_is_retried_with_growing_backoff(
    fake: GceFake, provider: GcpProvider, sleeps: Sleeps
) -> None:
    fake.inject_error("instances.insert", code=429, reason="rateLimitExceeded", times=2)

    made = await provider.create_instance(req())

    assert made.status == InstanceStatus.RUNNING
    assert len(fake.instances()) == 1
    assert sleeps.delays == [0.5, 1.0]


async def test_forbidden_rate_limit_on_list_is_throttling_and_is_retried(
    fake: GceFake, provider: GcpProvider
) -> None:
    await provider.create_instance(req())
    fake.inject_error("instances.list", code=403, reason="rateLimitExceeded", message="Rate Limit Exceeded")

    assert len(await provider.list_instances("c1", "s1")) == 1


async def test_persistent_throttling_ends_as_provider_throttled_after_bounded_attempts(
    fake: GceFake, provider: GcpProvider
) -> None:
    fake.inject_error("instances.insert", code=429, reason="rateLimitExceeded", times=50)

    with pytest.raises(ProviderThrottled, match=r"instances\.insert failed 4 times"):
        await provider.create_instance(req())
    assert len(fake.calls("instances.insert")) == 4
    assert fake.instances() == []


async def test_persistent_503_ends_as_provider_unavailable(fake: GceFake, provider: GcpProvider) -> None:
    request = req()
    made = await provider.create_instance(request)
    fake.inject_error("instances.get", code=503, reason="backendError", times=50)

    with pytest.raises(ProviderUnavailable):
        await provider.get_instance(request.instance_id, made.provider_id)


async def test_a_503_on_insert_retries_without_launching_twice(fake: GceFake, provider: GcpProvider) -> None:
    fake.inject_error("instances.insert", code=503, reason="backendError", times=1)
    request = req()

    await provider.create_instance(request)
    await provider.create_instance(request)

    assert len(fake.instances()) == 1


async def test_not_found_right_after_insert_is_tolerated(fake: GceFake, provider: GcpProvider) -> None:
    fake.hide_after_insert(gets=2)
    made = await provider.create_instance(req())
    assert made.status == InstanceStatus.RUNNING

    fake.hide_after_insert(gets=100)
    request = req()
    invisible = await provider.create_instance(request)
    assert invisible.status == InstanceStatus.PENDING
    assert invisible.provider_id == vm(fake, request.instance_id)["id"]


async def test_operations_are_waited_on_the_configured_endpoint(sleeps: Sleeps) -> None:
    slow = GceFake(project="proj-1", zones=(ZONE,), operation_polls=3).start()
    try:
        provider = make_provider(slow, sleeps)
        request = req(subnet_id="default")
        made = await provider.create_instance(request)
        assert made.status == InstanceStatus.RUNNING
        assert len(slow.calls("zoneOperations.wait")) == 1
        await provider.close()
    finally:
        slow.stop()


async def test_a_failed_insert_operation_is_reported_and_a_retry_can_succeed(
    fake: GceFake, provider: GcpProvider
) -> None:
    fake.fail_next_operation(
        "insert", code="ZONE_RESOURCE_POOL_EXHAUSTED", message="The zone does not have enough resources"
    )
    request = req()

    with pytest.raises(ProviderUnavailable, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        await provider.create_instance(request)
    assert fake.instances() == []

    made = await provider.create_instance(request)  # same token: the failed requestId is chained past

    assert made.status == InstanceStatus.RUNNING
    assert len(fake.instances()) == 1
    request_ids = [c.query["requestId"] for c in fake.calls("instances.insert")]
    assert request_ids[0] == request_ids[1] != request_ids[2]


# ---- arch, args, spot and subnetworks ------------------------------------------------------------


async def test_machine_type_of_another_arch_is_refused_before_launch(
    fake: GceFake, provider: GcpProvider
) -> None:
    with pytest.raises(ProviderInvalidRequest, match=r"e2-medium.*amd64.*arch 'arm64'"):
        await provider.create_instance(req(arch="arm64", instance_type="e2-medium"))
    with pytest.raises(ProviderInvalidRequest, match="is arm64"):
        await provider.create_instance(req(arch="amd64", instance_type="t2a-standard-1"))
    assert fake.calls("instances.insert") == []

    arm = await provider.create_instance(req(arch="arm64", instance_type="t2a-standard-1"))
    await provider.create_instance(req(arch="arm64", instance_type="t2a-standard-1"))
    assert arm.instance_type == "t2a-standard-1"
    assert len(fake.calls("machineTypes.get")) == 2  # each type read once, then cached


async def test_unknown_machine_type_names_the_instance_type_setting(provider: GcpProvider) -> None:
    with pytest.raises(ProviderInvalidRequest, match=r"groups\.default\.web\.instance_type: 'small'"):
        await provider.create_instance(req(instance_type="small"))


async def test_bad_args_are_refused_with_their_config_path(fake: GceFake, provider: GcpProvider) -> None:
    with pytest.raises(ProviderInvalidRequest, match=r"templates\.web\.args\.SourceImage: required"):
        await provider.create_instance(req(args={}))
    with pytest.raises(ProviderInvalidRequest, match=r"templates\.web\.args\.ImageId: not a gcp arg"):
        await provider.create_instance(req(args={"ImageId": "ami-1"}))
    with pytest.raises(ProviderInvalidRequest, match=r"templates\.web\.args\.DiskSizeGb"):
        await provider.create_instance(req(args={"SourceImage": IMAGE, "DiskSizeGb": "big"}))
    with pytest.raises(ProviderInvalidRequest, match=r"args\.Labels\.nstance-x: .*belong to Nstance"):
        await provider.create_instance(req(args={"SourceImage": IMAGE, "Labels": {"nstance-x": "y"}}))
    with pytest.raises(
        ProviderInvalidRequest, match=r"args\.Labels\.nstance-group: .*\(Nstance writes 'web' here\)"
    ):
        await provider.create_instance(req(args={"SourceImage": IMAGE, "Labels": {"nstance-group": "db"}}))
    with pytest.raises(ProviderInvalidRequest, match=r"args\.Labels\.Env"):
        await provider.create_instance(req(args={"SourceImage": IMAGE, "Labels": {"Env": "prod"}}))
    assert fake.calls("instances.insert") == []


async def test_args_shape_the_instance(fake: GceFake, provider: GcpProvider) -> None:
    request = req(
        args={
            "SourceImage": IMAGE,
            "DiskSizeGb": 40,
            "DiskType": "pd-ssd",
            "ServiceAccount": "nodes@proj-1.iam.gserviceaccount.com",
            "Labels": {"env": "prod"},
            "NetworkTags": ["k8s-node"],
            "Metadata": {"enable-oslogin": "TRUE"},
        },
        userdata=b"\xff\xfebinary",
    )
    await provider.create_instance(request)

    raw = vm(fake, request.instance_id)
    assert raw["labels"]["env"] == "prod"
    assert raw["tags"]["items"] == ["k8s-node"]
    assert raw["serviceAccounts"][0]["email"] == "nodes@proj-1.iam.gserviceaccount.com"
    assert raw["disks"][0]["diskSizeGb"] == "40"
    assert raw["disks"][0]["boot"] is True
    items = {i["key"]: i["value"] for i in raw["metadata"]["items"]}
    assert items["user-data-encoding"] == "base64"
    assert items["user-data"] == "//5iaW5hcnk="
    assert items["enable-oslogin"] == "TRUE"


async def test_spot_and_preemptible_scheduling(fake: GceFake, provider: GcpProvider) -> None:
    spot = req(spot=True)
    await provider.create_instance(spot)
    scheduling = vm(fake, spot.instance_id)["scheduling"]
    assert scheduling["provisioningModel"] == "SPOT"
    assert scheduling["automaticRestart"] is False
    assert scheduling["onHostMaintenance"] == "TERMINATE"
    assert scheduling["instanceTerminationAction"] == "DELETE"

    legacy = req(args={"SourceImage": IMAGE, "Preemptible": True})
    await provider.create_instance(legacy)
    assert vm(fake, legacy.instance_id)["scheduling"]["preemptible"] is True

    with pytest.raises(ProviderInvalidRequest, match=r"args\.AutomaticRestart: spot"):
        await provider.create_instance(req(spot=True, args={"SourceImage": IMAGE, "AutomaticRestart": True}))


def test_subnetwork_references_become_regional_paths() -> None:
    expected = "projects/p/regions/us-central1/subnetworks/workers"
    assert subnetwork_path("workers", project="p", region="us-central1") == expected
    assert subnetwork_path("regions/us-central1/subnetworks/workers", project="p", region="x") == expected
    assert subnetwork_path(expected, project="other", region="x") == expected
    url = "https://www.googleapis.com/compute/v1/" + expected
    assert subnetwork_path(url, project="other", region="x") == expected
    with pytest.raises(ProviderInvalidRequest, match=r"shard\.subnet_pools: 'subnet-A/b'"):
        subnetwork_path("subnet-A/b", project="p", region="r")


async def test_missing_subnetwork_is_an_invalid_request_and_capacity_checks_it(
    fake: GceFake, provider: GcpProvider
) -> None:
    with pytest.raises(ProviderInvalidRequest, match="subnetworks/absent"):
        await provider.create_instance(req(subnet_id="absent"))
    assert await provider.check_subnet_capacity("workers") is True
    with pytest.raises(ProviderInvalidRequest, match=r"shard\.subnet_pools: subnetwork .*absent"):
        await provider.check_subnet_capacity("absent")


# ---- labels and options --------------------------------------------------------------------------


def test_label_helpers_follow_gce_rules() -> None:
    assert label_value("Prod.EU:1") == "prod-eu-1"
    long = label_value("x" * 100)
    assert len(long) == 63
    assert long != label_value("x" * 99)
    assert label_key("9lives") == "k-9lives"
    assert label_key("Cost Center") == "cost_center"
    many = {f"t{i}": "v" for i in range(60)}
    with pytest.raises(ProviderInvalidRequest, match="at most 64 labels"):
        merge_labels(req(tags=many), {}, args_path="templates.web.args")


def test_options_are_checked_by_path(tmp_path: Path) -> None:
    clock = ManualClock()
    with pytest.raises(InvalidArgument, match=r"shard\.infra\.options\.project"):
        gcp_provider_from_options(
            {"endpoint": "http://127.0.0.1:1"}, clock=clock, base_dir=tmp_path, zone=ZONE
        )
    with pytest.raises(InvalidArgument, match=r"shard\.infra\.options\.region: unknown option"):
        gcp_provider_from_options({"project": "p", "region": "x"}, clock=clock, base_dir=tmp_path, zone=ZONE)
    with pytest.raises(InvalidArgument, match=r"shard\.infra\.zone"):
        gcp_provider_from_options({"project": "p"}, clock=clock, base_dir=tmp_path, zone="")
    with pytest.raises(InvalidArgument, match=r"shard\.infra\.options\.page_size"):
        gcp_provider_from_options({"project": "p", "page_size": 0}, clock=clock, base_dir=tmp_path, zone=ZONE)
    with pytest.raises(InvalidArgument, match=r"shard\.infra\.options\.credentials_file: cannot load"):
        gcp_provider_from_options(
            {"project": "p", "credentials_file": "missing.json"}, clock=clock, base_dir=tmp_path, zone=ZONE
        )
    with pytest.raises(
        InvalidArgument, match=r"shard\.infra\.options\.project: 'a' differs from project_id 'b'"
    ):
        gcp_provider_from_options(
            {"project": "a", "project_id": "b"}, clock=clock, base_dir=tmp_path, zone=ZONE
        )
    with pytest.raises(InvalidArgument, match=r"options\.project_id: must be a non-empty string"):
        gcp_provider_from_options({"project_id": 7}, clock=clock, base_dir=tmp_path, zone=ZONE)


async def test_provider_from_options_talks_to_a_plain_http_endpoint_anonymously(
    fake: GceFake, tmp_path: Path
) -> None:
    provider = gcp_provider_from_options(
        {"project": fake.project, "endpoint": fake.endpoint, "page_size": 10, "operation_timeout": "2m"},
        clock=ManualClock(),
        base_dir=tmp_path,
        zone=ZONE,
    )
    assert (provider.kind, provider.project, provider.zone) == ("gcp", "proj-1", ZONE)
    made = await provider.create_instance(req())
    assert [i.provider_id for i in await provider.list_instances("c1", "s1")] == [made.provider_id]
    await provider.close()


async def test_upstreams_project_id_option_names_the_project(fake: GceFake, tmp_path: Path) -> None:
    """Both of upstream's generations read the project from ``shard.infra.options.project_id``."""
    options = {"project_id": fake.project, "endpoint": fake.endpoint}
    provider = gcp_provider_from_options(options, clock=ManualClock(), base_dir=tmp_path, zone=ZONE)
    assert provider.project == "proj-1"
    made = await provider.create_instance(req())
    assert [i.provider_id for i in await provider.list_instances("c1", "s1")] == [made.provider_id]
    await provider.close()
    same = {**options, "project": fake.project}  # both keys, one project: fine
    await gcp_provider_from_options(same, clock=ManualClock(), base_dir=tmp_path, zone=ZONE).close()


async def test_instance_id_that_is_not_a_gce_name_is_refused(provider: GcpProvider) -> None:
    with pytest.raises(ProviderInvalidRequest, match="cannot be a GCE instance name"):
        await provider.create_instance(req(instance_id="Web_1"))


async def test_every_group_of_the_shipped_example_launches_on_the_fake(
    fake: GceFake, provider: GcpProvider
) -> None:
    config = load_config_file(EXAMPLE)
    assert config.shard.infra.zone == ZONE
    fake.add_machine_type("n2-standard-8", guest_cpus=8, memory_mb=32768)
    fake.add_machine_type("e2-standard-8", guest_cpus=8, memory_mb=32768)
    fake.add_machine_type("c4a-standard-8", guest_cpus=8, memory_mb=32768, architecture="ARM64")
    fake.add_subnetwork("control", cidr="10.30.0.0/24")
    for tenant, group in all_group_keys(config, {}):
        made = await provider.create_instance(group_request(config, tenant, group, spot=False))
        assert made.status == InstanceStatus.RUNNING, (tenant, group)
    spot = next(i for i in fake.instances() if i["labels"]["nstance-template"] == "kns")
    assert spot["scheduling"]["provisioningModel"] == "SPOT"
    arm = next(i for i in fake.instances() if i["labels"]["nstance-template"] == "kna")
    assert arm["cpuPlatform"] == "Ampere Altra"


# ---- capabilities --------------------------------------------------------------------------------


def test_the_gcp_provider_has_every_capability_but_image_lookup(fake: GceFake, sleeps: Sleeps) -> None:
    provider = make_provider(fake, sleeps)
    for protocol in (LoadBalancing, LeaderNetworking, OwnInstance, InstanceTypeCheck):
        assert isinstance(provider, protocol), protocol
    assert not isinstance(provider, ImageLookup)


# ---- load balancers: zonal network endpoint groups -----------------------------------------------


def google_lb(*negs: str) -> LoadBalancerConfig:
    return LoadBalancerConfig.model_validate(
        {
            "provider": "google",
            "network_endpoint_groups": list(negs),
            "frontends": [{"ip": "34.1.2.3", "port": 443}],
        }
    )


async def new_targets(provider: GcpProvider, count: int = 2) -> list[LbTarget]:
    made = [await provider.create_instance(req()) for _ in range(count)]
    return [LbTarget(instance_id=m.instance_id, provider_id=m.provider_id, ip4=m.ip4) for m in made]


def endpoints(fake: GceFake, neg: str) -> list[tuple[str, str, int | None]]:
    return sorted((e["instance"], e["ipAddress"], e.get("port")) for e in fake.network_endpoints(neg))


async def test_registered_vms_are_listed_by_every_neg_and_their_health_is_reported(
    fake: GceFake, provider: GcpProvider
) -> None:
    fake.add_network_endpoint_group("ingress-a", default_port=30080)
    fake.add_network_endpoint_group("ingress-b", default_port=30443)
    lb = google_lb("ingress-a", f"zones/{ZONE}/networkEndpointGroups/ingress-b")
    first, second = targets = await new_targets(provider)

    await provider.register_targets("ingress", lb, targets)

    for neg, port in (("ingress-a", 30080), ("ingress-b", 30443)):
        assert endpoints(fake, neg) == sorted((t.instance_id, t.ip4, port) for t in targets)
    assert len(fake.calls("networkEndpointGroups.attachNetworkEndpoints")) == 2  # one per NEG, both VMs
    assert fake.calls("zoneOperations.wait"), "attach operations are waited on the configured endpoint"
    registered = {t.instance_id: TargetState.REGISTERED for t in targets}
    assert await provider.target_states("ingress", lb, targets) == registered

    for neg in ("ingress-a", "ingress-b"):
        fake.set_endpoint_health(neg, first.instance_id, "HEALTHY")
    fake.set_endpoint_health("ingress-a", second.instance_id, "HEALTHY")
    fake.set_endpoint_health("ingress-b", second.instance_id, "UNHEALTHY")
    assert await provider.target_states("ingress", lb, targets) == {
        first.instance_id: TargetState.HEALTHY,
        second.instance_id: TargetState.REGISTERED,
    }
    fake.set_endpoint_health("ingress-b", second.instance_id, "DRAINING")
    assert (await provider.target_states("ingress", lb, [second]))[second.instance_id] == TargetState.DRAINING

    await provider.register_targets("ingress", lb, targets)  # again: harmless, nothing re-attached

    assert len(fake.calls("networkEndpointGroups.attachNetworkEndpoints")) == 2
    assert len(endpoints(fake, "ingress-a")) == len(endpoints(fake, "ingress-b")) == 2
    assert (await provider.target_states("ingress", lb, [first]))[first.instance_id] == TargetState.HEALTHY


async def test_a_vm_attached_to_only_some_negs_is_partially_registered(
    fake: GceFake, provider: GcpProvider
) -> None:
    fake.add_network_endpoint_group("ingress-a")
    fake.add_network_endpoint_group("ingress-b")
    targets = await new_targets(provider, 1)
    await provider.register_targets("only-a", google_lb("ingress-a"), targets)

    states = await provider.target_states("ingress", google_lb("ingress-a", "ingress-b"), targets)

    assert states == {targets[0].instance_id: TargetState.PARTIALLY_REGISTERED}


async def test_deregistered_vms_leave_every_neg(fake: GceFake, provider: GcpProvider) -> None:
    fake.add_network_endpoint_group("ingress-a")
    fake.add_network_endpoint_group("ingress-b")
    lb = google_lb("ingress-a", "ingress-b")
    targets = await new_targets(provider)
    bystander = await new_targets(provider, 1)
    await provider.register_targets("ingress", lb, [*targets, *bystander])
    fake.set_endpoint_health("ingress-a", targets[0].instance_id, "HEALTHY")

    await provider.deregister_targets("ingress", lb, targets)

    assert (
        endpoints(fake, "ingress-a")
        == endpoints(fake, "ingress-b")
        == [(bystander[0].instance_id, bystander[0].ip4, 80)]
    )
    assert len(fake.calls("networkEndpointGroups.detachNetworkEndpoints")) == 2  # one per NEG, both VMs
    assert await provider.target_states("ingress", lb, targets) == {
        t.instance_id: TargetState.DEREGISTERED for t in targets
    }
    await provider.deregister_targets("ingress", lb, targets)  # again: nothing attached, nothing to do
    assert len(fake.calls("networkEndpointGroups.detachNetworkEndpoints")) == 2


async def test_deregistering_from_a_deleted_neg_or_one_without_the_vm_is_not_an_error(
    fake: GceFake, provider: GcpProvider
) -> None:
    for neg in ("kept", "doomed", "unrelated"):
        fake.add_network_endpoint_group(neg)
    targets = await new_targets(provider)
    await provider.register_targets("ingress", google_lb("kept", "doomed"), targets)
    fake.delete_network_endpoint_group("doomed")
    lb = google_lb("kept", "doomed", "unrelated", "never-existed")

    await provider.deregister_targets("ingress", lb, targets)

    assert endpoints(fake, "kept") == []
    assert await provider.target_states("ingress", lb, targets) == {
        t.instance_id: TargetState.DEREGISTERED for t in targets
    }
    with pytest.raises(
        ProviderInvalidRequest,
        match=r"load_balancers\.ingress\.network_endpoint_groups\[1\]: .*does not exist",
    ):
        await provider.register_targets("ingress", google_lb("kept", "never-existed"), targets)


@pytest.mark.parametrize(
    "bad",
    [
        "Bad_Name",
        "regions/us-central1/networkEndpointGroups/ingress",
        f"zones/{ZONE}/instanceGroups/ingress",
        "projects/proj-1/zones/us-central1-b/networkEndpointGroups/ingress",
    ],
)
async def test_a_bad_neg_reference_is_refused_naming_its_config_path(
    fake: GceFake, provider: GcpProvider, bad: str
) -> None:
    fake.add_network_endpoint_group("ingress")
    lb = google_lb("ingress", bad)
    targets = [LbTarget(instance_id="web-1", provider_id="1")]
    path = r"load_balancers\.ingress\.network_endpoint_groups\[1\]"

    with pytest.raises(ProviderInvalidRequest, match=path):
        await provider.register_targets("ingress", lb, targets)
    with pytest.raises(ProviderInvalidRequest, match=path):
        await provider.deregister_targets("ingress", lb, targets)
    with pytest.raises(ProviderInvalidRequest, match=path):
        await provider.target_states("ingress", lb, targets)
    assert [c for c in fake.calls() if c.method.startswith("networkEndpointGroups.")] == []


def test_neg_references_accept_a_name_a_zonal_path_a_project_path_and_a_url() -> None:
    path = f"projects/proj-1/zones/{ZONE}/networkEndpointGroups/ingress"
    refs = [
        "ingress",
        f"zones/{ZONE}/networkEndpointGroups/ingress",
        path,
        f"https://www.googleapis.com/compute/v1/{path}",
    ]
    parsed = neg_refs("web", google_lb(*refs), project="proj-1", zone=ZONE)
    assert [r.path for r in parsed] == [path] * 4
    assert [r.where for r in parsed] == [f"load_balancers.web.network_endpoint_groups[{i}]" for i in range(4)]
    with pytest.raises(ProviderInvalidRequest, match=r'load_balancers\.web\.provider: is "aws"'):
        neg_refs(
            "web",
            LoadBalancerConfig.model_validate(
                {"provider": "aws", "target_groups": [{"arn": "arn:aws:x", "target_port": 80}]}
            ),
            project="proj-1",
            zone=ZONE,
        )


async def test_registering_a_vm_gce_does_not_know_is_refused_naming_the_entry(
    fake: GceFake, provider: GcpProvider
) -> None:
    fake.add_network_endpoint_group("ingress")
    with pytest.raises(ProviderInvalidRequest, match=r"load_balancers\.ingress: VM web-gone does not exist"):
        await provider.register_targets(
            "ingress", google_lb("ingress"), [LbTarget(instance_id="web-gone", provider_id="1")]
        )
    assert fake.network_endpoints("ingress") == []


def insert_vm(fake: GceFake, name: str, subnetworks: list[str]) -> list[str]:
    """A RUNNING VM with one interface per subnetwork (made outside Nstance); its interfaces' addresses."""
    base = f"{fake.endpoint}/compute/v1/projects/{fake.project}/zones/{ZONE}"
    body = {
        "name": name,
        "machineType": f"zones/{ZONE}/machineTypes/e2-medium",
        "disks": [{"boot": True, "initializeParams": {"sourceImage": IMAGE}}],
        "networkInterfaces": [{"subnetwork": f"regions/us-central1/subnetworks/{s}"} for s in subnetworks],
    }

    def post(url: str, payload: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            doc: dict[str, Any] = json.loads(answer.read())
        return doc

    op = post(f"{base}/instances", body)
    assert post(f"{base}/operations/{op['name']}/wait", {})["status"] == "DONE"
    return [nic["networkIP"] for nic in vm(fake, name)["networkInterfaces"]]


def passthrough_lb(*negs: str, frontends: list[tuple[str, int]] | None = None) -> LoadBalancerConfig:
    return LoadBalancerConfig.model_validate(
        {
            "provider": "google",
            "network_endpoint_groups": list(negs),
            "frontends": [{"ip": ip, "port": port} for ip, port in frontends or []],
        }
    )


async def test_a_vm_joins_the_neg_of_its_interfaces_subnetwork_with_that_interfaces_address(
    fake: GceFake, provider: GcpProvider
) -> None:
    """As upstream: the NEG on the subnetwork of the VM's first interface that is on one, with that
    interface's address (not the VM's primary address, and not every NEG of the entry)."""
    fake.add_subnetwork("storage", cidr="10.50.0.0/24", network="storage-net")
    fake.add_network_endpoint_group("neg-workers", type="GCE_VM_IP", subnetwork="workers")
    fake.add_network_endpoint_group(
        "neg-storage", type="GCE_VM_IP", network="storage-net", subnetwork="storage"
    )
    lb = passthrough_lb("neg-workers", "neg-storage")
    (worker,) = await new_targets(provider, 1)
    default_ip, storage_ip = insert_vm(fake, "storage-1", ["default", "storage"])
    storage = LbTarget(instance_id="storage-1", provider_id="2", ip4=default_ip)

    await provider.register_targets("ingress", lb, [worker, storage])

    assert endpoints(fake, "neg-workers") == [(worker.instance_id, worker.ip4, None)]
    assert endpoints(fake, "neg-storage") == [("storage-1", storage_ip, None)]
    registered = {worker.instance_id: TargetState.REGISTERED, "storage-1": TargetState.REGISTERED}
    assert await provider.target_states("ingress", lb, [worker, storage]) == registered
    fake.set_endpoint_health("neg-storage", "storage-1", "HEALTHY")
    assert (await provider.target_states("ingress", lb, [storage]))["storage-1"] == TargetState.HEALTHY

    insert_vm(fake, "elsewhere-1", ["default"])
    with pytest.raises(
        ProviderInvalidRequest, match=r"none of these NEGs is on the subnetwork .*elsewhere-1"
    ):
        await provider.register_targets("ingress", lb, [LbTarget("elsewhere-1", "3")])

    await provider.deregister_targets("ingress", lb, [worker, storage])
    assert endpoints(fake, "neg-workers") == endpoints(fake, "neg-storage") == []
    assert await provider.target_states("ingress", lb, [worker, storage]) == {
        worker.instance_id: TargetState.DEREGISTERED,
        "storage-1": TargetState.DEREGISTERED,
    }


async def test_only_the_frontends_backends_count_and_every_one_must_be_healthy(
    fake: GceFake, provider: GcpProvider
) -> None:
    """Upstream's TestNetworkEndpointHealthStateRequiresEveryExpectedBackend, through GCE: the
    frontends resolve to forwarding rules and their backend services; an unrelated pair changes nothing."""
    fake.add_network_endpoint_group("neg-workers", type="GCE_VM_IP", subnetwork="workers")
    fake.add_forwarding_rule("api", ip_address="34.1.2.3", ports=["443"], backend_service="shared")
    fake.add_forwarding_rule("ingress", ip_address="34.1.2.4", port_range="400-500", backend_service="shared")
    fake.add_forwarding_rule("unrelated", ip_address="34.9.9.9", all_ports=True, backend_service="other")
    fake.add_forwarding_rule(
        "api-udp", ip_address="34.1.2.3", ip_protocol="UDP", ports=["443"], backend_service="x"
    )
    lb = passthrough_lb("neg-workers", frontends=[("34.1.2.3", 443), ("34.1.2.4", 443)])
    (target,) = await new_targets(provider, 1)
    await provider.register_targets("ingress", lb, [target])
    vm_id = target.instance_id

    async def state() -> TargetState:
        return (await provider.target_states("ingress", lb, [target]))[vm_id]

    fake.set_endpoint_health("neg-workers", vm_id, "HEALTHY", forwarding_rule="unrelated")
    fake.set_endpoint_health("neg-workers", vm_id, "HEALTHY", forwarding_rule="api")
    assert await state() == TargetState.REGISTERED  # the ingress frontend has no health yet
    fake.set_endpoint_health("neg-workers", vm_id, "UNHEALTHY", forwarding_rule="ingress")
    assert await state() == TargetState.REGISTERED
    fake.set_endpoint_health("neg-workers", vm_id, "HEALTHY", forwarding_rule="ingress")
    assert await state() == TargetState.HEALTHY
    fake.set_endpoint_health("neg-workers", vm_id, "DRAINING", forwarding_rule="unrelated")
    assert await state() == TargetState.HEALTHY  # an unrelated pair draining is not this VM leaving
    fake.set_endpoint_health("neg-workers", vm_id, "DRAINING", forwarding_rule="ingress")
    assert await state() == TargetState.DRAINING
    assert fake.calls("forwardingRules.list")


async def test_frontends_no_forwarding_rule_serves_are_warned_about_and_every_backend_counts(
    fake: GceFake, provider: GcpProvider, caplog: pytest.LogCaptureFixture
) -> None:
    """Frontends this project once took as documentation (a proxy load balancer's address, whose
    forwarding rule has no backend service) do not stop the VM's state from being read."""
    fake.add_network_endpoint_group("ingress")
    lb = google_lb("ingress")  # frontend 34.1.2.3:443, which no forwarding rule serves
    (target,) = await new_targets(provider, 1)
    await provider.register_targets("ingress", lb, [target])
    fake.set_endpoint_health("ingress", target.instance_id, "HEALTHY")
    with caplog.at_level(logging.WARNING, logger="nstance.providers.gcp.loadbalancers"):
        for _ in range(2):
            states = await provider.target_states("ingress", lb, [target])
            assert states == {target.instance_id: TargetState.HEALTHY}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert warnings[0].startswith("load_balancers.ingress.frontends[0]: no TCP forwarding rule")


def test_forwarding_rules_serve_ports_as_upstream_reads_them() -> None:
    def rule(**fields: Any) -> compute_v1.ForwardingRule:
        return compute_v1.ForwardingRule(**fields)

    for serving in (
        rule(all_ports=True),
        rule(ports=["80", "443"]),
        rule(port_range="400-500"),
        rule(port_range="443"),
    ):
        assert forwarding_rule_serves(serving, 443), serving
    for other in (rule(port_range="80-90"), rule(ports=["80"]), rule(), rule(port_range="a-b")):
        assert not forwarding_rule_serves(other, 443), other


async def test_many_targets_are_attached_in_chunks_and_listed_across_pages(
    fake: GceFake, sleeps: Sleeps
) -> None:
    provider = make_provider(fake, sleeps, page_size=2, lb_batch_size=2)
    fake.add_network_endpoint_group("ingress")
    lb = google_lb("ingress")
    targets = await new_targets(provider, 5)
    fake.inject_error("networkEndpointGroups.attachNetworkEndpoints", code=503, reason="backendError")

    await provider.register_targets("ingress", lb, targets)

    assert len(endpoints(fake, "ingress")) == 5
    attaches = fake.calls("networkEndpointGroups.attachNetworkEndpoints")
    assert [c.status for c in attaches] == [503, 200, 200, 200]  # 3 chunks, the first one retried
    for target in targets:
        fake.set_endpoint_health("ingress", target.instance_id, "HEALTHY")
    assert set((await provider.target_states("ingress", lb, targets)).values()) == {TargetState.HEALTHY}
    lists = fake.calls("networkEndpointGroups.listNetworkEndpoints")
    assert [bool(c.query.get("pageToken")) for c in lists] == [False, False, True, True]  # 5 read in 3 pages
    await provider.deregister_targets("ingress", lb, targets)
    assert fake.network_endpoints("ingress") == []
    assert len(fake.calls("networkEndpointGroups.detachNetworkEndpoints")) == 3
    await provider.close()


async def test_a_detach_still_running_reads_draining_until_its_operation_is_done(sleeps: Sleeps) -> None:
    with GceFake(project="proj-1", zones=(ZONE,), operation_polls=3) as slow:
        slow.add_subnetwork("workers", cidr="10.20.0.0/24")
        slow.add_network_endpoint_group("ingress")
        lb = google_lb("ingress")
        provider = make_provider(slow, sleeps)
        impatient = make_provider(slow, sleeps, operation_timeout=0.0)  # never waits for an operation
        targets = await new_targets(provider, 1)
        await provider.register_targets("ingress", lb, targets)
        key = targets[0].instance_id

        await impatient.deregister_targets("ingress", lb, targets)  # the detach operation is still running

        assert await impatient.target_states("ingress", lb, targets) == {key: TargetState.DRAINING}
        assert await impatient.target_states("ingress", lb, targets) == {key: TargetState.DRAINING}
        assert await impatient.target_states("ingress", lb, targets) == {key: TargetState.DEREGISTERED}
        assert slow.network_endpoints("ingress") == []
        await provider.close()
        await impatient.close()


async def test_upstreams_v1_terraform_config_launches_and_fills_its_instance_group(tmp_path: Path) -> None:
    """What upstream's v1 Terraform module uploads (tests/fixtures/upstream/tf-gcp-shard.json) runs here."""
    config = load_config_file(UPSTREAM / "tf-gcp-shard.json")
    infra = config.shard.infra
    assert (infra.provider, infra.zone, infra.options) == ("google", ZONE, {"project_id": "acme-prod"})
    with GceFake(project="acme-prod", zones=(ZONE,)) as fake:
        fake.add_subnetwork("agents-usc1a", cidr="10.40.0.0/24")
        fake.add_instance_group("ingress-usc1a")
        options = {**infra.options, "endpoint": fake.endpoint}  # upstream's own options, aimed at the fake
        provider = gcp_provider_from_options(options, clock=ManualClock(), base_dir=tmp_path, zone=infra.zone)
        merged = merged_group(config, {}, "default", "main")
        where = {"cluster_id": config.cluster.id, "shard": config.shard.id}
        made = [
            await provider.create_instance(group_request(config, "default", "main", **where)) for _ in "ab"
        ]
        targets = [LbTarget(m.instance_id, m.provider_id, m.ip4) for m in made]
        (lb_name,) = merged.load_balancers

        await provider.register_targets(lb_name, config.load_balancers[lb_name], targets)

        assert sorted(fake.instance_group_members("ingress-usc1a")) == sorted(m.instance_id for m in made)
        vm_doc = vm(fake, made[0].instance_id)
        assert vm_doc["tags"]["items"] == ["nstance-agent-usc1a-1"]
        assert vm_doc["serviceAccounts"][0]["email"] == "nstance-agent@acme-prod.iam.gserviceaccount.com"
        await provider.close()


# ---- load balancers: upstream v1's unmanaged instance group ------------------------------------------


def v1_lb(group: str = "web-ig") -> LoadBalancerConfig:
    """Upstream v1's own shape: provider "gcp", a backend service and its instance group."""
    return LoadBalancerConfig.model_validate(
        {"provider": "gcp", "backend_service_name": "web-backend", "instance_group_name": group}
    )


async def test_v1_instance_group_gets_each_vm_once_and_registering_again_adds_nothing(
    fake: GceFake, provider: GcpProvider
) -> None:
    fake.add_instance_group("web-ig", named_ports={"http": 30080})
    fake.add_network_endpoint_group("web-ig")  # a NEG of the same name is not what a v1 entry means
    lb = v1_lb()
    first, second = targets = await new_targets(provider)

    await provider.register_targets("web", lb, [first])
    await provider.register_targets("web", lb, targets)  # only the VM not in the group yet is added
    await provider.register_targets("web", lb, targets)  # again: nothing to add

    assert fake.instance_group_members("web-ig") == [first.instance_id, second.instance_id]
    assert [c.status for c in fake.calls("instanceGroups.addInstances")] == [200, 200]
    assert fake.network_endpoints("web-ig") == []
    assert fake.calls("zoneOperations.wait"), "add operations are waited on the configured endpoint"
    assert await provider.target_states("web", lb, targets) == {
        t.instance_id: TargetState.REGISTERED for t in targets
    }


async def test_a_vm_another_writer_added_meanwhile_is_not_an_error(
    fake: GceFake, provider: GcpProvider
) -> None:
    fake.add_instance_group("web-ig")
    targets = await new_targets(provider)
    fake.inject_error(
        "instanceGroups.addInstances", code=400, reason="memberAlreadyExists", message="is already a member"
    )

    await provider.register_targets("web", v1_lb(), targets)

    assert sorted(fake.instance_group_members("web-ig")) == sorted(t.instance_id for t in targets)
    assert [c.status for c in fake.calls("instanceGroups.addInstances")] == [400, 200]
    assert len(fake.calls("instanceGroups.listInstances")) == 2  # listed again before adding the rest


async def test_deregistered_vms_leave_the_instance_group(fake: GceFake, provider: GcpProvider) -> None:
    fake.add_instance_group("web-ig")
    lb = v1_lb()
    targets = await new_targets(provider)
    bystander = await new_targets(provider, 1)
    await provider.register_targets("web", lb, [*targets, *bystander])

    await provider.deregister_targets("web", lb, targets)

    assert fake.instance_group_members("web-ig") == [bystander[0].instance_id]
    assert len(fake.calls("instanceGroups.removeInstances")) == 1  # both VMs in one call
    assert await provider.target_states("web", lb, [*targets, *bystander]) == {
        targets[0].instance_id: TargetState.DEREGISTERED,
        targets[1].instance_id: TargetState.DEREGISTERED,
        bystander[0].instance_id: TargetState.REGISTERED,
    }
    await provider.deregister_targets("web", lb, targets)  # again: not members, nothing to do
    assert len(fake.calls("instanceGroups.removeInstances")) == 1


async def test_a_missing_group_needs_no_deregistration_and_refuses_registration(
    fake: GceFake, provider: GcpProvider
) -> None:
    fake.add_instance_group("web-ig")
    targets = await new_targets(provider)
    await provider.register_targets("web", v1_lb(), targets)
    fake.delete_instance_group("web-ig")

    await provider.deregister_targets("web", v1_lb(), targets)

    assert await provider.target_states("web", v1_lb(), targets) == {
        t.instance_id: TargetState.DEREGISTERED for t in targets
    }
    assert fake.calls("instanceGroups.removeInstances") == []
    with pytest.raises(
        ProviderInvalidRequest,
        match=rf"load_balancers\.web\.instance_group_name: instance group projects/proj-1/zones/{ZONE}"
        r"/instanceGroups/web-ig does not exist",
    ):
        await provider.register_targets("web", v1_lb(), targets)


async def test_a_vm_deleted_at_the_provider_leaves_its_group(fake: GceFake, provider: GcpProvider) -> None:
    fake.add_instance_group("web-ig")
    targets = await new_targets(provider)
    await provider.register_targets("web", v1_lb(), targets)

    await provider.delete_instance(targets[0].instance_id, targets[0].provider_id)

    assert fake.instance_group_members("web-ig") == [targets[1].instance_id]
    states = await provider.target_states("web", v1_lb(), targets)
    assert states[targets[0].instance_id] == TargetState.DEREGISTERED


@pytest.mark.parametrize(
    "bad",
    [
        "Bad_Name",
        "regions/us-central1/instanceGroups/web-ig",
        f"zones/{ZONE}/networkEndpointGroups/web-ig",
        "projects/proj-1/zones/us-central1-b/instanceGroups/web-ig",
    ],
)
async def test_a_bad_instance_group_reference_is_refused_naming_its_config_path(
    fake: GceFake, provider: GcpProvider, bad: str
) -> None:
    fake.add_instance_group("web-ig")
    targets = [LbTarget(instance_id="web-1", provider_id="1")]
    path = r"load_balancers\.web\.instance_group_name: "

    with pytest.raises(ProviderInvalidRequest, match=path):
        await provider.register_targets("web", v1_lb(bad), targets)
    with pytest.raises(ProviderInvalidRequest, match=path):
        await provider.deregister_targets("web", v1_lb(bad), targets)
    with pytest.raises(ProviderInvalidRequest, match=path):
        await provider.target_states("web", v1_lb(bad), targets)
    assert [c for c in fake.calls() if c.method.startswith("instanceGroups.")] == []


def test_instance_group_references_accept_a_name_a_zonal_path_a_project_path_and_a_url() -> None:
    path = f"projects/proj-1/zones/{ZONE}/instanceGroups/web-ig"
    for ref in (
        "web-ig",
        f"zones/{ZONE}/instanceGroups/web-ig",
        path,
        f"https://www.googleapis.com/compute/v1/{path}",
    ):
        parsed = group_ref("web", v1_lb(ref), project="proj-1", zone=ZONE)
        assert (parsed.path, parsed.where) == (path, "load_balancers.web.instance_group_name")
    with pytest.raises(ProviderInvalidRequest, match=r"load_balancers\.web\.instance_group_name: is not set"):
        group_ref("web", google_lb("web-neg"), project="proj-1", zone=ZONE)


async def test_a_vm_gce_refuses_for_the_group_is_refused_naming_the_entry(
    fake: GceFake, provider: GcpProvider
) -> None:
    fake.add_instance_group("web-ig")
    fake.add_instance_group("other-net", network="other")
    made = await new_targets(provider, 1)
    where = r"load_balancers\.web\.instance_group_name: "

    with pytest.raises(ProviderInvalidRequest, match=where + r".*web-gone.*was not found"):
        await provider.register_targets("web", v1_lb(), [LbTarget(instance_id="web-gone", provider_id="1")])
    with pytest.raises(ProviderInvalidRequest, match=where + r".*expected to be in the network"):
        await provider.register_targets("web", v1_lb("other-net"), made)
    assert fake.instance_group_members("web-ig") == fake.instance_group_members("other-net") == []


async def test_a_removal_gce_refuses_while_the_vm_is_still_a_member_is_an_error(
    fake: GceFake, provider: GcpProvider
) -> None:
    fake.add_instance_group("web-ig")
    targets = await new_targets(provider, 1)
    await provider.register_targets("web", v1_lb(), targets)
    fake.inject_error("instanceGroups.removeInstances", code=400, reason="invalid", message="refused")

    with pytest.raises(ProviderInvalidRequest, match=r"load_balancers\.web\.instance_group_name: .*refused"):
        await provider.deregister_targets("web", v1_lb(), targets)

    assert fake.instance_group_members("web-ig") == [targets[0].instance_id]


async def test_a_failed_add_operation_is_reported_and_a_later_registration_adds_the_vms(
    fake: GceFake, provider: GcpProvider
) -> None:
    fake.add_instance_group("web-ig")
    targets = await new_targets(provider)
    fake.fail_next_operation("addInstances", code="INVALID_USAGE", message="the group is being updated")

    with pytest.raises(
        ProviderInvalidRequest, match=r"load_balancers\.web\.instance_group_name: .*INVALID_USAGE"
    ):
        await provider.register_targets("web", v1_lb(), targets)
    assert fake.instance_group_members("web-ig") == []

    await provider.register_targets("web", v1_lb(), targets)
    assert sorted(fake.instance_group_members("web-ig")) == sorted(t.instance_id for t in targets)


async def test_many_vms_are_added_in_chunks_and_members_listed_across_pages(
    fake: GceFake, sleeps: Sleeps
) -> None:
    provider = make_provider(fake, sleeps, page_size=2, lb_batch_size=2)
    fake.add_instance_group("web-ig")
    lb = v1_lb()
    targets = await new_targets(provider, 5)
    fake.inject_error("instanceGroups.addInstances", code=503, reason="backendError")

    await provider.register_targets("web", lb, targets)

    assert fake.instance_group_members("web-ig") == [t.instance_id for t in targets]
    assert [c.status for c in fake.calls("instanceGroups.addInstances")] == [503, 200, 200, 200]
    assert set((await provider.target_states("web", lb, targets)).values()) == {TargetState.REGISTERED}
    lists = fake.calls("instanceGroups.listInstances")
    assert [bool(c.query.get("pageToken")) for c in lists] == [False, False, True, True]  # 5 read in 3 pages
    await provider.deregister_targets("web", lb, targets)
    assert fake.instance_group_members("web-ig") == []
    assert len(fake.calls("instanceGroups.removeInstances")) == 3
    await provider.close()


async def test_a_group_removal_still_running_reads_draining_until_its_operation_is_done(
    sleeps: Sleeps,
) -> None:
    with GceFake(project="proj-1", zones=(ZONE,), operation_polls=3) as slow:
        slow.add_subnetwork("workers", cidr="10.20.0.0/24")
        slow.add_instance_group("web-ig")
        lb = v1_lb()
        provider = make_provider(slow, sleeps)
        impatient = make_provider(slow, sleeps, operation_timeout=0.0)  # never waits for an operation
        targets = await new_targets(provider, 1)
        await provider.register_targets("web", lb, targets)
        key = targets[0].instance_id

        await impatient.deregister_targets("web", lb, targets)  # the removal is still running (draining)

        assert await impatient.target_states("web", lb, targets) == {key: TargetState.DRAINING}
        assert await impatient.target_states("web", lb, targets) == {key: TargetState.DRAINING}
        assert await impatient.target_states("web", lb, targets) == {key: TargetState.DEREGISTERED}
        assert slow.instance_group_members("web-ig") == []
        await provider.close()
        await impatient.close()


# ---- the leader network: an alias IP range ---------------------------------------------------------

LEADER_IP = "10.20.0.200"


def aliases(fake: GceFake, name: str) -> list[str]:
    return [r["ipCidrRange"] for r in vm(fake, name)["networkInterfaces"][0].get("aliasIpRanges", [])]


@pytest.mark.parametrize("conflict_in_operation", [False, True])
async def test_the_leader_alias_ip_moves_to_the_new_leader_and_only_the_holder_releases_it(
    fake: GceFake, provider: GcpProvider, conflict_in_operation: bool
) -> None:
    fake.report_ip_conflicts_in_operations(conflict_in_operation)
    a = await provider.create_instance(req())
    b = await provider.create_instance(req())

    await provider.assign_leader_network(a.provider_id, LEADER_IP, "")
    assert aliases(fake, a.instance_id) == [f"{LEADER_IP}/32"]
    updates = len(fake.calls("instances.updateNetworkInterface"))
    await provider.assign_leader_network(a.provider_id, LEADER_IP, "nic0")  # already held: no call
    assert len(fake.calls("instances.updateNetworkInterface")) == updates

    await provider.assign_leader_network(b.provider_id, LEADER_IP, "")  # A still holds it

    assert aliases(fake, b.instance_id) == [f"{LEADER_IP}/32"]
    assert aliases(fake, a.instance_id) == []
    await provider.release_leader_network(a.provider_id, LEADER_IP, "")  # A no longer holds it
    assert aliases(fake, b.instance_id) == [f"{LEADER_IP}/32"]
    await provider.release_leader_network(b.instance_id, LEADER_IP, "")  # a VM name works too
    assert aliases(fake, b.instance_id) == []
    await provider.release_leader_network(b.provider_id, LEADER_IP, "")  # nothing held: no error
    await provider.release_leader_network("99999", LEADER_IP, "")  # a VM that is gone holds nothing


async def test_the_leader_range_keeps_other_alias_ranges_and_a_stale_fingerprint_is_retried(
    fake: GceFake, provider: GcpProvider
) -> None:
    made = await provider.create_instance(req())
    fake.set_alias_ranges(made.instance_id, ["10.20.0.128/28"])
    fake.bump_fingerprint_on_update(1)

    await provider.assign_leader_network(made.provider_id, LEADER_IP, "nic0")

    assert aliases(fake, made.instance_id) == ["10.20.0.128/28", f"{LEADER_IP}/32"]
    assert [c.status for c in fake.calls("instances.updateNetworkInterface")] == [412, 200]
    await provider.release_leader_network(made.provider_id, LEADER_IP, "nic0")
    assert aliases(fake, made.instance_id) == ["10.20.0.128/28"]

    fake.bump_fingerprint_on_update(50)
    with pytest.raises(ProviderUnavailable, match="fingerprint"):
        await provider.assign_leader_network(made.provider_id, LEADER_IP, "")


async def test_leader_network_errors_name_the_setting_to_fix(fake: GceFake, provider: GcpProvider) -> None:
    made = await provider.create_instance(req())
    other = await provider.create_instance(req())

    with pytest.raises(ProviderInvalidRequest, match=r"shard\.leader_network\.interface_id: .*nic3.*nic0"):
        await provider.assign_leader_network(made.provider_id, LEADER_IP, "nic3")
    with pytest.raises(ProviderInvalidRequest, match=r"shard\.leader_network\.ip: \"leader\""):
        await provider.assign_leader_network(made.provider_id, "leader", "")
    with pytest.raises(ProviderInvalidRequest, match=r"shard\.leader_network\.ip: .*IPv6"):
        await provider.assign_leader_network(made.provider_id, "fd00::10", "")
    with pytest.raises(ProviderInvalidRequest, match=r"shard\.leader_network\.ip: .*primary range"):
        await provider.assign_leader_network(made.provider_id, "10.99.0.5", "")
    with pytest.raises(ProviderInvalidRequest, match=r"shard\.leader_network\.ip: .*no other VM"):
        await provider.assign_leader_network(made.provider_id, other.ip4, "")  # another VM's own address
    assert aliases(fake, made.instance_id) == []
    assert aliases(fake, other.instance_id) == []


# ---- the VM this process runs on, and machine-type checks -------------------------------------------


async def test_own_instance_id_comes_from_the_metadata_server(
    provider: GcpProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    with MetadataServer() as server:
        server.google_preemptible = False
        server.google_instance_id = "7350142185551115712"
        monkeypatch.setenv("GCE_METADATA_HOST", server.url.removeprefix("http://"))

        assert await provider.own_instance_id() == "7350142185551115712"
        assert ("GET", "/computeMetadata/v1/instance/id") in server.requests


async def test_own_instance_id_without_a_google_metadata_server_is_unavailable(
    provider: GcpProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{closed_port}")
    with pytest.raises(ProviderUnavailable, match=r"did not answer.*--provider-instance-id"):
        await provider.own_instance_id()

    with MetadataServer() as elsewhere:  # a metadata server that is not Google's answers 404
        monkeypatch.setenv("GCE_METADATA_HOST", elsewhere.url.removeprefix("http://"))
        with pytest.raises(ProviderUnavailable, match=r"404.*NSTANCE_PROVIDER_INSTANCE_ID"):
            await provider.own_instance_id()


async def test_check_instance_type_refuses_another_arch_naming_the_given_path(
    fake: GceFake, provider: GcpProvider
) -> None:
    with pytest.raises(
        ProviderInvalidRequest,
        match=r"^templates\.web\.instance_type: machine type 't2a-standard-1' .* is arm64, "
        r"but template 'web' has arch 'amd64'",
    ):
        await provider.check_instance_type(
            "t2a-standard-1", "amd64", template="web", where="templates.web.instance_type"
        )
    await provider.check_instance_type(
        "t2a-standard-1", "arm64", template="web", where="templates.web.instance_type"
    )
    with pytest.raises(
        ProviderInvalidRequest, match=r"^groups\.default\.api\.instance_type: 'huge-1' is not"
    ):
        await provider.check_instance_type(
            "huge-1", "amd64", template="web", where="groups.default.api.instance_type"
        )
    assert len(fake.calls("machineTypes.get")) == 2  # t2a-standard-1 read once, then cached


async def test_the_shipped_example_load_balancer_and_leader_network_work_on_the_fake(sleeps: Sleeps) -> None:
    config = load_config_file(EXAMPLE)
    project = config.shard.infra.options["project"]
    leader = config.shard.leader_network
    assert leader is not None
    with GceFake(project=project, zones=(ZONE,)) as fake:
        fake.add_machine_type("n2-standard-8", guest_cpus=8, memory_mb=32768)
        fake.add_subnetwork("workers", cidr="10.20.0.0/24")
        fake.add_subnetwork("control", cidr="10.10.0.0/24")
        provider = make_provider(fake, sleeps)
        merged = merged_group(config, {}, "default", "ingress")
        (lb_name,) = merged.load_balancers
        lb = config.load_balancers[lb_name]
        for ref in neg_refs(lb_name, lb, project=project, zone=ZONE):
            fake.add_network_endpoint_group(ref.name, default_port=30443)
        made = await provider.create_instance(
            req(
                group="ingress",
                template=merged.template,
                instance_type=merged.instance_type,
                args=merged.args,
            )
        )
        target = LbTarget(instance_id=made.instance_id, provider_id=made.provider_id, ip4=made.ip4)

        await provider.register_targets(lb_name, lb, [target])

        assert await provider.target_states(lb_name, lb, [target]) == {
            made.instance_id: TargetState.REGISTERED
        }
        server = await provider.create_instance(req(subnet_id="control", args=merged.args))
        await provider.assign_leader_network(server.provider_id, leader.ip, leader.interface_id)
        assert aliases(fake, server.instance_id) == [f"{leader.ip}/32"]
        await provider.close()
