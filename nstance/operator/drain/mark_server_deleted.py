"""Deleted step: ``ready=false`` and ServerDeleted=True (with the server's reason) on the NstanceMachine,
Draining ended, so its finalizer skips DeleteInstance.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.core.steps import Done
from nstance.operator.crds import names
from nstance.operator.drain.machine_status import set_machine_condition
from nstance.operator.drain.rules import condition_reason
from nstance.operator.drain.state import DeletedState


@dataclass(frozen=True)
class MarkServerDeleted:
    name: str = "mark_server_deleted"

    async def __call__(self, state: DeletedState) -> None:
        iid, reason = state.iid, state.event.reason
        state.machine = await set_machine_condition(
            state.ctx,
            state.machines,
            iid,
            names.SERVER_DELETED,
            True,
            reason=condition_reason(reason, "Deleted"),
            message=f"the shard server deleted instance {iid} ({reason or 'no reason given'})",
            extra={"ready": False},
            also_clear_draining=True,
        )
        if state.machine is None:
            raise Done("the NstanceMachine is gone")
