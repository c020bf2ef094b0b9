"""Drain step: announce the drain of a Node (count it, a NstanceDrainStarted Event on the Node, the
Draining condition on the instance's NstanceMachine). Nothing when there is no Node.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nstance.operator.crds import names
from nstance.operator.drain.machine_status import set_machine_condition
from nstance.operator.drain.reasons import REASON_STARTED
from nstance.operator.drain.state import DrainState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartDrain:
    name: str = "start_drain"

    async def __call__(self, state: DrainState) -> None:
        if state.node is None:
            return
        node_name, what, deadline = state.node_name, state.what(), state.deadline.isoformat()
        state.ledger.started += 1
        log.info("draining node %s for %s; deadline %s", node_name, what, deadline)
        await state.ctx.kube.event(
            state.node,
            reason=REASON_STARTED,
            message=f"draining node {node_name} for {what}; deadline {deadline}",
        )
        await set_machine_condition(
            state.ctx,
            state.machines,
            state.iid,
            names.DRAINING,
            True,
            reason="Draining",
            message=f"draining node {node_name} ({what})",
        )
