"""Delete step: DeleteGroup on the shard group's shard before its finalizer goes.

NOT_FOUND counts as done; a group the shard defines statically stays (Normal event); a shard no
longer in the operator config is skipped with a Warning event (nothing can be called); an unreachable
shard keeps the finalizer and is retried after ``unreachable_retry``; other refusals are retried after
``error_retry`` with a Warning event. Must not: touch other shards.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.core.steps import Requeue
from nstance.operator.controllers.shardcalls import Failure, ShardCallError, call
from nstance.operator.controllers.shardgroup.reasons import ShardGroupReason
from nstance.operator.controllers.shardgroup.state import ShardGroupState
from nstance.operator.crds.names import READY, SHARD_REACHABLE
from nstance.rpc import operator_pb2


@dataclass(frozen=True)
class DeleteGroup:
    name: str = "delete_group"

    async def __call__(self, state: ShardGroupState) -> None:
        request = operator_pb2.DeleteGroupRequest(key=state.group)
        try:
            await call(
                state.ctx, state.shard, "DeleteGroup", lambda stub, t: stub.DeleteGroup(request, timeout=t)
            )
        except ShardCallError as exc:
            await self._failed(state, exc)
            return
        state.logger.info("DeleteGroup %s on %s", state.group, state.shard)

    async def _failed(self, state: ShardGroupState, exc: ShardCallError) -> None:
        timings = state.ctx.timings
        if exc.failure is Failure.NOT_FOUND:
            return
        if exc.failure is Failure.NOT_CONFIGURED:
            await state.event(
                "ShardNotConfigured",
                f"{exc.details}; removing the shard group without DeleteGroup (group {state.group!r} "
                f"may still exist on shard {state.shard!r})",
                warning=True,
            )
            return
        if exc.failure is Failure.REFUSED and "static" in exc.details:
            await state.event(
                "StaticGroupKept",
                f"group {state.group!r} is static on shard {state.shard!r}; it stays until removed from "
                "the shard's config.jsonc",
            )
            return
        message = f"DeleteGroup {state.group!r} on shard {state.shard!r}: {exc.code}: {exc.details}"
        if exc.failure is Failure.UNREACHABLE:
            state.set_condition(SHARD_REACHABLE, False, ShardGroupReason.SHARD_UNREACHABLE, message)
            state.set_condition(READY, False, ShardGroupReason.SHARD_UNREACHABLE, message)
            await state.write_status()
            raise Requeue(timings.unreachable_retry, message)
        await state.event("DeleteGroupFailed", message, warning=True)
        raise Requeue(timings.error_retry, message)
