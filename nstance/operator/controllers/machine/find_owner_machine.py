"""Step: read the CAPI Machine that owns this NstanceMachine (if any). Must not: write anything."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nstance.operator.controllers.common import meta
from nstance.operator.controllers.machine.state import MachineState
from nstance.operator.controllers.resources import CAPI_MACHINES
from nstance.operator.crds.names import CAPI_GROUP, CAPI_KIND_MACHINE


def owner_machine_name(obj: Mapping[str, Any]) -> str | None:
    """Name of the owning CAPI Machine from the owner references, if there is one."""
    for ref in meta(obj).get("ownerReferences") or []:
        api_version = str(ref.get("apiVersion") or "")
        if ref.get("kind") == CAPI_KIND_MACHINE and api_version.split("/")[0] == CAPI_GROUP:
            return str(ref.get("name"))
    return None


@dataclass(frozen=True)
class FindOwnerMachine:
    name: str = "find_owner_machine"

    async def __call__(self, state: MachineState) -> None:
        name = owner_machine_name(state.obj)
        if name:
            state.owner_machine = await state.ctx.kube.get(CAPI_MACHINES, name, state.namespace)
