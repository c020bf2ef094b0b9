"""The NstanceShardGroup controller's steps, in order.

Live: hold the finalizer, check the spec, UpsertGroup when the spec is new, write status.
Deleted: DeleteGroup on the shard, release the finalizer. Must not: hold logic.
"""

from __future__ import annotations

from typing import Final

from nstance.core.steps import Step
from nstance.operator.controllers.common import AddFinalizer, RemoveFinalizer, WriteStatus
from nstance.operator.controllers.shardgroup.delete_group import DeleteGroup
from nstance.operator.controllers.shardgroup.state import ShardGroupState
from nstance.operator.controllers.shardgroup.upsert_group import UpsertGroup
from nstance.operator.controllers.shardgroup.validate_spec import ValidateSpec
from nstance.operator.crds.names import SHARD_GROUP_FINALIZER

STEPS: Final[tuple[Step[ShardGroupState], ...]] = (
    AddFinalizer(SHARD_GROUP_FINALIZER),
    ValidateSpec(),
    UpsertGroup(),
    WriteStatus(),
)

DELETE_STEPS: Final[tuple[Step[ShardGroupState], ...]] = (
    DeleteGroup(),
    RemoveFinalizer(SHARD_GROUP_FINALIZER),
)
