"""Step: make sure the pool's CAPI MachinePool (same name) exists; remember it for the size.

A pool created by a user without a MachinePool gets one with ``replicas: 0`` (nothing is started
until someone scales it). A pool the sync manager created (annotation ``nstance.dev/managed-by``) is
left alone: the sync manager creates its MachinePool with the group's current size, and creating it
here first with 0 would scale the group down; the run waits instead. A pool whose owning MachinePool
(set by Cluster API) was deleted is about to be garbage-collected, so nothing is created for it either.
Must not: change an existing MachinePool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nstance.core.steps import Done, Requeue
from nstance.operator.controllers.common import meta
from nstance.operator.controllers.machinepool.reasons import PoolReason
from nstance.operator.controllers.machinepool.state import PoolState
from nstance.operator.controllers.resources import (
    CAPI_CLUSTER_NAME_LABEL,
    CAPI_MACHINE_POOLS,
    infrastructure_ref,
)
from nstance.operator.crds.names import (
    GROUP_LABEL,
    KIND_MACHINE_POOL,
    MANAGED_BY_ANNOTATION,
    MANAGED_BY_VALUE,
    READY,
)
from nstance.operator.kube import KubeError

LABEL_VALUE_MAX = 63


def machine_pool_body(state: PoolState) -> dict[str, Any]:
    """The CAPI MachinePool created for a user's pool (replicas 0, references this pool)."""
    cluster = state.ctx.capi_cluster_name
    labels = {GROUP_LABEL: state.group}
    if len(cluster) <= LABEL_VALUE_MAX:
        labels[CAPI_CLUSTER_NAME_LABEL] = cluster
    return {
        "metadata": {"name": state.name, "namespace": state.namespace, "labels": labels},
        "spec": {
            "clusterName": cluster,
            "replicas": 0,
            "template": {
                "spec": {
                    "clusterName": cluster,
                    "bootstrap": {"dataSecretName": ""},
                    "infrastructureRef": infrastructure_ref(KIND_MACHINE_POOL, state.name),
                }
            },
        },
    }


@dataclass(frozen=True)
class EnsureMachinePool:
    name: str = "ensure_machine_pool"

    async def __call__(self, state: PoolState) -> None:
        kube = state.ctx.kube
        machine_pool = await kube.get(CAPI_MACHINE_POOLS, state.name, state.namespace)
        if machine_pool is None:
            owners = [
                r for r in meta(state.obj).get("ownerReferences") or [] if r.get("kind") == "MachinePool"
            ]
            if owners:
                # Cluster API made the MachinePool own this pool, and it is gone: the garbage collector
                # deletes this pool next. Creating a new MachinePool (with 0 replicas) would scale the
                # group down and leave an orphan behind.
                message = (
                    f"MachinePool {state.namespace}/{owners[0].get('name')} was deleted; so is this pool"
                )
                state.set_condition(READY, False, PoolReason.DELETING, message)
                await state.write_status()
                raise Done(message)
            annotations = meta(state.obj).get("annotations") or {}
            if annotations.get(MANAGED_BY_ANNOTATION) == MANAGED_BY_VALUE:
                message = (
                    f"waiting for MachinePool {state.namespace}/{state.name}: the sync manager creates it "
                    "with the group's current size"
                )
                state.set_condition(READY, False, PoolReason.RECONCILING, message)
                await state.write_status()
                raise Requeue(state.ctx.timings.unreachable_retry, message)
            try:
                machine_pool = await kube.create(
                    CAPI_MACHINE_POOLS, machine_pool_body(state), state.namespace
                )
            except KubeError as exc:
                if exc.status != 409:
                    raise
                raise Requeue(0, "the MachinePool appeared while creating it; reading it again") from None
            await state.event(
                "MachinePoolCreated",
                f"created MachinePool {state.namespace}/{state.name} with replicas 0; "
                "scale it to start instances",
            )
        state.machine_pool = machine_pool
