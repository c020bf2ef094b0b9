"""Drain step: find the instance's Node by provider ID in the watch-fed Node index.

Waits (until the deadline) for the index to load first: "no Node" from an index that has not loaded
would acknowledge, and so delete, at once. No Node (or no provider ID): the drain is acknowledged at
once by the later steps. Must not: list Nodes.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from nstance.operator.drain.state import DrainState
from nstance.operator.kube import Object

log = logging.getLogger(__name__)

SYNC_POLL_CAP = 0.5
"""Most seconds between two looks at whether the Node index has loaded."""


@dataclass(frozen=True)
class FindNode:
    name: str = "find_node"

    async def __call__(self, state: DrainState) -> None:
        provider_id = state.event.provider_instance_id
        state.node = await self._find(state, provider_id) if provider_id else None
        if state.node is None:
            log.info(
                "instance %s (%s): no Node with provider ID %r; acknowledging the drain at once",
                state.iid,
                state.event.reason or "no reason",
                provider_id,
            )
            return
        state.cordoned = bool((state.node.get("spec") or {}).get("unschedulable"))

    async def _find(self, state: DrainState, provider_id: str) -> Object | None:
        nodes = state.ctx.nodes
        while not nodes.synced:
            if state.ctx.clock.now() >= state.deadline:
                return None
            await asyncio.sleep(min(state.ctx.timings.drain_poll, SYNC_POLL_CAP))
        return nodes.find(provider_id)
