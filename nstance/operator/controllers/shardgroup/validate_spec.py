"""Step: the shard group's spec must parse; otherwise ConfigValid/Ready False and stop (no shard call).

Must not: call shards.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.core.steps import Done
from nstance.operator.controllers.shardgroup.reasons import ShardGroupReason
from nstance.operator.controllers.shardgroup.state import ShardGroupState
from nstance.operator.crds.models import InvalidResource, NstanceShardGroup
from nstance.operator.crds.names import CONFIG_VALID, READY


@dataclass(frozen=True)
class ValidateSpec:
    name: str = "validate_spec"

    async def __call__(self, state: ShardGroupState) -> None:
        try:
            NstanceShardGroup.from_k8s(state.obj)
        except InvalidResource as exc:
            message = f"{exc}; fix the spec (the pool controller rewrites it from the NstanceMachinePool)"
            state.set_condition(CONFIG_VALID, False, ShardGroupReason.CONFIG_INVALID, message)
            state.set_condition(READY, False, ShardGroupReason.CONFIG_INVALID, message)
            await state.write_status()
            raise Done(message) from None
