"""NstanceMachinePool controller: spreads a CAPI MachinePool's replicas over per-shard NstanceShardGroups.

``reconcile(ctx, key)`` reads the pool and runs ``STEPS`` (or ``DELETE_STEPS`` while it is being
deleted); see ``steps.py`` for the order and each step's module for its rule. Triggers (routed by
``nstance.operator.handlers``): the pool itself, its same-name CAPI MachinePool (spec.replicas), and
every change of a shard group it owns (status included). Must not: call UpsertGroup itself (the shard
group controller does) or run outside the work queue.
"""

from __future__ import annotations

from nstance.operator.context import OperatorContext
from nstance.operator.controllers.common import reconcile_object
from nstance.operator.controllers.machinepool.state import make_state
from nstance.operator.controllers.machinepool.steps import DELETE_STEPS, STEPS
from nstance.operator.controllers.resources import NSTANCE_MACHINE_POOLS
from nstance.operator.crds.names import MACHINE_POOL_FINALIZER

__all__ = ["DELETE_STEPS", "STEPS", "reconcile"]


async def reconcile(ctx: OperatorContext, key: tuple[str, str]) -> float | None:
    """Run the pool behind ``key``; return seconds until the next run (None = on change)."""
    return await reconcile_object(
        ctx,
        NSTANCE_MACHINE_POOLS,
        key,
        finalizer=MACHINE_POOL_FINALIZER,
        make_state=make_state,
        steps=STEPS,
        delete_steps=DELETE_STEPS,
    )
