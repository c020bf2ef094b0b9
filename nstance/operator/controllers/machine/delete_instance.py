"""Delete step: DeleteInstance on the machine's shard, unless the server already deleted it.

Nothing to do when no instance ID was ever chosen or the ServerDeleted condition is True. NOT_FOUND
(or the server answering "unknown") counts as done; an unreachable shard keeps the finalizer and is
retried after ``unreachable_retry``; a shard no longer configured is skipped with a Warning event;
other errors are retried after ``error_retry``. Must not: touch the owner Machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.core.steps import Requeue
from nstance.operator.conditions import is_true
from nstance.operator.controllers.common import status
from nstance.operator.controllers.machine.state import MachineState
from nstance.operator.controllers.shardcalls import Failure, ShardCallError, call
from nstance.operator.crds.names import SERVER_DELETED
from nstance.rpc import operator_pb2


@dataclass(frozen=True)
class DeleteInstance:
    name: str = "delete_instance"

    async def __call__(self, state: MachineState) -> None:
        instance_id, shard = state.instance_id(), state.shard()
        if not instance_id or is_true(status(state.obj).get("conditions"), SERVER_DELETED):
            return
        request = operator_pb2.DeleteInstanceRequest(instance_id=instance_id)
        try:
            answer = await call(
                state.ctx, shard, "DeleteInstance", lambda stub, t: stub.DeleteInstance(request, timeout=t)
            )
        except ShardCallError as exc:
            if exc.failure is Failure.NOT_FOUND:
                return
            if exc.failure is Failure.NOT_CONFIGURED:
                await state.event(
                    "ShardNotConfigured",
                    f"{exc.details}; instance {instance_id} may still exist there "
                    "(delete it with nstance-admin)",
                    warning=True,
                )
                return
            message = f"DeleteInstance {instance_id} on shard {shard!r}: {exc.code}: {exc.details}"
            if exc.failure is Failure.UNREACHABLE:
                raise Requeue(state.ctx.timings.unreachable_retry, message) from None
            await state.event("DeleteInstanceFailed", message, warning=True)
            raise Requeue(state.ctx.timings.error_retry, message) from None
        state.logger.info("DeleteInstance %s on %s: %s", instance_id, shard, answer.status)
