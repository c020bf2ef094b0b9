"""On-demand pods: a pod annotated with a group gets its own VM (CAPI Machine + NstanceMachine).

``reconcile(ctx, key)`` runs ``STEPS`` for a live pod and ``DELETE_STEPS`` while it is being deleted
(the pod finalizer ``ondemandpod.infrastructure.cluster.x-k8s.io/finalizer`` holds it until its
Machine is deleted). Pods live in users' namespaces, so the operator must watch pods cluster-wide
for this to work (kopf ``clusterwide=True``); a namespaced operator only serves pods in its own
namespace. Must not: call shards (the NstanceMachine controller does).
"""

from __future__ import annotations

from nstance.operator.context import OperatorContext
from nstance.operator.controllers.common import reconcile_object
from nstance.operator.controllers.ondemand.state import make_state
from nstance.operator.controllers.ondemand.steps import DELETE_STEPS, STEPS
from nstance.operator.crds.names import ONDEMAND_POD_FINALIZER
from nstance.operator.kube import PODS

__all__ = ["DELETE_STEPS", "STEPS", "reconcile"]


async def reconcile(ctx: OperatorContext, key: tuple[str, str]) -> float | None:
    return await reconcile_object(
        ctx,
        PODS,
        key,
        finalizer=ONDEMAND_POD_FINALIZER,
        make_state=make_state,
        steps=STEPS,
        delete_steps=DELETE_STEPS,
    )
