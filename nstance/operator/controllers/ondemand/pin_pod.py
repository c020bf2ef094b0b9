"""Step: once the pod's Machine has a Node, pin the pod there and let it be scheduled.

Only for pods that carry the scheduling gate ``nstance.dev/on-demand`` (they wait, unscheduled, for
their VM): one JSON patch adds ``nodeSelector[kubernetes.io/hostname] = <node>`` and removes the gate,
which Kubernetes allows on a gated pod. The pod then runs on the VM created for it instead of any
node with room (upstream leaves that to chance). Pods without the gate are scheduled as usual and the
new node simply adds capacity. Must not: change anything else on the pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nstance.core.steps import Done, Requeue
from nstance.operator.controllers.common import meta, spec, status
from nstance.operator.controllers.ondemand.names import HOSTNAME_LABEL, SCHEDULING_GATE, has_gate
from nstance.operator.controllers.ondemand.state import PodState
from nstance.operator.kube import KubeError


def pin_patch(pod: Mapping[str, Any], node: str) -> list[dict[str, Any]]:
    """JSON patch: select ``node`` by hostname and drop our scheduling gate (other gates stay)."""
    pod_spec = spec(pod)
    ops: list[dict[str, Any]] = []
    if isinstance(pod_spec.get("nodeSelector"), Mapping):
        ops.append({"op": "add", "path": "/spec/nodeSelector/kubernetes.io~1hostname", "value": node})
    else:
        ops.append({"op": "add", "path": "/spec/nodeSelector", "value": {HOSTNAME_LABEL: node}})
    gates = [g for g in pod_spec.get("schedulingGates") or [] if g.get("name") != SCHEDULING_GATE]
    version = str(meta(pod).get("resourceVersion") or "")
    ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": version})
    if gates:
        ops.append({"op": "replace", "path": "/spec/schedulingGates", "value": gates})
    else:
        ops.append({"op": "remove", "path": "/spec/schedulingGates"})
    return ops


@dataclass(frozen=True)
class PinPod:
    name: str = "pin_pod"

    async def __call__(self, state: PodState) -> None:
        if state.machine is None or not has_gate(state.obj):
            return
        node_ref = status(state.machine).get("nodeRef")
        node = str(node_ref.get("name") or "") if isinstance(node_ref, Mapping) else ""
        if not node:
            return  # the Machine's changes trigger this pod again once it has a Node
        try:
            state.obj = await state.ctx.kube.patch(
                state.resource, state.name, pin_patch(state.obj, node), state.namespace
            )
        except KubeError as exc:
            if exc.status == 404:
                raise Done("the pod is gone") from None
            if exc.status in (409, 422):
                raise Requeue(0, f"pod changed while pinning it ({exc.message})") from None
            raise
        await state.event("PinnedToNode", f"pod pinned to Node {node} (Machine {state.machine_name})")
