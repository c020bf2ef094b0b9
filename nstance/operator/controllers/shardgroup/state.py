"""Per-run state of the NstanceShardGroup controller. Must not: do I/O."""

from __future__ import annotations

from dataclasses import dataclass

from nstance.operator.context import OperatorContext
from nstance.operator.controllers.common import ObjectState, spec
from nstance.operator.kube import Object, Resource
from nstance.operator.objectlog import ObjectLogger


@dataclass
class ShardGroupState(ObjectState):
    @property
    def group(self) -> str:
        return str(spec(self.obj).get("group") or "")

    @property
    def shard(self) -> str:
        return str(spec(self.obj).get("shard") or "")


def make_state(
    ctx: OperatorContext, resource: Resource, obj: Object, logger: ObjectLogger
) -> ShardGroupState:
    return ShardGroupState(ctx=ctx, resource=resource, obj=obj, logger=logger)
