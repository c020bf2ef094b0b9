"""Step: find the Node running the instance and link it (NstanceMachine and its CAPI Machine).

The Node is looked up in the operator's Node index by provider ID (every cloud's providerID form
matches the raw ID the shard reports). Found: ``spec.providerID`` of the NstanceMachine becomes the
Node's ``spec.providerID`` (the Cluster API contract), ``status.addresses`` the Node's addresses, and
the owner Machine's ``status.nodeRef`` is set to ``{name}`` (v1beta2 shape) on its status subresource.
Each write happens only when the value differs. Must not: call shards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from nstance.operator.controllers.common import meta, spec, status
from nstance.operator.controllers.machine.state import MachineState
from nstance.operator.controllers.resources import CAPI_MACHINES
from nstance.operator.kube import KubeError

ADDRESS_TYPES: Final = frozenset({"Hostname", "ExternalIP", "InternalIP", "ExternalDNS", "InternalDNS"})


def node_addresses(node: Mapping[str, Any]) -> list[dict[str, str]]:
    """The Node's addresses in the Cluster API MachineAddress shape (unknown types dropped)."""
    out: list[dict[str, str]] = []
    for entry in status(node).get("addresses") or []:
        if isinstance(entry, Mapping) and entry.get("type") in ADDRESS_TYPES and entry.get("address"):
            out.append({"type": str(entry["type"]), "address": str(entry["address"])})
    return out


@dataclass(frozen=True)
class CorrelateNode:
    name: str = "correlate_node"

    async def __call__(self, state: MachineState) -> None:
        provider_id = str(state.current_status().get("providerID") or "")
        if not provider_id:
            return
        node = state.ctx.nodes.find(provider_id)
        if node is None:
            return
        state.node_name = str(meta(node).get("name") or "")
        node_provider_id = str(spec(node).get("providerID") or "")
        kube = state.ctx.kube
        if node_provider_id and spec(state.obj).get("providerID") != node_provider_id:
            state.obj = await kube.patch(
                state.resource, state.name, {"spec": {"providerID": node_provider_id}}, state.namespace
            )
        addresses = node_addresses(node)
        if addresses:
            state.status_updates["addresses"] = addresses
        machine = state.owner_machine
        if machine is None or not state.node_name:
            return
        node_ref = status(machine).get("nodeRef")
        if isinstance(node_ref, Mapping) and node_ref.get("name") == state.node_name:
            return
        name = str(meta(machine).get("name"))
        try:
            state.owner_machine = await kube.patch(
                CAPI_MACHINES,
                name,
                {"status": {"nodeRef": {"name": state.node_name}}},
                state.namespace,
                status=True,
            )
        except KubeError as exc:
            if exc.status != 404:
                raise
            return
        state.logger.info("Machine %s is Node %s", name, state.node_name)
