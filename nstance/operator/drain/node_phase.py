"""The shape of the drain steps that work on the Node until the deadline (cordon, evict).

A ``NodePhase`` runs only while there is a Node whose drain has not ended. API errors are retried
every ``drain_poll`` until the deadline (the first one recorded as a NstanceDrainRetrying Event);
an unexpected error ends the drain as failed, so it is still acknowledged and the server can go on.
Must not: acknowledge (a later step does).
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod

from nstance.operator.drain.reasons import REASON_RETRYING
from nstance.operator.drain.state import DrainState, Outcome
from nstance.operator.kube import KubeError, Object

log = logging.getLogger(__name__)

UNLISTED = "(unknown: the pods could not be listed)"
"""What a drain reports as left when the deadline passed before the pods could be listed."""


class NodePhase(ABC):
    """Base of the Node steps: ``work`` one try; ``__call__`` retries it until it ends the drain."""

    name: str

    async def __call__(self, state: DrainState) -> None:
        if not state.draining or state.node is None:
            return
        try:
            while not await self._try(state, state.node):
                remaining = state.remaining()
                if remaining <= 0:
                    state.outcome = Outcome.TIMED_OUT
                    state.pods_left = state.pods_left or [UNLISTED]
                    return
                await asyncio.sleep(min(state.ctx.timings.drain_poll, remaining))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("drain of node %s failed", state.node_name)
            state.outcome, state.failure = Outcome.FAILED, str(exc)

    async def _try(self, state: DrainState, node: Object) -> bool:
        try:
            return await self.work(state, node)
        except KubeError as exc:
            if exc.status == 404 and not state.cordoned:
                log.info("node %s is gone; nothing to drain", state.node_name)
                state.outcome, state.pods_left = Outcome.DRAINED, []
                return True
            log.warning("drain of node %s: %s; retrying", state.node_name, exc)
            if not state.trouble_reported:
                state.trouble_reported = True
                await state.ctx.kube.event(
                    node,
                    reason=REASON_RETRYING,
                    message=(
                        f"drain of node {state.node_name} hit an API error ({exc}); "
                        "retrying until the deadline"
                    ),
                    warning=True,
                )
            return False

    @abstractmethod
    async def work(self, state: DrainState, node: Object) -> bool:
        """One try; True when this phase is over (it may also end the drain: ``state.outcome``)."""
