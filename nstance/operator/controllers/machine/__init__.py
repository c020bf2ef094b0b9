"""NstanceMachine controller: one on-demand instance per NstanceMachine (CreateInstance/DeleteInstance).

``reconcile(ctx, key)`` runs ``STEPS`` or, while the object is being deleted, ``DELETE_STEPS``.
Triggers: the machine's generation/deletion/finalizers, its owner Machine's changes, and its own
periodic refresh. Must not: delete the owner Machine (the drain coordinator does that on a server
``deleted`` event).
"""

from __future__ import annotations

from nstance.operator.context import OperatorContext
from nstance.operator.controllers.common import reconcile_object
from nstance.operator.controllers.machine.state import make_state
from nstance.operator.controllers.machine.steps import DELETE_STEPS, STEPS
from nstance.operator.controllers.resources import NSTANCE_MACHINES
from nstance.operator.crds.names import MACHINE_FINALIZER

__all__ = ["DELETE_STEPS", "STEPS", "reconcile"]


async def reconcile(ctx: OperatorContext, key: tuple[str, str]) -> float | None:
    return await reconcile_object(
        ctx,
        NSTANCE_MACHINES,
        key,
        finalizer=MACHINE_FINALIZER,
        make_state=make_state,
        steps=STEPS,
        delete_steps=DELETE_STEPS,
    )
