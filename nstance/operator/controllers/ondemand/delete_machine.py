"""Delete step: the pod is going away, so its Machine (and NstanceMachine) go too.

Deleting the Machine cascades to the NstanceMachine through its owner reference; the NstanceMachine is
deleted explicitly as well so the instance goes even where no garbage collector runs. The
NstanceMachine's own finalizer calls DeleteInstance; the pod's finalizer does not wait for it.
Must not: call shards.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.operator.controllers.ondemand.state import PodState
from nstance.operator.controllers.resources import CAPI_MACHINES, NSTANCE_MACHINES


@dataclass(frozen=True)
class DeleteMachine:
    name: str = "delete_machine"

    async def __call__(self, state: PodState) -> None:
        kube = state.ctx.kube
        machine_gone = not await kube.delete(CAPI_MACHINES, state.machine_name, state.namespace)
        infra_gone = not await kube.delete(NSTANCE_MACHINES, state.machine_name, state.namespace)
        if not (machine_gone and infra_gone):
            await state.event(
                "OnDemandMachineDeleted",
                f"pod deleted: deleting Machine {state.machine_name} and its instance",
            )
