"""The on-demand pod controller's steps and the NstanceCluster steps on their own, on the stand-ins of
``operator_standins`` (the controllers as a whole: tests/integration/test_operator_controllers.py)."""

from __future__ import annotations

from typing import Any

import pytest
from operator_standins import NS, World, condition

from nstance.core.steps import Done, Requeue
from nstance.operator.controllers.cluster import ClusterState, EnsureCapiCluster, MarkProvisioned
from nstance.operator.controllers.ondemand.delete_machine import DeleteMachine
from nstance.operator.controllers.ondemand.ensure_machine import EnsureMachine, EnsureNstanceMachine
from nstance.operator.controllers.ondemand.names import SCHEDULING_GATE
from nstance.operator.controllers.ondemand.pin_pod import PinPod
from nstance.operator.controllers.ondemand.read_request import ReadRequest
from nstance.operator.controllers.ondemand.state import PodState
from nstance.operator.controllers.resources import (
    CAPI_CLUSTERS,
    CAPI_MACHINES,
    NSTANCE_CLUSTERS,
    NSTANCE_MACHINES,
)
from nstance.operator.crds.names import KIND_CLUSTER, READY
from nstance.operator.kube import PODS, KubeError, Object

MACHINE = "on-demand-job"


@pytest.fixture
def w() -> World:
    return World()


def on_demand_pod(*, group: str = "gpu", gated: bool = True, node: str = "", **annotations: str) -> Object:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if gated:
        spec["schedulingGates"] = [{"name": "other/gate"}, {"name": SCHEDULING_GATE}]
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "job",
            "namespace": NS,
            "uid": "pod-uid",
            "annotations": {"on-demand.nstance.dev/group": group, **annotations},
        },
        "spec": spec,
    }


# --- read_request --------------------------------------------------------------------------------------


async def test_read_request_takes_group_and_instance_type(w: World) -> None:
    pod = on_demand_pod(**{"on-demand.nstance.dev/instance-type": "g5.xlarge"})
    state = w.state(PodState, PODS, pod)
    await ReadRequest()(state)
    assert (state.group, state.instance_type) == ("gpu", "g5.xlarge")


async def test_read_request_stops_for_no_group_and_warns_once_for_a_bad_one(w: World) -> None:
    with pytest.raises(Done):
        await ReadRequest()(w.state(PodState, PODS, on_demand_pod(group="")))
    assert w.kube.events == []
    with pytest.raises(Done):
        await ReadRequest()(w.state(PodState, PODS, on_demand_pod(group="Not Valid")))
    assert w.kube.reasons() == ["InvalidOnDemandGroup"]


# --- ensure_machine / ensure_nstance_machine -----------------------------------------------------------


async def read(w: World, pod: Object) -> PodState:
    state = w.state(PodState, PODS, pod)
    await ReadRequest()(state)
    return state


async def test_ensure_machine_creates_the_machine_and_nstance_machine_once(w: World) -> None:
    state = await read(w, on_demand_pod(**{"on-demand.nstance.dev/instance-type": "g5.xlarge"}))
    await EnsureMachine()(state)
    await EnsureNstanceMachine()(state)
    machine = w.stored(CAPI_MACHINES, MACHINE)
    assert machine["metadata"]["ownerReferences"][0]["uid"] == "pod-uid"
    assert machine["spec"]["infrastructureRef"]["name"] == MACHINE
    infra = w.stored(NSTANCE_MACHINES, MACHINE)
    assert infra["spec"] == {"group": "gpu", "instanceType": "g5.xlarge"}
    assert infra["metadata"]["ownerReferences"][0]["controller"] is True
    assert w.kube.reasons() == ["OnDemandMachineCreated"]
    again = await read(w, on_demand_pod())
    await EnsureMachine()(again)
    await EnsureNstanceMachine()(again)
    assert [write[0] for write in w.kube.writes] == ["create", "create"]


async def test_ensure_machine_gives_a_bound_pod_no_new_machine(w: World) -> None:
    with pytest.raises(Done):
        await EnsureMachine()(await read(w, on_demand_pod(node="node-1")))
    assert w.kube.find(CAPI_MACHINES, MACHINE, NS) is None


async def test_ensure_machine_created_meanwhile_reads_it_again(w: World) -> None:
    w.kube.fail["create"] = [KubeError(409, "AlreadyExists", "machines on-demand-job already exists")]
    with pytest.raises(Requeue) as requeue:
        await EnsureMachine()(await read(w, on_demand_pod()))
    assert requeue.value.after == 0


# --- pin_pod -------------------------------------------------------------------------------------------


async def test_pin_pod_selects_the_node_and_drops_only_our_gate(w: World) -> None:
    state = await read(w, on_demand_pod())
    state.machine = {"status": {"nodeRef": {"name": "node-7"}}}
    await PinPod()(state)
    stored = w.stored(PODS, "job")
    assert stored["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "node-7"}
    assert stored["spec"]["schedulingGates"] == [{"name": "other/gate"}]
    assert w.kube.reasons() == ["PinnedToNode"]


async def test_pin_pod_waits_for_a_node_and_skips_ungated_pods(w: World) -> None:
    state = await read(w, on_demand_pod())
    state.machine = {"status": {}}
    await PinPod()(state)
    ungated = await read(w, on_demand_pod(gated=False))
    ungated.machine = {"status": {"nodeRef": {"name": "node-7"}}}
    await PinPod()(ungated)
    assert w.kube.writes == []


async def test_pin_pod_of_a_changed_pod_reads_it_again(w: World) -> None:
    state = await read(w, on_demand_pod())
    state.machine = {"status": {"nodeRef": {"name": "node-7"}}}
    w.kube.put(PODS, w.stored(PODS, "job"))  # a newer version
    with pytest.raises(Requeue):
        await PinPod()(state)


# --- delete_machine ------------------------------------------------------------------------------------


async def test_delete_machine_deletes_both_and_reports_it(w: World) -> None:
    w.kube.put(CAPI_MACHINES, {"metadata": {"name": MACHINE, "namespace": NS}})
    w.kube.put(NSTANCE_MACHINES, {"metadata": {"name": MACHINE, "namespace": NS}})
    await DeleteMachine()(await read(w, on_demand_pod()))
    assert w.kube.find(CAPI_MACHINES, MACHINE, NS) is None
    assert w.kube.find(NSTANCE_MACHINES, MACHINE, NS) is None
    assert w.kube.reasons() == ["OnDemandMachineDeleted"]
    await DeleteMachine()(await read(w, on_demand_pod()))  # both gone already: no second Event
    assert w.kube.reasons() == ["OnDemandMachineDeleted"]


# --- NstanceCluster ------------------------------------------------------------------------------------


def nstance_cluster(**status: Any) -> Object:
    return {"metadata": {"name": "test--default", "namespace": NS}, "spec": {}, "status": status}


async def test_mark_provisioned_writes_once(w: World) -> None:
    await MarkProvisioned()(w.state(ClusterState, NSTANCE_CLUSTERS, nstance_cluster()))
    stored = w.stored(NSTANCE_CLUSTERS, "test--default")
    assert stored["status"]["initialization"] == {"provisioned": True}
    assert condition(stored, READY)["status"] == "True"
    writes = len(w.kube.writes)
    await MarkProvisioned()(w.state(ClusterState, NSTANCE_CLUSTERS, stored))
    assert len(w.kube.writes) == writes


async def test_ensure_capi_cluster_creates_it_once_referencing_the_nstance_cluster(w: World) -> None:
    state = w.state(ClusterState, NSTANCE_CLUSTERS, nstance_cluster())
    await EnsureCapiCluster()(state)
    await EnsureCapiCluster()(state)
    ref = w.stored(CAPI_CLUSTERS, "test--default")["spec"]["infrastructureRef"]
    assert (ref["kind"], ref["name"]) == (KIND_CLUSTER, "test--default")
    assert [write[0] for write in w.kube.writes] == ["create"]
