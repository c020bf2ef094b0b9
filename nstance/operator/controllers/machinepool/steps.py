"""The NstanceMachinePool controller's steps, in the order they run.

Live pool: refuse a duplicate group, hold the finalizer, find (or create) the CAPI MachinePool, check
the spec and shards and split the replicas, create/patch one shard group per shard, delete shard
groups of removed shards, aggregate status. Deleted pool: delete the shard groups and wait for them,
DeleteGroup on every listed shard, release the finalizer. Must not: hold logic (each step's module does).
"""

from __future__ import annotations

from typing import Final

from nstance.core.steps import Step
from nstance.operator.controllers.common import AddFinalizer, RemoveFinalizer
from nstance.operator.controllers.machinepool.check_duplicate_group import CheckDuplicateGroup
from nstance.operator.controllers.machinepool.check_shards import CheckShards
from nstance.operator.controllers.machinepool.delete_orphan_shard_groups import DeleteOrphanShardGroups
from nstance.operator.controllers.machinepool.delete_server_groups import DeleteServerGroups
from nstance.operator.controllers.machinepool.delete_shard_groups import DeleteShardGroups
from nstance.operator.controllers.machinepool.ensure_machine_pool import EnsureMachinePool
from nstance.operator.controllers.machinepool.ensure_shard_groups import EnsureShardGroups
from nstance.operator.controllers.machinepool.state import PoolState
from nstance.operator.controllers.machinepool.update_status import UpdateStatus
from nstance.operator.crds.names import MACHINE_POOL_FINALIZER

STEPS: Final[tuple[Step[PoolState], ...]] = (
    CheckDuplicateGroup(),
    AddFinalizer(MACHINE_POOL_FINALIZER),
    EnsureMachinePool(),
    CheckShards(),
    EnsureShardGroups(),
    DeleteOrphanShardGroups(),
    UpdateStatus(),
)

DELETE_STEPS: Final[tuple[Step[PoolState], ...]] = (
    DeleteShardGroups(),
    DeleteServerGroups(),
    RemoveFinalizer(MACHINE_POOL_FINALIZER),
)
