"""Delete step: DeleteGroup on every shard in ``spec.shards`` before the finalizer goes.

The shard groups normally did this already; doing it for every listed shard again makes sure no
server group outlives its pool (NOT_FOUND counts as done). A shard that is configured but does not
answer keeps the finalizer (requeue after ``unreachable_retry``): leaking a running group is worse
than a pool that takes longer to delete. A shard no longer in the operator config is skipped with a
Warning event, and a group the shard defines statically stays (only its dynamic overrides can go).
A pool that never managed the group (DuplicateGroup) deletes nothing. Must not: touch Kubernetes
objects other than the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.core.steps import Requeue
from nstance.operator.controllers.common import list_everywhere, meta
from nstance.operator.controllers.machinepool.check_duplicate_group import group_owner
from nstance.operator.controllers.machinepool.reasons import PoolReason
from nstance.operator.controllers.machinepool.state import PoolState
from nstance.operator.controllers.shardcalls import Failure, ShardCallError, call
from nstance.operator.crds.names import GROUP_LABEL, READY
from nstance.rpc import operator_pb2


@dataclass(frozen=True)
class DeleteServerGroups:
    name: str = "delete_server_groups"

    async def __call__(self, state: PoolState) -> None:
        # Pools claiming this group carry its label (check_duplicate_group sets it); an unlabelled
        # pool never got past that check, so it manages nothing.
        pools = await list_everywhere(
            state.ctx, state.resource, state.namespace, labels=f"{GROUP_LABEL}={state.group}"
        )
        owner = group_owner(pools, state.group)
        if owner is not None and meta(owner).get("uid") != state.uid:
            state.logger.info("group %r is managed by another pool; not deleting it", state.group)
            return
        retry: float | None = None
        problems: list[str] = []
        request = operator_pb2.DeleteGroupRequest(key=state.group)
        for shard in state.shards:
            try:
                await call(
                    state.ctx, shard, "DeleteGroup", lambda stub, t: stub.DeleteGroup(request, timeout=t)
                )
            except ShardCallError as exc:
                delay = await self._handle(state, shard, exc)
                if delay is not None:
                    retry = delay if retry is None else min(retry, delay)
                    problems.append(f"{shard}: {exc.code}: {exc.details}")
                continue
            state.logger.info("group %r deleted on shard %s", state.group, shard)
        if retry is not None:
            message = "cannot remove the group from every shard yet: " + "; ".join(problems)
            state.set_condition(READY, False, PoolReason.DELETING, message)
            await state.write_status()
            raise Requeue(retry, message)

    async def _handle(self, state: PoolState, shard: str, exc: ShardCallError) -> float | None:
        timings = state.ctx.timings
        if exc.failure is Failure.NOT_FOUND:
            return None
        if exc.failure is Failure.NOT_CONFIGURED:
            await state.event(
                "ShardNotConfigured",
                f"shard {shard!r} is no longer in the operator config; group {state.group!r} on it is "
                "left as it is (delete it with nstance-admin if it should go)",
                warning=True,
            )
            return None
        if exc.failure is Failure.REFUSED and "static" in exc.details:
            await state.event(
                "StaticGroupKept",
                f"group {state.group!r} is static on shard {shard!r} (defined in its config.jsonc); "
                "it stays until removed from that config",
            )
            return None
        if exc.failure is Failure.UNREACHABLE:
            return timings.unreachable_retry
        await state.event("DeleteGroupFailed", str(exc), warning=True)
        return timings.error_retry
