"""Step: read what the pod asks for (group and instance type); stop for pods that ask for nothing.

A group that is not a valid Nstance identifier gets one Warning event on the pod and nothing else.
Must not: write anything except that event.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.core.ids import identifier_problem
from nstance.core.steps import Done
from nstance.operator.controllers.ondemand.names import on_demand_group, on_demand_instance_type
from nstance.operator.controllers.ondemand.state import PodState


@dataclass(frozen=True)
class ReadRequest:
    name: str = "read_request"

    async def __call__(self, state: PodState) -> None:
        state.group = on_demand_group(state.obj)
        state.instance_type = on_demand_instance_type(state.obj)
        if not state.group:
            raise Done("the pod asks for no on-demand group")
        problem = identifier_problem(state.group)
        if problem is not None:
            message = f"on-demand group {state.group!r} is not a valid group name: {problem}"
            await state.event("InvalidOnDemandGroup", message, warning=True)
            raise Done(message)
