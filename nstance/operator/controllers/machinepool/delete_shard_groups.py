"""Delete step: delete every shard group the pool controls and wait until they are gone.

Each shard group's own finalizer calls DeleteGroup on its shard; waiting for them first means no
shard group can upsert the group again after the pool removed it. Shard group deletions re-trigger
the pool (the handler routes their events to the owner), so the wait is event-driven with
``unreachable_retry`` as a safety net. Must not: call shards.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.core.steps import Requeue
from nstance.operator.controllers.common import controller_uid, is_deleting, meta
from nstance.operator.controllers.machinepool.reasons import PoolReason
from nstance.operator.controllers.machinepool.state import PoolState
from nstance.operator.controllers.resources import NSTANCE_SHARD_GROUPS
from nstance.operator.crds.names import GROUP_LABEL, READY


@dataclass(frozen=True)
class DeleteShardGroups:
    name: str = "delete_shard_groups"

    async def __call__(self, state: PoolState) -> None:
        kube = state.ctx.kube
        listed = await kube.list(NSTANCE_SHARD_GROUPS, state.namespace, labels=f"{GROUP_LABEL}={state.group}")
        owned = [sg for sg in listed if controller_uid(sg) == state.uid]
        if not owned:
            return
        for shard_group in owned:
            if not is_deleting(shard_group):
                await kube.delete(NSTANCE_SHARD_GROUPS, str(meta(shard_group).get("name")), state.namespace)
        remaining = ", ".join(sorted(str(meta(sg).get("name")) for sg in owned))
        message = f"waiting for shard groups to remove the group from their shards: {remaining}"
        state.set_condition(READY, False, PoolReason.DELETING, message)
        await state.write_status()
        raise Requeue(state.ctx.timings.unreachable_retry, message)
