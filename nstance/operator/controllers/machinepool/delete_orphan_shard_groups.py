"""Step: delete the shard groups this pool owns for shards no longer in ``spec.shards``.

Deleting the NstanceShardGroup runs its finalizer, which calls DeleteGroup on that shard, so the
group's instances there are removed. Must not: touch shard groups the pool does not control.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.operator.controllers.common import is_deleting, meta, spec
from nstance.operator.controllers.machinepool.state import PoolState
from nstance.operator.controllers.resources import NSTANCE_SHARD_GROUPS


@dataclass(frozen=True)
class DeleteOrphanShardGroups:
    name: str = "delete_orphan_shard_groups"

    async def __call__(self, state: PoolState) -> None:
        listed = set(state.shards)
        for shard_group in state.owned:
            shard = str(spec(shard_group).get("shard") or "")
            if shard in listed or is_deleting(shard_group):
                continue
            name = str(meta(shard_group).get("name"))
            await state.ctx.kube.delete(NSTANCE_SHARD_GROUPS, name, state.namespace)
            await state.event(
                "ShardGroupRemoved",
                f"shard {shard!r} is no longer in spec.shards: deleting NstanceShardGroup {name} "
                "(its instances on that shard are removed)",
            )
