"""Per-run state of the NstanceMachinePool controller.

Holds what one run has read or decided so later steps need not read it again: the pool's CAPI
MachinePool, the shard groups the pool owns (by shard), and the per-shard sizes. Must not: do I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nstance.operator.context import OperatorContext
from nstance.operator.controllers.common import ObjectState, meta, spec
from nstance.operator.kube import Object, Resource
from nstance.operator.objectlog import ObjectLogger


@dataclass
class PoolState(ObjectState):
    machine_pool: Object | None = None
    """The CAPI MachinePool of the same name (the source of the replica count)."""
    owned: list[Object] = field(default_factory=list)
    """Every NstanceShardGroup this pool controls (including ones for shards no longer listed)."""
    shard_groups: dict[str, Object] = field(default_factory=dict)
    """The shard group of each listed shard, after this run's writes."""
    sizes: dict[str, int] = field(default_factory=dict)
    """Desired size per listed shard, in spec.shards order."""

    @property
    def group(self) -> str:
        return str(spec(self.obj).get("group") or "")

    @property
    def shards(self) -> list[str]:
        return [str(s) for s in spec(self.obj).get("shards") or []]

    @property
    def uid(self) -> str:
        return str(meta(self.obj).get("uid") or "")


def make_state(ctx: OperatorContext, resource: Resource, obj: Object, logger: ObjectLogger) -> PoolState:
    return PoolState(ctx=ctx, resource=resource, obj=obj, logger=logger)
