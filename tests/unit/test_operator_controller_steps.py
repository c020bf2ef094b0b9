"""Controller steps on their own: the finalizer and status steps every controller shares, and the steps
of the NstanceShardGroup and NstanceMachine controllers, each run against the in-memory stand-ins of
``operator_standins`` (the controllers as a whole run against the API emulator and real shard servers
in tests/integration/test_operator_controllers.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest
from operator_standins import ERROR_RETRY, NS, RESYNC, UNREACHABLE_RETRY, World, condition, rpc_error

from nstance.core.steps import Done, Requeue
from nstance.operator.conditions import is_true
from nstance.operator.controllers.common import AddFinalizer, RemoveFinalizer, WriteStatus
from nstance.operator.controllers.machine.choose_instance import ChooseInstance
from nstance.operator.controllers.machine.correlate_node import CorrelateNode
from nstance.operator.controllers.machine.create_instance import CreateInstance
from nstance.operator.controllers.machine.delete_instance import DeleteInstance
from nstance.operator.controllers.machine.find_owner_machine import FindOwnerMachine
from nstance.operator.controllers.machine.reasons import INSTANCE_CREATED, MachineReason
from nstance.operator.controllers.machine.refresh_instance import RefreshInstance
from nstance.operator.controllers.machine.state import MachineState
from nstance.operator.controllers.machine.update_status import SETTLED_FACTOR, UpdateStatus
from nstance.operator.controllers.machine.validate_spec import StopIfServerDeleted
from nstance.operator.controllers.machine.validate_spec import ValidateSpec as ValidateMachineSpec
from nstance.operator.controllers.resources import CAPI_MACHINES, NSTANCE_MACHINES, NSTANCE_SHARD_GROUPS
from nstance.operator.controllers.shardgroup.delete_group import DeleteGroup
from nstance.operator.controllers.shardgroup.reasons import ShardGroupReason
from nstance.operator.controllers.shardgroup.state import ShardGroupState
from nstance.operator.controllers.shardgroup.upsert_group import UpsertGroup
from nstance.operator.controllers.shardgroup.validate_spec import ValidateSpec as ValidateShardGroupSpec
from nstance.operator.crds.names import (
    API_VERSION,
    CAPI_GROUP,
    CAPI_KIND_MACHINE,
    CONFIG_VALID,
    READY,
    SERVER_DELETED,
    SHARD_GROUP_FINALIZER,
    SHARD_REACHABLE,
)
from nstance.operator.kube import NODES, KubeError, Object
from nstance.rpc import operator_pb2

log = logging.getLogger("test.controller-steps")


@pytest.fixture
def w() -> World:
    return World()


# --- finalizers and status (every controller) ----------------------------------------------------------


def shard_group(generation: int = 1, **status: Any) -> Object:
    return {
        "apiVersion": API_VERSION,
        "kind": "NstanceShardGroup",
        "metadata": {"name": "web--s1", "namespace": NS, "generation": generation},
        "spec": {"group": "web", "shard": "s1", "size": 2, "template": "app"},
        "status": status,
    }


async def test_add_finalizer_creates_the_list_and_keeps_other_finalizers(w: World) -> None:
    state = w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, shard_group())
    await AddFinalizer(SHARD_GROUP_FINALIZER)(state)
    assert w.stored(NSTANCE_SHARD_GROUPS, "web--s1")["metadata"]["finalizers"] == [SHARD_GROUP_FINALIZER]
    other = shard_group()
    other["metadata"]["finalizers"] = ["someone.else/finalizer"]
    state = w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, other)
    await AddFinalizer(SHARD_GROUP_FINALIZER)(state)
    await AddFinalizer(SHARD_GROUP_FINALIZER)(state)  # already there: no second entry
    finalizers = w.stored(NSTANCE_SHARD_GROUPS, "web--s1")["metadata"]["finalizers"]
    assert finalizers == ["someone.else/finalizer", SHARD_GROUP_FINALIZER]


async def test_add_finalizer_on_a_changed_object_reads_it_again(w: World) -> None:
    state = w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, shard_group())
    w.kube.put(NSTANCE_SHARD_GROUPS, w.stored(NSTANCE_SHARD_GROUPS, "web--s1"))  # a newer version
    with pytest.raises(Requeue) as requeue:
        await AddFinalizer(SHARD_GROUP_FINALIZER)(state)
    assert requeue.value.after == 0


async def test_remove_finalizer_takes_only_ours_and_a_gone_object_ends_the_run(w: World) -> None:
    obj = shard_group()
    obj["metadata"]["finalizers"] = ["someone.else/finalizer", SHARD_GROUP_FINALIZER]
    state = w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, obj)
    await RemoveFinalizer(SHARD_GROUP_FINALIZER)(state)
    assert w.stored(NSTANCE_SHARD_GROUPS, "web--s1")["metadata"]["finalizers"] == ["someone.else/finalizer"]
    obj["metadata"]["finalizers"] = [SHARD_GROUP_FINALIZER]
    state = w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, obj)
    w.kube.objects.clear()
    with pytest.raises(Done):
        await RemoveFinalizer(SHARD_GROUP_FINALIZER)(state)


async def test_write_status_writes_only_a_difference_and_requeues_on_a_conflict(w: World) -> None:
    state = w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, shard_group(replicas=2))
    state.status_updates["replicas"] = 2
    await WriteStatus()(state)
    assert w.kube.writes == []
    state.status_updates["replicas"] = 3
    await WriteStatus()(state)
    assert w.stored(NSTANCE_SHARD_GROUPS, "web--s1")["status"]["replicas"] == 3
    w.kube.put(NSTANCE_SHARD_GROUPS, w.stored(NSTANCE_SHARD_GROUPS, "web--s1"))  # someone else wrote
    state.status_updates["replicas"] = 4
    with pytest.raises(Requeue):
        await WriteStatus()(state)


# --- NstanceShardGroup ---------------------------------------------------------------------------------


async def test_shard_group_validate_spec_marks_a_bad_spec_and_stops(w: World) -> None:
    bad = shard_group()
    bad["spec"]["size"] = -1
    state = w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, bad)
    with pytest.raises(Done):
        await ValidateShardGroupSpec()(state)
    stored = w.stored(NSTANCE_SHARD_GROUPS, "web--s1")
    assert condition(stored, CONFIG_VALID)["reason"] == ShardGroupReason.CONFIG_INVALID
    assert "spec.size" in condition(stored, CONFIG_VALID)["message"]
    assert condition(stored, READY)["status"] == "False"
    await ValidateShardGroupSpec()(w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, shard_group()))


def group_status(size: int = 2) -> operator_pb2.GroupStatus:
    return operator_pb2.GroupStatus(
        key="web", template="app", actual_size=size, provider_ids=["i-2", "i-1"], is_static=False
    )


async def test_upsert_group_applies_a_new_generation_and_records_the_answer(w: World) -> None:
    w.stub().answers["UpsertGroup"] = [group_status()]
    state = w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, shard_group(generation=3))
    await UpsertGroup()(state)
    (method, request), *_ = w.stub().calls
    assert (method, request.key, request.config.size, request.config.template) == (
        "UpsertGroup",
        "web",
        2,
        "app",
    )
    updates = state.status_updates
    assert (updates["observedGeneration"], updates["replicas"], updates["providerIDs"]) == (
        3,
        2,
        ["i-1", "i-2"],
    )
    assert is_true(updates["conditions"], READY)
    assert is_true(updates["conditions"], SHARD_REACHABLE)
    assert is_true(updates["conditions"], CONFIG_VALID)


async def test_upsert_group_skips_an_applied_generation(w: World) -> None:
    applied = shard_group(
        generation=3,
        observedGeneration=3,
        conditions=[{"type": READY, "status": "True", "reason": "SyncSucceeded"}],
    )
    await UpsertGroup()(w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, applied))
    assert w.stub().calls == []


async def test_upsert_group_on_an_unreachable_shard_reports_once_and_retries(w: World) -> None:
    w.stub().answers["UpsertGroup"] = [rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused")]
    state = w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, shard_group())
    with pytest.raises(Requeue) as requeue:
        await UpsertGroup()(state)
    assert requeue.value.after == UNREACHABLE_RETRY
    stored = w.stored(NSTANCE_SHARD_GROUPS, "web--s1")
    assert condition(stored, SHARD_REACHABLE)["reason"] == ShardGroupReason.SHARD_UNREACHABLE
    assert w.kube.reasons() == ["ShardUnreachable"]
    w.stub().answers["UpsertGroup"] = [rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused")]
    with pytest.raises(Requeue):
        await UpsertGroup()(w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, stored))
    assert w.kube.reasons() == ["ShardUnreachable"]  # still unreachable: no second Event


async def test_upsert_group_refused_marks_the_config_invalid(w: World) -> None:
    w.stub().answers["UpsertGroup"] = [rpc_error(grpc.StatusCode.INVALID_ARGUMENT, 'unknown template "nope"')]
    with pytest.raises(Requeue) as requeue:
        await UpsertGroup()(w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, shard_group()))
    assert requeue.value.after == ERROR_RETRY
    stored = w.stored(NSTANCE_SHARD_GROUPS, "web--s1")
    assert condition(stored, CONFIG_VALID)["status"] == "False"
    assert condition(stored, READY)["reason"] == ShardGroupReason.CONFIG_INVALID
    assert w.kube.reasons() == ["ConfigInvalid"]


@pytest.mark.parametrize(
    ("answer", "event", "after"),
    [
        (rpc_error(grpc.StatusCode.NOT_FOUND, "no group web"), None, None),
        (rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "group web is static"), "StaticGroupKept", None),
        (rpc_error(grpc.StatusCode.UNAVAILABLE, "down"), None, UNREACHABLE_RETRY),
        (rpc_error(grpc.StatusCode.INTERNAL, "provider"), "DeleteGroupFailed", ERROR_RETRY),
    ],
)
async def test_delete_group_outcomes(
    w: World, answer: Exception, event: str | None, after: float | None
) -> None:
    w.stub().answers["DeleteGroup"] = [answer]
    state = w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, shard_group())
    if after is None:
        await DeleteGroup()(state)
    else:
        with pytest.raises(Requeue) as requeue:
            await DeleteGroup()(state)
        assert requeue.value.after == after
    assert w.kube.reasons() == ([event] if event else [])


async def test_delete_group_on_a_shard_no_longer_configured_lets_the_finalizer_go(w: World) -> None:
    obj = shard_group()
    obj["spec"]["shard"] = "gone"
    await DeleteGroup()(w.state(ShardGroupState, NSTANCE_SHARD_GROUPS, obj))
    assert w.kube.reasons() == ["ShardNotConfigured"]


# --- NstanceMachine ------------------------------------------------------------------------------------


def nstance_machine(*, owner: str | None = None, **status: Any) -> Object:
    meta: dict[str, Any] = {"name": "od-1", "namespace": NS, "generation": 1}
    if owner:
        meta["ownerReferences"] = [
            {"kind": CAPI_KIND_MACHINE, "apiVersion": f"{CAPI_GROUP}/v1beta1", "name": owner}
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": "NstanceMachine",
        "metadata": meta,
        "spec": {"group": "web", "instanceType": "t3.small"},
        "status": status,
    }


def created(instance_id: str = "ins-abc", shard: str = "s1", **extra: Any) -> dict[str, Any]:
    conditions = [{"type": INSTANCE_CREATED, "status": "True", "reason": "Created"}]
    return {"instanceID": instance_id, "shard": shard, "conditions": conditions, **extra}


async def test_machine_validate_spec_and_stop_if_server_deleted(w: World) -> None:
    bad = nstance_machine()
    bad["spec"]["group"] = "Not A Group!"
    with pytest.raises(Done):
        await ValidateMachineSpec()(w.state(MachineState, NSTANCE_MACHINES, bad))
    invalid = condition(w.stored(NSTANCE_MACHINES, "od-1"), READY)
    assert invalid["reason"] == MachineReason.INVALID
    assert "spec.group" in invalid["message"]
    deleted = nstance_machine(conditions=[{"type": SERVER_DELETED, "status": "True", "reason": "ScaleDown"}])
    with pytest.raises(Done):
        await StopIfServerDeleted()(w.state(MachineState, NSTANCE_MACHINES, deleted))
    await StopIfServerDeleted()(w.state(MachineState, NSTANCE_MACHINES, nstance_machine()))


async def test_find_owner_machine_reads_the_owning_capi_machine(w: World) -> None:
    w.kube.put(CAPI_MACHINES, {"metadata": {"name": "m-1", "namespace": NS}, "spec": {"failureDomain": "s2"}})
    state = w.state(MachineState, NSTANCE_MACHINES, nstance_machine(owner="m-1"))
    await FindOwnerMachine()(state)
    assert state.owner_machine is not None
    assert state.owner_machine["spec"]["failureDomain"] == "s2"
    orphan = w.state(MachineState, NSTANCE_MACHINES, nstance_machine())
    await FindOwnerMachine()(orphan)
    assert orphan.owner_machine is None


async def test_choose_instance_saves_shard_and_id_before_creating(w: World) -> None:
    w.kube.put(
        NSTANCE_MACHINES,
        {**nstance_machine(**created("vmx-old", "s1")), "metadata": {"name": "other", "namespace": NS}},
    )
    state = w.state(MachineState, NSTANCE_MACHINES, nstance_machine())
    await ChooseInstance()(state)
    stored = w.stored(NSTANCE_MACHINES, "od-1")["status"]
    assert stored["shard"] == "s2"  # the shard with the fewest machines
    assert stored["instanceID"].startswith("vmx")  # the kind an earlier machine of the group used
    assert w.stub("s1").calls == w.stub("s2").calls == []
    again = w.state(MachineState, NSTANCE_MACHINES, w.stored(NSTANCE_MACHINES, "od-1"))
    await ChooseInstance()(again)
    assert w.stored(NSTANCE_MACHINES, "od-1")["status"]["instanceID"] == stored["instanceID"]


async def test_choose_instance_follows_the_failure_domain_and_waits_without_a_shard(w: World) -> None:
    state = w.state(MachineState, NSTANCE_MACHINES, nstance_machine())
    state.owner_machine = {"spec": {"failureDomain": "s1"}}
    await ChooseInstance()(state)
    assert w.stored(NSTANCE_MACHINES, "od-1")["status"]["shard"] == "s1"
    w.shards.down = {"s1", "s2"}
    nowhere = w.state(MachineState, NSTANCE_MACHINES, nstance_machine())
    with pytest.raises(Requeue) as requeue:
        await ChooseInstance()(nowhere)
    assert requeue.value.after == UNREACHABLE_RETRY
    assert condition(w.stored(NSTANCE_MACHINES, "od-1"), READY)["reason"] == MachineReason.SHARD_UNREACHABLE


async def test_create_instance_creates_once_with_the_saved_id(w: World) -> None:
    w.stub().answers["CreateInstance"] = [operator_pb2.CreateInstanceResponse(instance_id="ins-abc")]
    state = w.state(MachineState, NSTANCE_MACHINES, nstance_machine(instanceID="ins-abc", shard="s1"))
    await CreateInstance()(state)
    (_, request), *_ = w.stub().calls
    assert (request.instance_id, request.config.group, request.config.instance_type) == (
        "ins-abc",
        "web",
        "t3.small",
    )
    stored = w.stored(NSTANCE_MACHINES, "od-1")
    assert condition(stored, INSTANCE_CREATED)["status"] == "True"
    assert w.kube.reasons() == ["InstanceCreated"]
    await CreateInstance()(w.state(MachineState, NSTANCE_MACHINES, stored))
    assert w.stub().count("CreateInstance") == 1


async def test_create_instance_takes_the_kind_the_server_names(w: World) -> None:
    refusal = "instance id 'ins-abc' has prefix 'ins', but template \"app\" creates instances of kind \"vmx\""
    w.stub().answers["CreateInstance"] = [
        rpc_error(grpc.StatusCode.INVALID_ARGUMENT, refusal),
        operator_pb2.CreateInstanceResponse(instance_id="vmx-new"),
    ]
    await CreateInstance()(
        w.state(MachineState, NSTANCE_MACHINES, nstance_machine(instanceID="ins-abc", shard="s1"))
    )
    requests = [request for _, request in w.stub().calls]
    assert requests[0].instance_id == "ins-abc"
    assert requests[1].instance_id.startswith("vmx")
    assert w.stored(NSTANCE_MACHINES, "od-1")["status"]["instanceID"] == requests[1].instance_id


@pytest.mark.parametrize(
    ("error", "reason", "after"),
    [
        (rpc_error(grpc.StatusCode.UNAVAILABLE, "down"), MachineReason.SHARD_UNREACHABLE, UNREACHABLE_RETRY),
        (rpc_error(grpc.StatusCode.NOT_FOUND, "no group web"), MachineReason.CREATE_REFUSED, ERROR_RETRY),
        (rpc_error(grpc.StatusCode.INTERNAL, "quota"), MachineReason.PROVIDER_ERROR, ERROR_RETRY),
    ],
)
async def test_create_instance_failures(w: World, error: Exception, reason: str, after: float) -> None:
    w.stub().answers["CreateInstance"] = [error]
    with pytest.raises(Requeue) as requeue:
        await CreateInstance()(
            w.state(MachineState, NSTANCE_MACHINES, nstance_machine(instanceID="ins-a", shard="s1"))
        )
    assert requeue.value.after == after
    assert condition(w.stored(NSTANCE_MACHINES, "od-1"), READY)["reason"] == reason


async def test_refresh_instance_records_provider_id_and_readiness(w: World) -> None:
    w.stub().answers["GetInstanceStatus"] = [
        operator_pb2.InstanceStatusResponse(
            instance_id="ins-abc", status="running", provider_instance_id="i-9"
        )
    ]
    state = w.state(MachineState, NSTANCE_MACHINES, nstance_machine(**created()))
    await RefreshInstance()(state)
    assert (state.status_updates["providerID"], state.status_updates["ready"]) == ("i-9", True)
    assert state.instance_status == "running"


async def test_refresh_instance_of_a_forgotten_instance_stops_and_of_a_down_shard_retries(w: World) -> None:
    w.stub().answers["GetInstanceStatus"] = [rpc_error(grpc.StatusCode.NOT_FOUND, "unknown instance")]
    with pytest.raises(Done):
        await RefreshInstance()(w.state(MachineState, NSTANCE_MACHINES, nstance_machine(**created())))
    assert condition(w.stored(NSTANCE_MACHINES, "od-1"), READY)["reason"] == MachineReason.INSTANCE_GONE
    w.stub().answers["GetInstanceStatus"] = [rpc_error(grpc.StatusCode.UNAVAILABLE, "down")]
    state = w.state(MachineState, NSTANCE_MACHINES, nstance_machine(**created()))
    await RefreshInstance()(state)
    assert state.requeue_after == UNREACHABLE_RETRY


async def correlate(state: MachineState) -> None:
    """Run correlate_node with the state's Node index loaded from the stand-in."""
    loading = asyncio.create_task(state.ctx.nodes.run())
    try:
        await state.ctx.nodes.wait_synced()
        await CorrelateNode()(state)
    finally:
        loading.cancel()


async def test_correlate_node_links_the_node_to_the_machine_and_its_owner(w: World) -> None:
    node = {
        "metadata": {"name": "node-1"},
        "spec": {"providerID": "aws:///zone-a/i-9"},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.9"}, {"type": "Odd", "address": "x"}]
        },
    }
    w.kube.put(NODES, node)
    w.kube.put(CAPI_MACHINES, {"metadata": {"name": "m-1", "namespace": NS}, "status": {}})
    state = w.state(MachineState, NSTANCE_MACHINES, nstance_machine(owner="m-1", **created(providerID="i-9")))
    await FindOwnerMachine()(state)
    await correlate(state)
    assert state.node_name == "node-1"
    assert w.stored(NSTANCE_MACHINES, "od-1")["spec"]["providerID"] == "aws:///zone-a/i-9"
    assert state.status_updates["addresses"] == [{"type": "InternalIP", "address": "10.0.0.9"}]
    assert w.stored(CAPI_MACHINES, "m-1")["status"]["nodeRef"] == {"name": "node-1"}


async def test_correlate_node_without_a_node_links_nothing(w: World) -> None:
    state = w.state(MachineState, NSTANCE_MACHINES, nstance_machine(**created(providerID="i-9")))
    await correlate(state)
    assert state.node_name == ""
    assert w.kube.writes == []


async def test_update_status_sets_ready_and_slows_down_once_settled(w: World) -> None:
    state = w.state(MachineState, NSTANCE_MACHINES, nstance_machine(**created(ready=True)))
    state.instance_status, state.node_name = "running", "node-1"
    await UpdateStatus()(state)
    assert condition(w.stored(NSTANCE_MACHINES, "od-1"), READY)["reason"] == MachineReason.INSTANCE_READY
    assert state.requeue_after == RESYNC * SETTLED_FACTOR
    pending = w.state(MachineState, NSTANCE_MACHINES, nstance_machine(**created(ready=False)))
    pending.instance_status = "pending"
    await UpdateStatus()(pending)
    assert condition(w.stored(NSTANCE_MACHINES, "od-1"), READY)["reason"] == MachineReason.PENDING
    assert pending.requeue_after == RESYNC


@pytest.mark.parametrize(
    ("answer", "event", "after"),
    [
        (operator_pb2.DeleteInstanceResponse(status="deleting"), None, None),
        (rpc_error(grpc.StatusCode.NOT_FOUND, "unknown instance"), None, None),
        (rpc_error(grpc.StatusCode.UNAVAILABLE, "down"), None, UNREACHABLE_RETRY),
        (rpc_error(grpc.StatusCode.INTERNAL, "provider"), "DeleteInstanceFailed", ERROR_RETRY),
    ],
)
async def test_delete_instance_outcomes(
    w: World, answer: Any, event: str | None, after: float | None
) -> None:
    w.stub().answers["DeleteInstance"] = [answer]
    state = w.state(MachineState, NSTANCE_MACHINES, nstance_machine(**created()))
    if after is None:
        await DeleteInstance()(state)
    else:
        with pytest.raises(Requeue) as requeue:
            await DeleteInstance()(state)
        assert requeue.value.after == after
    assert w.kube.reasons() == ([event] if event else [])
    assert w.stub().count("DeleteInstance") == 1


async def test_delete_instance_skips_an_instance_the_server_deleted_or_never_had(w: World) -> None:
    gone = created()
    gone["conditions"].append({"type": SERVER_DELETED, "status": "True", "reason": "ScaleDown"})
    await DeleteInstance()(w.state(MachineState, NSTANCE_MACHINES, nstance_machine(**gone)))
    await DeleteInstance()(w.state(MachineState, NSTANCE_MACHINES, nstance_machine()))
    assert w.stub().calls == []


async def test_a_kube_error_other_than_a_conflict_propagates_to_the_queue(w: World) -> None:
    state = w.state(MachineState, NSTANCE_MACHINES, nstance_machine())
    w.kube.fail["patch"] = [KubeError(500, "InternalError", "etcd")]
    with pytest.raises(KubeError):
        await ChooseInstance()(state)
