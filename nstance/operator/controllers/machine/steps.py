"""The NstanceMachine controller's steps, in order.

Live: hold the finalizer, check the spec, stop if the server deleted the instance, read the owner
Machine, choose and save shard + instance ID, CreateInstance once, refresh its status, link the Node,
write status and plan the next refresh. Deleted: DeleteInstance, release the finalizer.
Must not: hold logic.
"""

from __future__ import annotations

from typing import Final

from nstance.core.steps import Step
from nstance.operator.controllers.common import AddFinalizer, RemoveFinalizer
from nstance.operator.controllers.machine.choose_instance import ChooseInstance
from nstance.operator.controllers.machine.correlate_node import CorrelateNode
from nstance.operator.controllers.machine.create_instance import CreateInstance
from nstance.operator.controllers.machine.delete_instance import DeleteInstance
from nstance.operator.controllers.machine.find_owner_machine import FindOwnerMachine
from nstance.operator.controllers.machine.refresh_instance import RefreshInstance
from nstance.operator.controllers.machine.state import MachineState
from nstance.operator.controllers.machine.update_status import UpdateStatus
from nstance.operator.controllers.machine.validate_spec import StopIfServerDeleted, ValidateSpec
from nstance.operator.crds.names import MACHINE_FINALIZER

STEPS: Final[tuple[Step[MachineState], ...]] = (
    AddFinalizer(MACHINE_FINALIZER),
    ValidateSpec(),
    StopIfServerDeleted(),
    FindOwnerMachine(),
    ChooseInstance(),
    CreateInstance(),
    RefreshInstance(),
    CorrelateNode(),
    UpdateStatus(),
)

DELETE_STEPS: Final[tuple[Step[MachineState], ...]] = (
    DeleteInstance(),
    RemoveFinalizer(MACHINE_FINALIZER),
)
