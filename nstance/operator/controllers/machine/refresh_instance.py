"""Step: GetInstanceStatus - record the provider ID and whether the instance is up.

``status.providerID`` is the provider's own ID (``i-…``, an instance name, a VMID); ``status.ready`` is
true for running, registered and healthy instances. An instance the shard no longer knows is reported
(Ready False, InstanceNotFound) and never created again. An unreachable shard keeps the last known
status and retries after ``unreachable_retry``. Must not: create or delete instances.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.core.steps import Done
from nstance.operator.conditions import is_true
from nstance.operator.controllers.machine.reasons import INSTANCE_CREATED, READY_STATUSES, MachineReason
from nstance.operator.controllers.machine.state import MachineState
from nstance.operator.controllers.shardcalls import Failure, ShardCallError, call
from nstance.operator.crds.names import READY, SHARD_REACHABLE
from nstance.rpc import operator_pb2


@dataclass(frozen=True)
class RefreshInstance:
    name: str = "refresh_instance"

    async def __call__(self, state: MachineState) -> None:
        if not is_true(state.current_status().get("conditions"), INSTANCE_CREATED):
            return
        shard, instance_id = state.shard(), state.instance_id()
        request = operator_pb2.GetInstanceStatusRequest(instance_id=instance_id)
        try:
            answer = await call(
                state.ctx,
                shard,
                "GetInstanceStatus",
                lambda stub, t: stub.GetInstanceStatus(request, timeout=t),
            )
        except ShardCallError as exc:
            detail = f"GetInstanceStatus {instance_id} on shard {shard!r}: {exc.code}: {exc.details}"
            if exc.failure is Failure.NOT_FOUND:
                state.status_updates["ready"] = False
                state.set_condition(
                    READY,
                    False,
                    MachineReason.INSTANCE_GONE,
                    f"shard {shard!r} no longer knows instance {instance_id}; it is not created again "
                    "(delete the Machine to replace it)",
                )
                await state.write_status()
                raise Done("instance not found on its shard") from None
            if exc.failure in (Failure.UNREACHABLE, Failure.NOT_CONFIGURED):
                state.set_condition(SHARD_REACHABLE, False, MachineReason.SHARD_UNREACHABLE, detail)
            state.requeue_within(state.ctx.timings.unreachable_retry)
            state.logger.warning("%s", detail)
            return
        state.set_condition(SHARD_REACHABLE, True, MachineReason.REACHABLE, f"shard {shard!r} answered")
        state.instance_status = str(answer.status)
        state.status_updates["ready"] = state.instance_status in READY_STATUSES
        if answer.provider_instance_id:
            state.status_updates["providerID"] = str(answer.provider_instance_id)
