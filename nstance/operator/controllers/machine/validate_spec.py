"""Steps that decide whether there is anything to do: a valid spec, and no ServerDeleted condition.

Must not: call shards.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.core.steps import Done
from nstance.operator.conditions import is_true
from nstance.operator.controllers.common import status
from nstance.operator.controllers.machine.reasons import MachineReason
from nstance.operator.controllers.machine.state import MachineState
from nstance.operator.crds.models import InvalidResource, NstanceMachine
from nstance.operator.crds.names import READY, SERVER_DELETED


@dataclass(frozen=True)
class ValidateSpec:
    name: str = "validate_spec"

    async def __call__(self, state: MachineState) -> None:
        try:
            NstanceMachine.from_k8s(state.obj)
        except InvalidResource as exc:
            message = f"{exc}; fix the NstanceMachine spec"
            state.set_condition(READY, False, MachineReason.INVALID, message)
            await state.write_status()
            raise Done(message) from None


@dataclass(frozen=True)
class StopIfServerDeleted:
    """The server deleted the instance (drain coordinator set ServerDeleted): never recreate it."""

    name: str = "stop_if_server_deleted"

    async def __call__(self, state: MachineState) -> None:
        if is_true(status(state.obj).get("conditions"), SERVER_DELETED):
            raise Done("the server deleted the instance; waiting for the Machine to be deleted")
