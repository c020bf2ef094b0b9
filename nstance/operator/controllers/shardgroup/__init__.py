"""NstanceShardGroup controller: applies one group's per-shard spec to that shard (UpsertGroup/DeleteGroup).

``reconcile(ctx, key)`` runs ``STEPS`` or, while the object is being deleted, ``DELETE_STEPS``. It is
triggered by changes of the shard group's generation, deletion or finalizers (not by its status, so
the sync manager's replica updates cost nothing here) and by its own retries. Must not: change the
spec (the pool controller owns it).
"""

from __future__ import annotations

from nstance.operator.context import OperatorContext
from nstance.operator.controllers.common import reconcile_object
from nstance.operator.controllers.resources import NSTANCE_SHARD_GROUPS
from nstance.operator.controllers.shardgroup.state import make_state
from nstance.operator.controllers.shardgroup.steps import DELETE_STEPS, STEPS
from nstance.operator.crds.names import SHARD_GROUP_FINALIZER

__all__ = ["DELETE_STEPS", "STEPS", "reconcile"]


async def reconcile(ctx: OperatorContext, key: tuple[str, str]) -> float | None:
    return await reconcile_object(
        ctx,
        NSTANCE_SHARD_GROUPS,
        key,
        finalizer=SHARD_GROUP_FINALIZER,
        make_state=make_state,
        steps=STEPS,
        delete_steps=DELETE_STEPS,
    )
