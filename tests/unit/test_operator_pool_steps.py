"""The NstanceMachinePool controller's steps on their own, on the stand-ins of ``operator_standins``
(the controller as a whole: tests/integration/test_operator_controllers.py)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from operator_standins import ERROR_RETRY, NS, UNREACHABLE_RETRY, World, condition, rpc_error

from nstance.core.steps import Done, Requeue
from nstance.operator.controllers.machinepool.check_duplicate_group import CheckDuplicateGroup
from nstance.operator.controllers.machinepool.check_shards import CheckShards
from nstance.operator.controllers.machinepool.delete_orphan_shard_groups import DeleteOrphanShardGroups
from nstance.operator.controllers.machinepool.delete_server_groups import DeleteServerGroups
from nstance.operator.controllers.machinepool.delete_shard_groups import DeleteShardGroups
from nstance.operator.controllers.machinepool.ensure_machine_pool import EnsureMachinePool
from nstance.operator.controllers.machinepool.ensure_shard_groups import EnsureShardGroups
from nstance.operator.controllers.machinepool.reasons import PoolReason
from nstance.operator.controllers.machinepool.state import PoolState
from nstance.operator.controllers.machinepool.update_status import UpdateStatus
from nstance.operator.controllers.resources import (
    CAPI_MACHINE_POOLS,
    NSTANCE_MACHINE_POOLS,
    NSTANCE_SHARD_GROUPS,
)
from nstance.operator.crds.names import (
    API_VERSION,
    GROUP_LABEL,
    KIND_MACHINE_POOL,
    MANAGED_BY_ANNOTATION,
    MANAGED_BY_VALUE,
    READY,
)
from nstance.operator.kube import Object


@pytest.fixture
def w() -> World:
    return World()


def pool(name: str = "web", *, shards: list[str] | None = None, uid: str = "pool-uid", **meta: Any) -> Object:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_MACHINE_POOL,
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "generation": 2,
            "creationTimestamp": "2026-01-02T00:00:00Z",
            **meta,
        },
        "spec": {"group": "web", "shards": shards or ["s1", "s2"], "template": "app"},
        "status": {},
    }


def shard_group(shard: str, *, owner: str | None = "pool-uid", size: int = 1, **status: Any) -> Object:
    meta: dict[str, Any] = {"name": f"web--{shard}", "namespace": NS, "labels": {GROUP_LABEL: "web"}}
    if owner:
        meta["ownerReferences"] = [
            {"kind": KIND_MACHINE_POOL, "name": "web", "uid": owner, "controller": True}
        ]
    return {"metadata": meta, "spec": {"group": "web", "shard": shard, "size": size}, "status": status}


def ready_group(shard: str, replicas: int, ids: list[str]) -> Object:
    conditions = [{"type": READY, "status": "True", "reason": "SyncSucceeded", "message": "ok"}]
    return shard_group(
        shard, replicas=replicas, providerIDs=ids, config={"template": "app"}, conditions=conditions
    )


# --- check_duplicate_group -----------------------------------------------------------------------------


async def test_check_duplicate_group_labels_the_pool_and_lets_the_oldest_manage(w: World) -> None:
    state = w.state(PoolState, NSTANCE_MACHINE_POOLS, pool())
    await CheckDuplicateGroup()(state)
    assert w.stored(NSTANCE_MACHINE_POOLS, "web")["metadata"]["labels"] == {GROUP_LABEL: "web"}
    newer = pool("web-2", uid="newer", creationTimestamp="2026-03-01T00:00:00Z", labels={GROUP_LABEL: "web"})
    with pytest.raises(Done):
        await CheckDuplicateGroup()(w.state(PoolState, NSTANCE_MACHINE_POOLS, newer))
    refused = condition(w.stored(NSTANCE_MACHINE_POOLS, "web-2"), READY)
    assert refused["reason"] == PoolReason.DUPLICATE_GROUP
    assert f"{NS}/web" in refused["message"]


# --- check_shards --------------------------------------------------------------------------------------


async def test_check_shards_splits_the_machine_pools_replicas_in_shard_order(w: World) -> None:
    state = w.state(PoolState, NSTANCE_MACHINE_POOLS, pool())
    state.machine_pool = {"spec": {"replicas": 5}}
    await CheckShards()(state)
    assert state.sizes == {"s1": 3, "s2": 2}


async def test_check_shards_refuses_an_unconfigured_shard_and_an_invalid_spec(w: World) -> None:
    with pytest.raises(Requeue) as requeue:
        await CheckShards()(w.state(PoolState, NSTANCE_MACHINE_POOLS, pool(shards=["s1", "s9"])))
    assert requeue.value.after == UNREACHABLE_RETRY
    assert "'s9'" in condition(w.stored(NSTANCE_MACHINE_POOLS, "web"), READY)["message"]
    invalid = pool()
    invalid["spec"]["shards"] = []
    with pytest.raises(Done):
        await CheckShards()(w.state(PoolState, NSTANCE_MACHINE_POOLS, invalid))
    assert condition(w.stored(NSTANCE_MACHINE_POOLS, "web"), READY)["reason"] == PoolReason.INVALID


# --- ensure_machine_pool -------------------------------------------------------------------------------


async def test_ensure_machine_pool_creates_one_with_no_replicas_or_keeps_the_existing(w: World) -> None:
    state = w.state(PoolState, NSTANCE_MACHINE_POOLS, pool())
    await EnsureMachinePool()(state)
    created = w.stored(CAPI_MACHINE_POOLS, "web")
    assert created["spec"]["replicas"] == 0
    assert created["spec"]["template"]["spec"]["infrastructureRef"]["name"] == "web"
    assert w.kube.reasons() == ["MachinePoolCreated"]
    created["spec"]["replicas"] = 4
    again = w.state(PoolState, NSTANCE_MACHINE_POOLS, pool())
    await EnsureMachinePool()(again)
    assert again.machine_pool is not None
    assert again.machine_pool["spec"]["replicas"] == 4
    assert w.kube.reasons() == ["MachinePoolCreated"]


async def test_ensure_machine_pool_waits_for_the_sync_manager_and_for_garbage_collection(w: World) -> None:
    synced = pool(annotations={MANAGED_BY_ANNOTATION: MANAGED_BY_VALUE})
    with pytest.raises(Requeue):
        await EnsureMachinePool()(w.state(PoolState, NSTANCE_MACHINE_POOLS, synced))
    orphaned = pool(ownerReferences=[{"kind": "MachinePool", "name": "web", "uid": "mp"}])
    with pytest.raises(Done):
        await EnsureMachinePool()(w.state(PoolState, NSTANCE_MACHINE_POOLS, orphaned))
    assert w.kube.find(CAPI_MACHINE_POOLS, "web", NS) is None


# --- ensure_shard_groups -------------------------------------------------------------------------------


async def test_ensure_shard_groups_creates_updates_and_adopts(w: World) -> None:
    w.kube.put(NSTANCE_SHARD_GROUPS, shard_group("s1", size=1))
    w.kube.put(NSTANCE_SHARD_GROUPS, shard_group("s2", owner=None, size=2))
    state = w.state(PoolState, NSTANCE_MACHINE_POOLS, pool(shards=["s1", "s2"]))
    state.sizes = {"s1": 3, "s2": 2}
    await EnsureShardGroups()(state)
    s1, s2 = w.stored(NSTANCE_SHARD_GROUPS, "web--s1"), w.stored(NSTANCE_SHARD_GROUPS, "web--s2")
    assert (s1["spec"]["size"], s1["spec"]["template"]) == (3, "app")
    assert [ref["uid"] for ref in s2["metadata"]["ownerReferences"]] == ["pool-uid"]  # adopted
    assert list(state.shard_groups) == ["s1", "s2"]
    fresh = w.state(PoolState, NSTANCE_MACHINE_POOLS, pool(shards=["s1", "s2"]))
    fresh.sizes = {"s1": 3, "s2": 2}
    writes = len(w.kube.writes)
    await EnsureShardGroups()(fresh)
    assert len(w.kube.writes) == writes  # nothing differs: nothing written


async def test_ensure_shard_groups_creates_missing_and_waits_for_anothers(w: World) -> None:
    w.kube.put(NSTANCE_SHARD_GROUPS, shard_group("s2", owner="someone-else"))
    state = w.state(PoolState, NSTANCE_MACHINE_POOLS, pool())
    state.sizes = {"s1": 1, "s2": 1}
    with pytest.raises(Requeue) as requeue:
        await EnsureShardGroups()(state)
    assert "web--s2" in requeue.value.reason
    created = w.stored(NSTANCE_SHARD_GROUPS, "web--s1")
    assert created["metadata"]["ownerReferences"][0]["uid"] == "pool-uid"
    assert created["metadata"]["labels"]["nstance.dev/shard"] == "s1"


# --- delete_orphan_shard_groups ------------------------------------------------------------------------


async def test_delete_orphan_shard_groups_removes_only_unlisted_owned_ones(w: World) -> None:
    state = w.state(PoolState, NSTANCE_MACHINE_POOLS, pool(shards=["s1"]))
    state.owned = [shard_group("s1"), shard_group("s2")]
    await DeleteOrphanShardGroups()(state)
    assert w.kube.writes == [("delete", NSTANCE_SHARD_GROUPS.plural, "web--s2")]
    assert w.kube.reasons() == ["ShardGroupRemoved"]


# --- update_status -------------------------------------------------------------------------------------


async def test_update_status_sums_the_shard_groups_and_lists_provider_ids(w: World) -> None:
    state = w.state(PoolState, NSTANCE_MACHINE_POOLS, pool())
    state.sizes = {"s1": 2, "s2": 1}
    state.shard_groups = {"s1": ready_group("s1", 2, ["i-2", "i-1"]), "s2": ready_group("s2", 1, ["i-3"])}
    await UpdateStatus()(state)
    stored = w.stored(NSTANCE_MACHINE_POOLS, "web")
    assert stored["spec"]["providerIDList"] == ["i-1", "i-2", "i-3"]
    assert (stored["status"]["replicas"], stored["status"]["ready"], stored["status"]["template"]) == (
        3,
        True,
        "app",
    )
    assert condition(stored, READY)["reason"] == PoolReason.RECONCILED


async def test_update_status_names_the_shard_groups_it_waits_for(w: World) -> None:
    state = w.state(PoolState, NSTANCE_MACHINE_POOLS, pool())
    state.sizes = {"s1": 1, "s2": 1}
    state.shard_groups = {"s1": ready_group("s1", 1, ["i-1"])}
    await UpdateStatus()(state)
    waiting = condition(w.stored(NSTANCE_MACHINE_POOLS, "web"), READY)
    assert waiting["reason"] == PoolReason.RECONCILING
    assert "s2 (no shard group yet)" in waiting["message"]


# --- delete steps --------------------------------------------------------------------------------------


async def test_delete_shard_groups_deletes_them_and_waits_until_they_are_gone(w: World) -> None:
    w.kube.put(NSTANCE_SHARD_GROUPS, shard_group("s1"))
    w.kube.put(NSTANCE_SHARD_GROUPS, shard_group("s2", owner="someone-else"))
    with pytest.raises(Requeue):
        await DeleteShardGroups()(w.state(PoolState, NSTANCE_MACHINE_POOLS, pool()))
    assert [write for write in w.kube.writes if write[0] == "delete"] == [
        ("delete", "nstanceshardgroups", "web--s1")
    ]
    await DeleteShardGroups()(w.state(PoolState, NSTANCE_MACHINE_POOLS, pool()))  # none of ours left


async def test_delete_server_groups_calls_every_listed_shard(w: World) -> None:
    w.stub("s1").answers["DeleteGroup"] = [rpc_error(grpc.StatusCode.NOT_FOUND, "no group web")]
    await DeleteServerGroups()(w.state(PoolState, NSTANCE_MACHINE_POOLS, pool(labels={GROUP_LABEL: "web"})))
    assert (w.stub("s1").count("DeleteGroup"), w.stub("s2").count("DeleteGroup")) == (1, 1)


@pytest.mark.parametrize(
    ("error", "after"),
    [
        (rpc_error(grpc.StatusCode.UNAVAILABLE, "down"), UNREACHABLE_RETRY),
        (rpc_error(grpc.StatusCode.INTERNAL, "provider"), ERROR_RETRY),
    ],
)
async def test_delete_server_groups_keeps_the_finalizer_while_a_shard_fails(
    w: World, error: Exception, after: float
) -> None:
    w.stub("s2").answers["DeleteGroup"] = [error]
    with pytest.raises(Requeue) as requeue:
        await DeleteServerGroups()(w.state(PoolState, NSTANCE_MACHINE_POOLS, pool()))
    assert requeue.value.after == after
    assert condition(w.stored(NSTANCE_MACHINE_POOLS, "web"), READY)["reason"] == PoolReason.DELETING


async def test_delete_server_groups_of_a_duplicate_pool_deletes_nothing(w: World) -> None:
    w.kube.put(
        NSTANCE_MACHINE_POOLS,
        pool("older", uid="older", labels={GROUP_LABEL: "web"}, creationTimestamp="2025-01-01T00:00:00Z"),
    )
    await DeleteServerGroups()(w.state(PoolState, NSTANCE_MACHINE_POOLS, pool(labels={GROUP_LABEL: "web"})))
    assert w.stub("s1").calls == w.stub("s2").calls == []
