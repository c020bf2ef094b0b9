"""Deleted step: find the NstanceMachine whose ``status.instanceID`` is the deleted instance.

Waits for the machine index to load; no such NstanceMachine: nothing to clean up.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.core.steps import Done
from nstance.operator.drain.state import DeletedState


@dataclass(frozen=True)
class FindMachine:
    name: str = "find_machine"

    async def __call__(self, state: DeletedState) -> None:
        await state.machines.wait_synced()
        state.machine = state.machines.find(state.iid)
        if state.machine is None:
            raise Done(f"instance {state.iid} was deleted; no NstanceMachine refers to it")
