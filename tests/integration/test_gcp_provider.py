"""The gcp provider against the GCE REST fake, through the real google-cloud-compute REST client.

What a shard server relies on: VMs carry the nstance-* labels and are listed by cluster and shard
across pages; creates are idempotent per token (requestId) and per name; deletes tolerate absence;
throttling and 5xx are retried with backoff and then reported as the right error; a VM that is not yet
visible after its insert is not an error; an instance type of the wrong arch is refused before launch;
operations are waited on the configured endpoint (never compute.googleapis.com).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials

from nstance.config.loader import load_config_file
from nstance.config.merge import all_group_keys, merged_group
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
from nstance.providers.gcp import GcpProvider, gcp_provider_from_options, request_id_for
from nstance.providers.gcp.labels import label_key, label_value, merge_labels
from nstance.providers.gcp.resources import subnetwork_path
from nstance.providers.gcp.status import map_status
from nstance.testing.gcefake import GceFake
from nstance.testing.requests import sample_create_request

ZONE = "us-central1-a"
IMAGE = "projects/debian-cloud/global/images/family/debian-12"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gcp" / "config.jsonc"


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


def make_provider(fake: GceFake, sleeps: Sleeps, *, page_size: int = 500) -> GcpProvider:
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
        merged = merged_group(config, {}, tenant, group)
        request = req(
            tenant=tenant,
            group=group,
            template=merged.template,
            kind=merged.kind,
            arch=merged.arch,
            instance_type=merged.instance_type,
            subnet_id=config.shard.subnet_pools[merged.subnet_pool][0],
            args=merged.args,
            spot=False,
            instance_id=new_instance_id(merged.kind),
        )
        made = await provider.create_instance(request)
        assert made.status == InstanceStatus.RUNNING, (tenant, group)
    spot = next(i for i in fake.instances() if i["labels"]["nstance-template"] == "kns")
    assert spot["scheduling"]["provisioningModel"] == "SPOT"
    arm = next(i for i in fake.instances() if i["labels"]["nstance-template"] == "kna")
    assert arm["cpuPlatform"] == "Ampere Altra"
