"""Step: pick the shard and the instance ID, and WRITE them to status before anything is created.

Writing ``status.instanceID`` and ``status.shard`` first makes creation crash-safe: a run that stops
after CreateInstance was sent repeats it with the same ID, and the server answers with the existing
instance instead of creating a second VM. Once chosen, the shard never changes. Must not: call
CreateInstance.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.core.ids import new_puid
from nstance.core.steps import Requeue
from nstance.operator.controllers.common import list_everywhere, spec
from nstance.operator.controllers.machine.placement import (
    NoShard,
    choose_shard,
    instance_kind,
    shard_counts,
)
from nstance.operator.controllers.machine.reasons import MachineReason
from nstance.operator.controllers.machine.state import MachineState
from nstance.operator.crds.names import READY


@dataclass(frozen=True)
class ChooseInstance:
    name: str = "choose_instance"

    async def __call__(self, state: MachineState) -> None:
        if state.instance_id():
            return
        shards = state.ctx.shards
        configured = list(shards.configured())
        machines = await list_everywhere(state.ctx, state.resource, state.namespace)
        failure_domain = str(spec(state.owner_machine or {}).get("failureDomain") or "")
        try:
            shard = choose_shard(
                configured,
                [s for s in configured if shards.reachable(s)],
                shard_counts(machines),
                failure_domain,
            )
        except NoShard as exc:
            reason = MachineReason.SHARD_NOT_CONFIGURED if failure_domain else MachineReason.SHARD_UNREACHABLE
            message = f"cannot place the instance yet: {exc}"
            state.set_condition(READY, False, reason, message)
            await state.write_status()
            raise Requeue(state.ctx.timings.unreachable_retry, message) from None
        instance_id = str(new_puid(instance_kind(machines, state.group)))
        state.status_updates.update({"instanceID": instance_id, "shard": shard, "ready": False})
        state.set_condition(
            READY, False, MachineReason.CREATING, f"creating instance {instance_id} on shard {shard!r}"
        )
        await state.write_status()
        state.logger.info("chose instance %s on shard %s", instance_id, shard)
