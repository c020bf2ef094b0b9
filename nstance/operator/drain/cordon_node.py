"""Drain step: cordon the Node (mark it unschedulable), unless it already is.

A Node that is gone (404) counts as drained.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nstance.operator.drain.node_phase import NodePhase
from nstance.operator.drain.state import DrainState
from nstance.operator.kube import NODES, Object

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CordonNode(NodePhase):
    name: str = "cordon_node"

    async def work(self, state: DrainState, node: Object) -> bool:
        if not state.cordoned:
            await state.ctx.kube.patch(NODES, state.node_name, {"spec": {"unschedulable": True}})
            state.cordoned = True
            log.info("node %s cordoned", state.node_name)
        return True
