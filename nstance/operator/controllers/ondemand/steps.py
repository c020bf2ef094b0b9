"""The on-demand pod controller's steps, in order.

Live pod: read the request, hold the pod finalizer, ensure Machine + NstanceMachine, pin the pod once
its VM's Node is known. Deleted pod: delete the Machine (and NstanceMachine), release the finalizer.
Must not: hold logic.
"""

from __future__ import annotations

from typing import Final

from nstance.core.steps import Step
from nstance.operator.controllers.common import AddFinalizer, RemoveFinalizer
from nstance.operator.controllers.ondemand.delete_machine import DeleteMachine
from nstance.operator.controllers.ondemand.ensure_machine import EnsureMachine, EnsureNstanceMachine
from nstance.operator.controllers.ondemand.pin_pod import PinPod
from nstance.operator.controllers.ondemand.read_request import ReadRequest
from nstance.operator.controllers.ondemand.state import PodState
from nstance.operator.crds.names import ONDEMAND_POD_FINALIZER

STEPS: Final[tuple[Step[PodState], ...]] = (
    ReadRequest(),
    AddFinalizer(ONDEMAND_POD_FINALIZER),
    EnsureMachine(),
    EnsureNstanceMachine(),
    PinPod(),
)

DELETE_STEPS: Final[tuple[Step[PodState], ...]] = (
    DeleteMachine(),
    RemoveFinalizer(ONDEMAND_POD_FINALIZER),
)
