"""Per-run state of the NstanceMachine controller. Must not: do I/O."""

from __future__ import annotations

from dataclasses import dataclass

from nstance.operator.context import OperatorContext
from nstance.operator.controllers.common import ObjectState, spec
from nstance.operator.kube import Object, Resource
from nstance.operator.objectlog import ObjectLogger


@dataclass
class MachineState(ObjectState):
    owner_machine: Object | None = None
    """The CAPI Machine that owns this NstanceMachine (None for an orphan)."""
    instance_status: str = ""
    """The instance's status word from GetInstanceStatus this run ("" = not asked or unknown)."""
    node_name: str = ""
    """The Node running the instance, when correlated this run."""

    @property
    def group(self) -> str:
        return str(spec(self.obj).get("group") or "")

    def instance_id(self) -> str:
        return str(self.current_status().get("instanceID") or "")

    def shard(self) -> str:
        return str(self.current_status().get("shard") or "")


def make_state(ctx: OperatorContext, resource: Resource, obj: Object, logger: ObjectLogger) -> MachineState:
    return MachineState(ctx=ctx, resource=resource, obj=obj, logger=logger)
