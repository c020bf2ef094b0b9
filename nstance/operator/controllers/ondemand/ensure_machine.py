"""Steps: the pod's CAPI Machine and NstanceMachine (``on-demand-{pod}``, in the pod's namespace).

The Machine carries clusterName, an empty bootstrap data secret (agents bootstrap themselves) and an
infrastructureRef to the NstanceMachine; it is owned by the Pod. The NstanceMachine (group, instance
type) is controlled by the Machine, so deleting the Machine cascades to it and its finalizer deletes
the instance. They are created only while the pod still waits for capacity (not bound to a node yet):
a pod that already runs somewhere does not get a new VM if its Machine was deleted. Must not: pin the
pod (``pin_pod``) or delete anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nstance.core.steps import Done, Requeue
from nstance.operator.controllers.common import spec
from nstance.operator.controllers.ondemand.state import PodState
from nstance.operator.controllers.resources import (
    CAPI_CLUSTER_NAME_LABEL,
    CAPI_MACHINES,
    NSTANCE_MACHINES,
    infrastructure_ref,
)
from nstance.operator.crds.names import GROUP_LABEL, KIND_MACHINE
from nstance.operator.kube import KubeError, Resource, owner_reference

LABEL_VALUE_MAX = 63


def machine_body(state: PodState) -> dict[str, Any]:
    cluster = state.ctx.capi_cluster_name
    labels = {GROUP_LABEL: state.group}
    if len(cluster) <= LABEL_VALUE_MAX:
        labels[CAPI_CLUSTER_NAME_LABEL] = cluster
    return {
        "metadata": {
            "name": state.machine_name,
            "namespace": state.namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(state.obj, controller=False)],
        },
        "spec": {
            "clusterName": cluster,
            "bootstrap": {"dataSecretName": ""},
            "infrastructureRef": infrastructure_ref(KIND_MACHINE, state.machine_name),
        },
    }


def nstance_machine_body(state: PodState, machine: dict[str, Any]) -> dict[str, Any]:
    machine_spec: dict[str, Any] = {"group": state.group}
    if state.instance_type:
        machine_spec["instanceType"] = state.instance_type
    return {
        "metadata": {
            "name": state.machine_name,
            "namespace": state.namespace,
            "labels": {GROUP_LABEL: state.group},
            "ownerReferences": [owner_reference(machine, controller=True)],
        },
        "spec": machine_spec,
    }


async def _create(state: PodState, resource: Resource, body: dict[str, Any]) -> dict[str, Any]:
    try:
        return await state.ctx.kube.create(resource, body, state.namespace)
    except KubeError as exc:
        if exc.status == 409:
            raise Requeue(0, f"{resource.kind} {state.machine_name} appeared while creating it") from None
        raise


@dataclass(frozen=True)
class EnsureMachine:
    name: str = "ensure_machine"

    async def __call__(self, state: PodState) -> None:
        machine = await state.ctx.kube.get(CAPI_MACHINES, state.machine_name, state.namespace)
        if machine is None:
            if spec(state.obj).get("nodeName"):
                raise Done("the pod is already bound to a node; no on-demand machine is needed")
            machine = await _create(state, CAPI_MACHINES, machine_body(state))
            await state.event(
                "OnDemandMachineCreated",
                f"created Machine {state.machine_name} for group {state.group!r}"
                + (f" (instance type {state.instance_type})" if state.instance_type else ""),
            )
        state.machine = machine


@dataclass(frozen=True)
class EnsureNstanceMachine:
    name: str = "ensure_nstance_machine"

    async def __call__(self, state: PodState) -> None:
        if state.machine is None:
            return
        existing = await state.ctx.kube.get(NSTANCE_MACHINES, state.machine_name, state.namespace)
        if existing is None:
            await _create(state, NSTANCE_MACHINES, nstance_machine_body(state, state.machine))
            state.logger.info("created NstanceMachine %s", state.machine_name)
