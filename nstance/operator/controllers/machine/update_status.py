"""Step: the Ready condition from what this run learned, the status write, and the next refresh.

Ready is True once the instance runs; the machine is looked at again every ``timings.resync`` until
it is ready and linked to its Node, then ten times less often (a safety net: drain and deletion
events arrive through the drain coordinator). Must not: call shards.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.operator.conditions import is_true
from nstance.operator.controllers.machine.reasons import INSTANCE_CREATED, MachineReason
from nstance.operator.controllers.machine.state import MachineState
from nstance.operator.crds.names import READY

SETTLED_FACTOR = 10


@dataclass(frozen=True)
class UpdateStatus:
    name: str = "update_status"

    async def __call__(self, state: MachineState) -> None:
        current = state.current_status()
        resync = state.ctx.timings.resync
        if not is_true(current.get("conditions"), INSTANCE_CREATED):
            await state.write_status()
            state.requeue_within(resync)
            return
        instance_id, shard = state.instance_id(), state.shard()
        ready = bool(current.get("ready"))
        if state.instance_status:
            if ready:
                where = f" on Node {state.node_name}" if state.node_name else " (no Node yet)"
                state.set_condition(
                    READY,
                    True,
                    MachineReason.INSTANCE_READY,
                    f"instance {instance_id} is {state.instance_status}{where}",
                )
            else:
                state.set_condition(
                    READY,
                    False,
                    MachineReason.PENDING,
                    f"instance {instance_id} on shard {shard!r} is {state.instance_status}",
                )
        await state.write_status()
        settled = ready and bool(state.node_name)
        state.requeue_within(resync * SETTLED_FACTOR if settled else resync)
