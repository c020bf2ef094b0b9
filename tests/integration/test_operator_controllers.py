"""The operator's controllers end to end: kopf + the Kubernetes API emulator + two real shard servers.

Two ``nstance-server`` processes (shards ``zone-a`` and ``zone-b``, sim provider) run for the whole
module; each test starts its own API emulator and runs the operator's kopf registry in-process with
fast timings, then checks what a user would see: Kubernetes objects and conditions, and the groups and
instances on the shard servers. Every test uses its own group names so the shards can be shared.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
from operator_harness import NS, Operator, ShardEnv, running_operator, shard_servers

from nstance.core.ids import parse_puid
from nstance.core.steps import Requeue
from nstance.operator.conditions import find_condition, is_true
from nstance.operator.context import Timings
from nstance.operator.controllers.cluster import ensure_cluster
from nstance.operator.controllers.common import object_logger
from nstance.operator.controllers.machine.create_instance import CreateInstance
from nstance.operator.controllers.machine.reasons import INSTANCE_CREATED
from nstance.operator.controllers.machine.state import make_state as make_machine_state
from nstance.operator.controllers.resources import (
    CAPI_CLUSTERS,
    CAPI_MACHINE_POOLS,
    CAPI_MACHINES,
    NSTANCE_CLUSTERS,
    NSTANCE_MACHINE_POOLS,
    NSTANCE_MACHINES,
    NSTANCE_SHARD_GROUPS,
)
from nstance.operator.crds import names
from nstance.operator.kube import NODES, PODS, Object
from nstance.rpc import operator_pb2
from nstance.testing.operatorproc import capi_machine_pool

pytestmark = pytest.mark.timeout(120)

SHARDS = ("zone-a", "zone-b")
FAST = Timings(
    resync=1.0,
    unreachable_retry=0.3,
    error_retry=0.5,
    backoff_base=0.1,
    backoff_cap=1.0,
    drain_poll=0.1,
    drain_fallback=5.0,
)


@pytest.fixture(scope="module")
def shard_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardEnv]:
    with shard_servers(tmp_path_factory.mktemp("operator-ctl"), SHARDS) as env:
        yield env


Start = Callable[[], contextlib.AbstractAsyncContextManager[Operator]]


@pytest.fixture
def start(shard_env: ShardEnv, tmp_path: Path) -> Start:
    return lambda: running_operator(shard_env, tmp_path, FAST)


# --- helpers ------------------------------------------------------------------------------------------


async def create_pool(op: Operator, name: str, group: str, shards: list[str], replicas: int) -> None:
    pool = capi_machine_pool(name, NS, op.ctx.capi_cluster_name, replicas)
    await op.kube.create(CAPI_MACHINE_POOLS, pool, NS)
    await op.kube.create(
        NSTANCE_MACHINE_POOLS,
        {
            "metadata": {"name": name, "namespace": NS},
            "spec": {"group": group, "shards": shards, "template": "app"},
        },
        NS,
    )


async def shard_group_sizes(op: Operator, group: str) -> dict[str, int]:
    found = await op.kube.list(NSTANCE_SHARD_GROUPS, NS, labels=f"{names.GROUP_LABEL}={group}")
    return {
        sg["spec"]["shard"]: int(sg["spec"].get("size") or 0)
        for sg in found
        if not sg["metadata"].get("deletionTimestamp")
    }


async def server_sizes(op: Operator, group: str) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for shard in SHARDS:
        groups = await op.server_groups(shard)
        out[shard] = groups[group].size if group in groups else None
    return out


def condition(obj: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any] | None:
    return find_condition(((obj or {}).get("status") or {}).get("conditions"), kind)


# --- tests --------------------------------------------------------------------------------------------


async def test_startup_creates_a_ready_cluster_root(start: Start) -> None:
    async with start() as op:
        name = op.ctx.capi_cluster_name
        infra = await op.get(NSTANCE_CLUSTERS, name)
        assert infra is not None
        assert infra["status"]["initialization"]["provisioned"] is True
        assert is_true(infra["status"]["conditions"], names.READY)
        assert infra["spec"]["controlPlaneEndpoint"] == {"host": "127.0.0.1", "port": op.server.port}
        capi = await op.get(CAPI_CLUSTERS, name)
        assert capi is not None
        assert capi["spec"]["infrastructureRef"] == {
            "apiGroup": names.GROUP,
            "kind": names.KIND_CLUSTER,
            "name": name,
        }
        await ensure_cluster(op.ctx)  # idempotent: a second run changes nothing
        again = await op.get(NSTANCE_CLUSTERS, name)
        assert again is not None
        assert again["metadata"]["resourceVersion"] == infra["metadata"]["resourceVersion"]


async def test_pool_replicas_are_spread_over_shards_and_follow_the_machine_pool(start: Start) -> None:
    async with start() as op:
        await create_pool(op, "workers", "workers", ["zone-a", "zone-b"], 5)

        async def spread(expected: dict[str, int]) -> bool:
            return (
                await shard_group_sizes(op, "workers") == expected
                and await server_sizes(op, "workers") == expected
            )

        await op.wait_for(lambda: spread({"zone-a": 3, "zone-b": 2}), "sizes 3 and 2 on both servers")
        sg = await op.get(NSTANCE_SHARD_GROUPS, names.shard_group_name("workers", "zone-a"))
        assert sg is not None
        assert sg["metadata"]["labels"] == {names.GROUP_LABEL: "workers", names.SHARD_LABEL: "zone-a"}
        assert sg["metadata"]["ownerReferences"][0]["kind"] == names.KIND_MACHINE_POOL
        assert sg["metadata"]["ownerReferences"][0]["controller"] is True
        assert names.SHARD_GROUP_FINALIZER in sg["metadata"]["finalizers"]

        async def pool_ready() -> bool:
            pool = await op.get(NSTANCE_MACHINE_POOLS, "workers")
            return pool is not None and is_true((pool.get("status") or {}).get("conditions"), names.READY)

        await op.wait_for(pool_ready, "the pool to be Ready")
        pool = await op.get(NSTANCE_MACHINE_POOLS, "workers")
        assert pool is not None
        assert names.MACHINE_POOL_FINALIZER in pool["metadata"]["finalizers"]
        assert pool["status"]["template"] == "app"
        assert pool["status"]["isStatic"] is False
        machine_pool = await op.get(CAPI_MACHINE_POOLS, "workers")
        assert machine_pool is not None
        assert pool["status"]["observedOwnerGeneration"] == machine_pool["metadata"]["generation"]

        await op.kube.patch(CAPI_MACHINE_POOLS, "workers", {"spec": {"replicas": 1}}, NS)
        await op.wait_for(lambda: spread({"zone-a": 1, "zone-b": 0}), "sizes 1 and 0 after scaling down")


async def test_the_first_listed_shard_takes_the_remainder(start: Start) -> None:
    async with start() as op:
        await create_pool(op, "ordered", "ordered", ["zone-b", "zone-a"], 3)

        async def spread() -> bool:
            expected = {"zone-b": 2, "zone-a": 1}
            return (
                await shard_group_sizes(op, "ordered") == expected
                and await server_sizes(op, "ordered") == expected
            )

        await op.wait_for(spread, "zone-b 2 and zone-a 1")


async def test_removing_a_shard_and_deleting_the_pool_remove_server_groups(start: Start) -> None:
    async with start() as op:
        await create_pool(op, "batch", "batch", ["zone-a", "zone-b"], 2)

        async def on_both() -> bool:
            return await server_sizes(op, "batch") == {"zone-a": 1, "zone-b": 1}

        await op.wait_for(on_both, "the group on both shards")
        await op.kube.patch(NSTANCE_MACHINE_POOLS, "batch", {"spec": {"shards": ["zone-a"]}}, NS)

        async def only_a() -> bool:
            gone = await op.get(NSTANCE_SHARD_GROUPS, names.shard_group_name("batch", "zone-b")) is None
            return gone and await server_sizes(op, "batch") == {"zone-a": 2, "zone-b": None}

        await op.wait_for(only_a, "zone-b's shard group and server group gone, zone-a at 2")

        async def removal_reported() -> bool:  # the Event is posted after the delete, maybe a little later
            return bool(await op.events("ShardGroupRemoved", "batch"))

        await op.wait_for(removal_reported, "a ShardGroupRemoved Event")

        await op.kube.delete(NSTANCE_MACHINE_POOLS, "batch", NS)

        async def all_gone() -> bool:
            pool_gone = await op.get(NSTANCE_MACHINE_POOLS, "batch") is None
            return pool_gone and await server_sizes(op, "batch") == {"zone-a": None, "zone-b": None}

        await op.wait_for(all_gone, "the pool and both server groups gone")
        assert await shard_group_sizes(op, "batch") == {}


async def test_unreachable_shard_is_reported_and_recovers(start: Start) -> None:
    async with start() as op:
        await op.shards.take_down("zone-b")
        await create_pool(op, "flaky", "flaky", ["zone-a", "zone-b"], 2)
        sg_name = names.shard_group_name("flaky", "zone-b")

        async def reported() -> bool:
            sg = await op.get(NSTANCE_SHARD_GROUPS, sg_name)
            reach = condition(sg, names.SHARD_REACHABLE)
            return (
                reach is not None
                and reach["status"] == "False"
                and bool(await op.events("ShardUnreachable", sg_name))
            )

        await op.wait_for(reported, "ShardReachable=False and a ShardUnreachable event")

        async def not_ready() -> bool:  # Ready is written by its own status update, maybe a little later
            ready = condition(await op.get(NSTANCE_SHARD_GROUPS, sg_name), names.READY)
            return ready is not None and ready["status"] == "False" and ready["reason"] == "ShardUnreachable"

        await op.wait_for(not_ready, "the shard group's Ready=False (ShardUnreachable)")

        async def pool_says_why() -> bool:
            pool_ready = condition(await op.get(NSTANCE_MACHINE_POOLS, "flaky"), names.READY)
            return pool_ready is not None and "zone-b (ShardUnreachable" in str(pool_ready.get("message"))

        await op.wait_for(pool_says_why, "the pool's Ready condition to name the unreachable shard")

        async def zone_a_served() -> bool:  # zone-a was not held back by zone-b
            group = (await op.server_groups("zone-a")).get("flaky")
            return group is not None and group.size == 1

        await op.wait_for(zone_a_served, "zone-a's share (size 1) on its server")

        await op.shards.bring_up("zone-b")

        async def recovered() -> bool:
            sg = await op.get(NSTANCE_SHARD_GROUPS, sg_name)
            return is_true(((sg or {}).get("status") or {}).get("conditions"), names.SHARD_REACHABLE) and (
                await server_sizes(op, "flaky")
            ) == {"zone-a": 1, "zone-b": 1}

        await op.wait_for(recovered, "zone-b reachable again with its share")
        await op.wait_for(lambda: _pool_ready(op, "flaky"), "the pool Ready again")


async def _pool_ready(op: Operator, name: str) -> bool:
    pool = await op.get(NSTANCE_MACHINE_POOLS, name)
    return is_true(((pool or {}).get("status") or {}).get("conditions"), names.READY)


async def test_a_refused_config_marks_the_shard_group_invalid(start: Start) -> None:
    async with start() as op:
        await create_pool(op, "broken", "broken", ["zone-a"], 1)
        await op.kube.patch(NSTANCE_MACHINE_POOLS, "broken", {"spec": {"template": "no-such-template"}}, NS)
        # The first upsert (template app) may already have succeeded; the new template is refused.
        sg_name = names.shard_group_name("broken", "zone-a")

        async def invalid() -> bool:
            sg = await op.get(NSTANCE_SHARD_GROUPS, sg_name)
            valid = condition(sg, names.CONFIG_VALID)
            return valid is not None and valid["status"] == "False"

        await op.wait_for(invalid, "ConfigValid=False")
        sg = await op.get(NSTANCE_SHARD_GROUPS, sg_name)
        ready = condition(sg, names.READY)
        assert ready is not None
        assert ready["reason"] == "ConfigInvalid"
        assert "no-such-template" in ready["message"]
        assert await op.events("ConfigInvalid", sg_name)


async def test_a_pool_listing_an_unconfigured_shard_is_invalid(start: Start) -> None:
    async with start() as op:
        await create_pool(op, "far", "far", ["zone-a", "zone-z"], 2)

        async def invalid() -> bool:
            ready = condition(await op.get(NSTANCE_MACHINE_POOLS, "far"), names.READY)
            return ready is not None and ready["reason"] == "Invalid"

        await op.wait_for(invalid, "Ready=False reason Invalid")
        ready = condition(await op.get(NSTANCE_MACHINE_POOLS, "far"), names.READY)
        assert ready is not None
        assert "'zone-z'" in ready["message"]
        assert await shard_group_sizes(op, "far") == {}
        assert (await server_sizes(op, "far")) == {"zone-a": None, "zone-b": None}


async def test_a_second_pool_for_the_same_group_is_refused(start: Start) -> None:
    async with start() as op:
        await create_pool(op, "first", "shared", ["zone-a"], 1)
        await op.wait_for(lambda: _pool_ready(op, "first"), "the first pool Ready")
        await create_pool(op, "second", "shared", ["zone-b"], 4)

        async def duplicate() -> bool:
            ready = condition(await op.get(NSTANCE_MACHINE_POOLS, "second"), names.READY)
            return ready is not None and ready["reason"] == "DuplicateGroup"

        await op.wait_for(duplicate, "DuplicateGroup on the second pool")
        assert (await server_sizes(op, "shared")) == {"zone-a": 1, "zone-b": None}
        second = await op.get(NSTANCE_MACHINE_POOLS, "second")
        assert second is not None
        assert names.MACHINE_POOL_FINALIZER not in (second["metadata"].get("finalizers") or [])
        # Deleting the duplicate leaves the first pool's group alone.
        await op.kube.delete(NSTANCE_MACHINE_POOLS, "second", NS)
        await op.wait_for(lambda: _absent(op, NSTANCE_MACHINE_POOLS, "second"), "the duplicate pool gone")
        assert (await server_sizes(op, "shared"))["zone-a"] == 1


async def _absent(op: Operator, res: Any, name: str) -> bool:
    return await op.get(res, name) is None


# --- NstanceMachine and on-demand pods ----------------------------------------------------------------


async def create_machine(op: Operator, name: str, group: str, *, failure_domain: str = "") -> Object:
    machine_spec: dict[str, Any] = {
        "clusterName": op.ctx.capi_cluster_name,
        "bootstrap": {"dataSecretName": ""},
        "infrastructureRef": {"apiGroup": names.GROUP, "kind": names.KIND_MACHINE, "name": name},
    }
    if failure_domain:
        machine_spec["failureDomain"] = failure_domain
    machine = await op.kube.create(
        CAPI_MACHINES, {"metadata": {"name": name, "namespace": NS}, "spec": machine_spec}, NS
    )
    owner = {
        "apiVersion": names.CAPI_API_VERSION,
        "kind": names.CAPI_KIND_MACHINE,
        "name": name,
        "uid": machine["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    await op.kube.create(
        NSTANCE_MACHINES,
        {"metadata": {"name": name, "namespace": NS, "ownerReferences": [owner]}, "spec": {"group": group}},
        NS,
    )
    return machine


async def machine_with(op: Operator, name: str, predicate: Callable[[Object], bool], what: str) -> Object:
    found: list[Object] = []

    async def check() -> bool:
        obj = await op.get(NSTANCE_MACHINES, name)
        if obj is not None and predicate(obj):
            found.append(obj)
            return True
        return False

    await op.wait_for(check, what)
    return found[-1]


def _created(obj: Object) -> bool:
    return is_true((obj.get("status") or {}).get("conditions"), INSTANCE_CREATED)


async def instance_status(op: Operator, shard: str, instance_id: str) -> operator_pb2.InstanceStatusResponse:
    request = operator_pb2.GetInstanceStatusRequest(instance_id=instance_id)
    reply: operator_pb2.InstanceStatusResponse = await op.shards.stub(shard).GetInstanceStatus(
        request, timeout=5
    )
    return reply


async def test_machine_creates_its_instance_once_with_the_template_kind(start: Start) -> None:
    async with start() as op:
        await create_machine(op, "m1", "web", failure_domain="zone-b")
        obj = await machine_with(op, "m1", _created, "InstanceCreated")
        status = obj["status"]
        assert status["shard"] == "zone-b"
        # The shard's template "app" creates kind "app": the first guess ("ins") was refused and replaced.
        assert status["instanceID"].startswith("app")
        assert names.MACHINE_FINALIZER in obj["metadata"]["finalizers"]
        records_before = op.env.instance_records("zone-b")
        record = f"default.{parse_puid(status['instanceID']).storage_key}.json"
        assert [p.name for p in records_before].count(record) == 1
        reply = await instance_status(op, "zone-b", status["instanceID"])
        assert reply.instance_id == status["instanceID"]

        # A crash after CreateInstance was sent but before InstanceCreated was saved: the step runs again
        # with the same saved ID and the server hands back the same instance instead of a second VM.
        logger = object_logger("NstanceMachine", NS, "m1")
        for _attempt in range(10):
            fresh = await op.get(NSTANCE_MACHINES, "m1")
            assert fresh is not None
            conditions = [c for c in fresh["status"]["conditions"] if c["type"] != INSTANCE_CREATED]
            fresh["status"]["conditions"] = conditions
            state = make_machine_state(op.ctx, NSTANCE_MACHINES, fresh, logger)
            try:
                await CreateInstance()(state)
            except Requeue:  # a periodic refresh wrote the status meanwhile; read it again
                continue
            break
        else:
            raise AssertionError("could not replay CreateInstance")
        assert is_true(state.obj["status"]["conditions"], INSTANCE_CREATED)
        assert op.env.instance_records("zone-b") == records_before
        after = await op.get(NSTANCE_MACHINES, "m1")
        assert after is not None
        assert after["status"]["instanceID"] == status["instanceID"]


async def test_machine_finds_its_node_and_sets_the_machine_node_ref(start: Start) -> None:
    async with start() as op:
        await create_machine(op, "m2", "web")
        obj = await machine_with(
            op, "m2", lambda o: bool((o.get("status") or {}).get("providerID")), "a provider ID"
        )
        provider_id = obj["status"]["providerID"]
        await op.kube.create(
            NODES,
            {
                "metadata": {"name": "node-m2"},
                "spec": {"providerID": f"sim:///test/{provider_id}"},
                "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.7"}]},
            },
        )

        async def linked() -> bool:
            machine = await op.get(CAPI_MACHINES, "m2")
            nm = await op.get(NSTANCE_MACHINES, "m2")
            node_ref = ((machine or {}).get("status") or {}).get("nodeRef") or {}
            return node_ref.get("name") == "node-m2" and (nm or {}).get("spec", {}).get("providerID") == (
                f"sim:///test/{provider_id}"
            )

        await op.wait_for(linked, "Machine.status.nodeRef and NstanceMachine.spec.providerID")
        nm = await op.get(NSTANCE_MACHINES, "m2")
        assert nm is not None
        assert nm["status"]["addresses"] == [{"type": "InternalIP", "address": "10.0.0.7"}]


async def test_machines_spread_over_reachable_shards(start: Start) -> None:
    async with start() as op:
        for name in ("s1", "s2"):
            await create_machine(op, name, "web")
            await machine_with(op, name, lambda o: bool((o.get("status") or {}).get("shard")), "a shard")
        first = await op.get(NSTANCE_MACHINES, "s1")
        second = await op.get(NSTANCE_MACHINES, "s2")
        assert first is not None
        assert second is not None
        assert {first["status"]["shard"], second["status"]["shard"]} == set(SHARDS)


async def test_deleting_a_machine_deletes_its_instance(start: Start) -> None:
    async with start() as op:
        await create_machine(op, "m3", "web", failure_domain="zone-a")
        obj = await machine_with(op, "m3", _created, "InstanceCreated")
        instance_id = obj["status"]["instanceID"]
        await op.kube.delete(NSTANCE_MACHINES, "m3", NS)
        await op.wait_for(lambda: _absent(op, NSTANCE_MACHINES, "m3"), "the NstanceMachine gone")

        async def deleted() -> bool:
            try:
                reply = await instance_status(op, "zone-a", instance_id)
            except grpc.aio.AioRpcError as exc:
                return bool(exc.code() == grpc.StatusCode.NOT_FOUND)
            return reply.status == "deleted"

        await op.wait_for(deleted, "the instance deleted on the server")


async def test_server_deleted_machine_is_released_without_delete_instance(start: Start) -> None:
    async with start() as op:
        await create_machine(op, "m4", "web", failure_domain="zone-a")
        obj = await machine_with(op, "m4", _created, "InstanceCreated")
        instance_id = obj["status"]["instanceID"]
        conditions = [
            *list(obj["status"]["conditions"]),
            {
                "type": names.SERVER_DELETED,
                "status": "True",
                "reason": "scale-down",
                "message": "deleted by the server",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
        ]
        await op.kube.patch(NSTANCE_MACHINES, "m4", {"status": {"conditions": conditions}}, NS, status=True)
        await op.kube.delete(NSTANCE_MACHINES, "m4", NS)
        await op.wait_for(lambda: _absent(op, NSTANCE_MACHINES, "m4"), "the NstanceMachine released")
        # The finalizer went without DeleteInstance: the server still has the instance.
        reply = await instance_status(op, "zone-a", instance_id)
        assert reply.status != "deleted"


async def test_on_demand_pod_gets_a_machine_is_pinned_and_cleans_up(start: Start) -> None:
    async with start() as op:
        await op.kube.create(
            PODS,
            {
                "metadata": {
                    "name": "job-1",
                    "namespace": NS,
                    "annotations": {"on-demand.nstance.dev/group": "web"},
                },
                "spec": {
                    "schedulingGates": [{"name": "nstance.dev/on-demand"}],
                    "containers": [{"name": "main", "image": "busybox"}],
                },
            },
            NS,
        )

        async def created() -> bool:
            machine = await op.get(CAPI_MACHINES, "on-demand-job-1")
            nm = await op.get(NSTANCE_MACHINES, "on-demand-job-1")
            return machine is not None and nm is not None and bool((nm.get("status") or {}).get("providerID"))

        await op.wait_for(created, "Machine + NstanceMachine with an instance")
        machine = await op.get(CAPI_MACHINES, "on-demand-job-1")
        nm = await op.get(NSTANCE_MACHINES, "on-demand-job-1")
        pod = await op.get(PODS, "job-1")
        assert machine is not None
        assert nm is not None
        assert pod is not None
        assert machine["spec"]["clusterName"] == op.ctx.capi_cluster_name
        assert machine["spec"]["bootstrap"] == {"dataSecretName": ""}
        assert machine["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        assert nm["spec"]["group"] == "web"
        assert nm["metadata"]["ownerReferences"][0]["uid"] == machine["metadata"]["uid"]
        assert names.ONDEMAND_POD_FINALIZER in pod["metadata"]["finalizers"]

        await op.kube.create(
            NODES,
            {
                "metadata": {"name": "node-job-1"},
                "spec": {"providerID": f"sim:///x/{nm['status']['providerID']}"},
            },
        )

        async def pinned() -> bool:
            pod = await op.get(PODS, "job-1")
            pod_spec = (pod or {}).get("spec") or {}
            return (pod_spec.get("nodeSelector") or {}).get(
                "kubernetes.io/hostname"
            ) == "node-job-1" and not (pod_spec.get("schedulingGates"))

        await op.wait_for(pinned, "the pod pinned to its node with the gate removed")

        instance_id = nm["status"]["instanceID"]
        shard = nm["status"]["shard"]
        await op.kube.delete(PODS, "job-1", NS)

        async def cleaned() -> bool:
            gone = all(
                [
                    await op.get(PODS, "job-1") is None,
                    await op.get(CAPI_MACHINES, "on-demand-job-1") is None,
                    await op.get(NSTANCE_MACHINES, "on-demand-job-1") is None,
                ]
            )
            if not gone:
                return False
            try:
                reply = await instance_status(op, shard, instance_id)
            except grpc.aio.AioRpcError as exc:
                return bool(exc.code() == grpc.StatusCode.NOT_FOUND)
            return reply.status == "deleted"

        await op.wait_for(cleaned, "pod, Machine, NstanceMachine and instance all gone")


async def test_a_pool_without_machine_pool_gets_one_with_zero_replicas(start: Start) -> None:
    async with start() as op:
        spec = {"group": "lonely", "shards": ["zone-a"], "template": "app"}
        await op.kube.create(NSTANCE_MACHINE_POOLS, {"metadata": {"name": "lonely"}, "spec": spec}, NS)

        async def created() -> bool:
            return (
                await op.get(CAPI_MACHINE_POOLS, "lonely") is not None
                and (await server_sizes(op, "lonely"))["zone-a"] == 0
            )

        await op.wait_for(created, "a MachinePool and the group at size 0")
        machine_pool = await op.get(CAPI_MACHINE_POOLS, "lonely")
        assert machine_pool is not None
        assert machine_pool["spec"]["replicas"] == 0
        assert machine_pool["spec"]["clusterName"] == op.ctx.capi_cluster_name
        assert machine_pool["spec"]["template"]["spec"]["infrastructureRef"] == {
            "apiGroup": names.GROUP,
            "kind": names.KIND_MACHINE_POOL,
            "name": "lonely",
        }
        assert await op.events("MachinePoolCreated", "lonely")


async def test_a_pool_of_a_static_group_reports_static_and_keeps_the_group(start: Start) -> None:
    async with start() as op:
        # "web" is defined in both shards' config.jsonc: the pool may size it but not own it.
        await create_pool(op, "web", "web", ["zone-a"], 2)

        async def static() -> bool:
            pool = await op.get(NSTANCE_MACHINE_POOLS, "web")
            return (
                bool(((pool or {}).get("status") or {}).get("isStatic"))
                and (await server_sizes(op, "web"))["zone-a"] == 2
            )

        await op.wait_for(static, "isStatic on the pool and size 2 on zone-a")
        await op.kube.delete(NSTANCE_MACHINE_POOLS, "web", NS)
        await op.wait_for(lambda: _absent(op, NSTANCE_MACHINE_POOLS, "web"), "the pool gone")
        # Deleting the pool removed the operator's override; the static group (size 0) stays.
        assert (await server_sizes(op, "web")) == {"zone-a": 0, "zone-b": 0}
