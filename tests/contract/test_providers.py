"""The Provider contract, run against every provider that needs no cloud: ``sim`` and ``local``.

What a shard server relies on: a created VM can be fetched and is listed under its cluster and shard
only; a retried create with the same idempotency token returns the same VM without launching another;
delete makes the VM go away and may be repeated; unknown VMs raise InstanceNotFound.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from nstance.core.clock import ManualClock
from nstance.core.ids import new_instance_id
from nstance.providers.base import (
    CreateRequest,
    InstanceNotFound,
    InstanceStatus,
    Provider,
    ProviderInvalidRequest,
)
from nstance.providers.local import LocalProvider
from nstance.providers.sim import SimProvider
from nstance.testing.requests import sample_create_request


@dataclass
class Harness:
    provider: Provider
    launches: Callable[[], int]  # how many VMs the provider has actually started so far


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(params=["sim", "local"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    clock = ManualClock()
    if request.param == "sim":
        sim = SimProvider(clock=clock, seed=1)
        yield Harness(sim, lambda: sim.launch_count)
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

    yield Harness(local, lambda: len(launched_pids()))
    pids = launched_pids()
    await local.close()
    assert [pid for pid in pids if not _pid_gone(pid)] == [], "an agent process outlived the test"


def make_request(
    cluster_id: str = "c1", shard: str = "s1", token: str | None = None, **changes: object
) -> CreateRequest:
    return sample_create_request(cluster_id=cluster_id, shard=shard, token=token, **changes)


async def test_created_vm_can_be_fetched_and_is_listed_only_under_its_cluster_and_shard(
    harness: Harness,
) -> None:
    provider = harness.provider
    mine = make_request()
    made = await provider.create_instance(mine)
    other_cluster = await provider.create_instance(make_request(cluster_id="c2"))
    other_shard = await provider.create_instance(make_request(shard="s2"))

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
    request = make_request()
    first = await harness.provider.create_instance(request)
    assert harness.launches() == 1

    again = await harness.provider.create_instance(request)

    assert again.provider_id == first.provider_id
    assert harness.launches() == 1
    assert len(await harness.provider.list_instances("c1", "s1")) == 1


async def test_a_token_cannot_be_reused_for_another_instance(harness: Harness) -> None:
    await harness.provider.create_instance(make_request(token="shared"))

    with pytest.raises(ProviderInvalidRequest, match="shared"):
        await harness.provider.create_instance(make_request(token="shared"))
    assert harness.launches() == 1


async def test_deleted_vm_is_gone_and_delete_can_be_repeated(harness: Harness) -> None:
    provider = harness.provider
    request = make_request()
    made = await provider.create_instance(request)
    kept = await provider.create_instance(make_request())

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
    request = make_request()
    made = await harness.provider.create_instance(request)

    got = await harness.provider.get_instance(request.instance_id, "")

    assert got.provider_id == made.provider_id


async def test_subnets_have_capacity_by_default(harness: Harness) -> None:
    assert await harness.provider.check_subnet_capacity("subnet-a") is True
