"""Per-run state of the on-demand pod controller. Must not: do I/O."""

from __future__ import annotations

from dataclasses import dataclass

from nstance.operator.context import OperatorContext
from nstance.operator.controllers.common import ObjectState
from nstance.operator.controllers.ondemand.names import machine_name
from nstance.operator.kube import Object, Resource
from nstance.operator.objectlog import ObjectLogger


@dataclass
class PodState(ObjectState):
    group: str = ""
    instance_type: str = ""
    machine: Object | None = None

    @property
    def machine_name(self) -> str:
        return machine_name(self.name)


def make_state(ctx: OperatorContext, resource: Resource, obj: Object, logger: ObjectLogger) -> PodState:
    return PodState(ctx=ctx, resource=resource, obj=obj, logger=logger)
