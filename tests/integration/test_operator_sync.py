"""The sync manager against two real shard servers (sim provider) and the Kubernetes API emulator.

Shard zone-a has the static group ``web`` with size 3, zone-b with size 2. zone-a's simulated cloud
launches at most three instances (an instance token bucket), so any further create fails and the
server reports a provider error on WatchErrors.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from operator_harness import CRDS, NS, connect, fast_shard_set, operator_context

from nstance.operator.config import ShardEndpoint
from nstance.operator.context import OperatorContext, Timings
from nstance.operator.crds import names
from nstance.operator.kube import EVENTS, Kube, Object
from nstance.operator.nodes import NodeIndex
from nstance.operator.shards import ShardSet
from nstance.operator.sync import SyncManager
from nstance.operator.sync_kinds import (
    CAPI_MACHINE_POOLS,
    NSTANCE_CLUSTERS,
    NSTANCE_MACHINE_POOLS,
    NSTANCE_SHARD_GROUPS,
)
from nstance.rpc import operator_pb2, operator_pb2_grpc
from nstance.testing.kubeapi import KubeAPIServer
from nstance.testing.shardproc import LocalCluster, ServerProcess, free_port, server_addrs, shard_config
from nstance.testing.waiting import eventually, eventually_sync

pytestmark = pytest.mark.timeout(120)

SHARDS = ("zone-a", "zone-b")
SIZES = {"zone-a": 3, "zone-b": 2}
CLUSTER = "test--default"
TIMINGS = Timings(
    resync=1.0, unreachable_retry=0.5, error_retry=0.5, backoff_base=0.1, backoff_cap=0.5, drain_poll=0.2
)


class Shards:
    """Two shard servers of one cluster, each its own process; either can be stopped and restarted."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cluster = LocalCluster(root / "bucket")
        self.cluster.init()
        self.addrs = {shard: server_addrs() for shard in SHARDS}
        for shard in SHARDS:
            options: dict[str, Any] = {"latency": "2ms"}
            if shard == "zone-a":
                options["instance_bucket"] = {"capacity": 3, "refill_per_second": 0.0001}
            config = shard_config(
                shard=shard,
                addrs=self.addrs[shard],
                provider_options=options,
                groups={"web": {"template": "app", "size": SIZES[shard]}},
                # A lease long enough that a busy CI machine does not cost a server its leadership.
                election={"frequent_interval": "200ms", "infrequent_interval": "1s", "leader_timeout": "6s"},
            )
            self.cluster.write_config(shard, config)
        self.identity = self.cluster.operator_identity(root / "operator")
        self.health = {shard: f"127.0.0.1:{free_port()}" for shard in SHARDS}
        self.procs: dict[str, ServerProcess] = {}
        for shard in SHARDS:
            self.start(shard)

    def start(self, shard: str) -> None:
        process = ServerProcess(
            server_id=f"{shard}-1",
            shard=shard,
            bucket=self.cluster.bucket,
            cachedir=self.root / shard / "cache",
            health_addr=self.health[shard],
            log_path=self.root / shard / "server.log",
        ).start()
        process.wait_healthy()
        eventually_sync(process.is_leader, what=f"shard {shard} to lead", log=process.log)
        self.procs[shard] = process

    def stop(self, shard: str) -> None:
        self.procs[shard].kill()

    def stub(self, shard: str) -> operator_pb2_grpc.OperatorServiceStub:
        return self.cluster.operator_stub(self.identity, self.addrs[shard]["operator_addr"])

    def endpoints(self, *shards: str) -> dict[str, ShardEndpoint]:
        return {
            shard: ShardEndpoint(
                registration_addr=self.addrs[shard]["registration_addr"],
                operator_addr=self.addrs[shard]["operator_addr"],
            )
            for shard in shards
        }


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shards]:
    servers = Shards(tmp_path_factory.mktemp("operator-sync"))
    yield servers
    for process in servers.procs.values():
        process.stop()


@dataclass
class Env:
    api: KubeAPIServer
    kube: Kube
    shard_set: ShardSet
    ctx: OperatorContext


@pytest.fixture
async def env(shards: Shards, tmp_path: Path) -> AsyncIterator[Env]:
    async with KubeAPIServer(crds=[CRDS]) as api:
        kube = await connect(api, tmp_path / "kubeconfig")
        shard_set = fast_shard_set(shards.identity)
        shard_set.update(shards.endpoints(*SHARDS))
        ctx = operator_context(kube, shard_set, TIMINGS, NodeIndex(kube))
        await kube.create(NSTANCE_CLUSTERS, {"metadata": {"name": CLUSTER, "namespace": NS}, "spec": {}}, NS)
        try:
            yield Env(api, kube, shard_set, ctx)
        finally:
            await shard_set.close()
            await kube.close()


@contextlib.asynccontextmanager
async def running(sync: SyncManager) -> AsyncIterator[SyncManager]:
    task = asyncio.create_task(sync.run())
    try:
        yield sync
        assert not task.done(), f"the sync manager stopped: {task}"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def passes(sync: SyncManager, more: int) -> None:
    """Wait until the sync manager completed ``more`` further write passes (resyncs run every second)."""
    target = sync.passes + more

    async def done() -> bool:
        return sync.passes >= target

    await eventually(done, what=f"{more} more sync passes")


async def shard_group(kube: Kube, group: str, shard: str, size: int = 0) -> Object:
    body = {
        "metadata": {
            "name": names.shard_group_name(group, shard),
            "namespace": NS,
            "labels": {names.GROUP_LABEL: group, names.SHARD_LABEL: shard},
        },
        "spec": {"group": group, "shard": shard, "size": size},
    }
    return await kube.create(NSTANCE_SHARD_GROUPS, body, NS)


def condition(obj: Object | None, kind: str) -> dict[str, Any]:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return {}


async def events(kube: Kube, reason: str, name: str) -> list[Object]:
    return [
        e
        for e in await kube.list(EVENTS, NS)
        if e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == name
    ]


def upsert(stub: operator_pb2_grpc.OperatorServiceStub, key: str, size: int) -> None:
    stub.UpsertGroup(
        operator_pb2.UpsertGroupRequest(key=key, config=operator_pb2.GroupConfig(template="app", size=size)),
        timeout=10,
    )


async def test_import_waits_for_every_shard_then_creates_one_pool_with_the_summed_replicas(
    env: Env, shards: Shards
) -> None:
    await asyncio.to_thread(shards.stop, "zone-b")
    try:
        async with running(SyncManager(env.ctx)) as sync:

            async def zone_a_listed() -> bool:
                return "web" in sync.groups("zone-a")

            await eventually(zone_a_listed, what="zone-a's groups")
            await passes(sync, 2)
            assert sync.missing_shards() == ["zone-b"]
            assert not sync.imported.is_set()
            assert await env.kube.list(NSTANCE_MACHINE_POOLS, NS) == []
            assert await env.kube.list(CAPI_MACHINE_POOLS, NS) == []
        async with running(SyncManager(env.ctx)) as sync:
            await passes(sync, 1)
            assert await env.kube.list(NSTANCE_MACHINE_POOLS, NS) == []
            await asyncio.to_thread(shards.start, "zone-b")
            await asyncio.wait_for(sync.imported.wait(), 20)
            assert sync.missing_shards() == []
    finally:
        if shards.procs["zone-b"].proc is not None and shards.procs["zone-b"].proc.poll() is not None:
            await asyncio.to_thread(shards.start, "zone-b")

    (pool,) = await env.kube.list(NSTANCE_MACHINE_POOLS, NS)
    assert pool["metadata"]["name"] == "web"
    assert pool["metadata"]["annotations"][names.MANAGED_BY_ANNOTATION] == names.MANAGED_BY_VALUE
    assert pool["spec"]["group"] == "web"
    assert pool["spec"]["shards"] == ["zone-a", "zone-b"]
    assert "template" not in pool["spec"]  # a static group's template comes from the server config
    (machine_pool,) = await env.kube.list(CAPI_MACHINE_POOLS, NS)
    assert machine_pool["metadata"]["name"] == "web"
    assert machine_pool["spec"]["replicas"] == 5
    assert machine_pool["spec"]["clusterName"] == CLUSTER
    assert machine_pool["spec"]["template"]["spec"]["infrastructureRef"] == {
        "apiGroup": names.GROUP,
        "kind": names.KIND_MACHINE_POOL,
        "name": "web",
    }
    imported = await events(env.kube, "GroupImported", CLUSTER)
    assert len(imported) == 1
    assert "5 replicas" in imported[0]["message"]


async def test_kubernetes_stays_the_source_of_truth_and_shard_groups_mirror_the_shards(
    env: Env, shards: Shards
) -> None:
    async with running(SyncManager(env.ctx)) as sync:
        await asyncio.wait_for(sync.imported.wait(), 20)
        await env.kube.patch(CAPI_MACHINE_POOLS, "web", {"spec": {"replicas": 7}}, NS)
        for shard in SHARDS:
            await shard_group(env.kube, "web", shard, SIZES[shard])

        async def mirrored() -> bool:
            for shard in SHARDS:
                obj = await env.kube.get(NSTANCE_SHARD_GROUPS, f"web--{shard}", NS)
                status = (obj or {}).get("status") or {}
                ids = status.get("providerIDs") or []
                if status.get("replicas") != SIZES[shard] or len(ids) != SIZES[shard] or ids != sorted(ids):
                    return False
                if condition(obj, names.SHARD_REACHABLE).get("status") != "True" or not status.get(
                    "isStatic"
                ):
                    return False
            return True

        await eventually(mirrored, what="shard group status from both shards")
        versions = {
            shard: (await env.kube.get(NSTANCE_SHARD_GROUPS, f"web--{shard}", NS) or {})["metadata"][
                "resourceVersion"
            ]
            for shard in SHARDS
        }
        await passes(sync, 2)
        for shard in SHARDS:  # nothing changed on the shards: nothing is written
            obj = await env.kube.get(NSTANCE_SHARD_GROUPS, f"web--{shard}", NS)
            assert (obj or {})["metadata"]["resourceVersion"] == versions[shard]
        machine_pool = await env.kube.get(CAPI_MACHINE_POOLS, "web", NS)
        assert (machine_pool or {})["spec"]["replicas"] == 7

        # A dynamic group created on one shard after the import becomes a pool of its own.
        stub = shards.stub("zone-b")
        await asyncio.to_thread(upsert, stub, "jobs", 0)
        try:

            async def jobs_pool() -> Object | None:
                return await env.kube.get(NSTANCE_MACHINE_POOLS, "jobs", NS)

            pool = await eventually(jobs_pool, what="an NstanceMachinePool for the new group jobs")
            assert pool["spec"]["shards"] == ["zone-b"]
            assert pool["spec"]["template"] == "app"
            jobs_machine_pool = await env.kube.get(CAPI_MACHINE_POOLS, "jobs", NS)
            assert (jobs_machine_pool or {})["spec"]["replicas"] == 0
            assert ((await env.kube.get(CAPI_MACHINE_POOLS, "web", NS)) or {})["spec"]["replicas"] == 7
        finally:
            await asyncio.to_thread(stub.DeleteGroup, operator_pb2.DeleteGroupRequest(key="jobs"), timeout=10)


async def test_provider_errors_become_warning_events_on_the_shard_group(env: Env, shards: Shards) -> None:
    async with running(SyncManager(env.ctx)) as sync:
        await asyncio.wait_for(sync.imported.wait(), 20)
        await shard_group(env.kube, "burst", "zone-a", 1)
        stub = shards.stub("zone-a")
        await asyncio.to_thread(upsert, stub, "burst", 1)  # zone-a's cloud has no instance tokens left
        try:

            async def provider_errors() -> list[Object]:
                return await events(env.kube, "ProviderError", "burst--zone-a")

            (event, *_) = await eventually(provider_errors, what="a ProviderError event on burst--zone-a")
            assert event["type"] == "Warning"
            assert event["involvedObject"]["kind"] == names.KIND_SHARD_GROUP
            assert event["message"].startswith("shard zone-a, group burst: ")
            assert "bucket empty" in event["message"]
            await passes(sync, 2)  # the server retries the create; the same error is recorded once
            assert len(await provider_errors()) == 1
        finally:
            await asyncio.to_thread(
                stub.DeleteGroup, operator_pb2.DeleteGroupRequest(key="burst"), timeout=10
            )


async def test_a_lost_shard_marks_its_shard_groups_unreachable_until_it_is_back(
    env: Env, shards: Shards
) -> None:
    async with running(SyncManager(env.ctx)) as sync:
        await asyncio.wait_for(sync.imported.wait(), 20)
        await shard_group(env.kube, "web", "zone-b", SIZES["zone-b"])

        async def reachable(value: str) -> bool:
            obj = await env.kube.get(NSTANCE_SHARD_GROUPS, "web--zone-b", NS)
            return condition(obj, names.SHARD_REACHABLE).get("status") == value

        await eventually(lambda: reachable("True"), what="ShardReachable=True")
        await asyncio.to_thread(shards.stop, "zone-b")
        try:
            await eventually(lambda: reachable("False"), what="ShardReachable=False after the shard stopped")
            lost = condition(
                await env.kube.get(NSTANCE_SHARD_GROUPS, "web--zone-b", NS), names.SHARD_REACHABLE
            )
            assert lost["reason"] == "StreamLost"
            assert "zone-b" in lost["message"]
            # The Event is posted beside the write pass that sets the condition, maybe a little later.
            (event,) = await eventually(
                lambda: events(env.kube, "ShardUnreachable", "web--zone-b"), what="a ShardUnreachable Event"
            )
            assert event["type"] == "Warning"
            assert sync.missing_shards() == ["zone-b"]
        finally:
            await asyncio.to_thread(shards.start, "zone-b")
        await eventually(lambda: reachable("True"), what="ShardReachable=True after the shard is back")
        await eventually(
            lambda: events(env.kube, "ShardReconnected", "web--zone-b"), what="a ShardReconnected Event"
        )

        # Removing a shard from the config stops following it, without a restart.
        env.shard_set.update(shards.endpoints("zone-a"))

        async def forgotten() -> bool:
            return sync.missing_shards() == [] and not sync.groups("zone-b")

        await eventually(forgotten, what="zone-b forgotten")

        # ... and adding it back starts following it again.
        env.shard_set.update(shards.endpoints(*SHARDS))

        async def followed_again() -> bool:
            return "web" in sync.groups("zone-b") and sync.missing_shards() == []

        await eventually(followed_again, what="zone-b listed again after it was added back")
