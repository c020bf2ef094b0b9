"""Drain step: record how the Node's drain ended as an Event on the Node.

Drained: NstanceDrainSucceeded. Deadline passed with pods left: NstanceDrainTimeout (warning, naming
up to ten of them; the drain is acknowledged anyway, the server deletes the instance at its deadline
regardless). Failed: NstanceDrainFailed. Nothing when there is no Node.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from nstance.operator.drain.reasons import REASON_FAILED, REASON_SUCCEEDED, REASON_TIMEOUT
from nstance.operator.drain.state import DrainState, Outcome

log = logging.getLogger(__name__)

PODS_NAMED: Final = 10
"""Pods a timeout Event names before it counts the rest."""


@dataclass(frozen=True)
class RecordOutcome:
    name: str = "record_outcome"

    async def __call__(self, state: DrainState) -> None:
        node = state.node
        if node is None:
            return
        node_name, iid = state.node_name, state.iid
        if state.outcome is Outcome.DRAINED:
            await state.ctx.kube.event(
                node, reason=REASON_SUCCEEDED, message=f"node {node_name} drained; acknowledging {iid}"
            )
        elif state.outcome is Outcome.TIMED_OUT:
            left = state.pods_left
            more = len(left) - PODS_NAMED
            shown = ", ".join(left[:PODS_NAMED]) + (f" and {more} more" if more > 0 else "")
            message = (
                f"deadline {state.deadline.isoformat()} passed with pods still on node {node_name} "
                f"({shown}); acknowledging anyway (the server deletes instance {iid} at its deadline "
                "regardless)"
            )
            log.warning("%s", message)
            await state.ctx.kube.event(node, reason=REASON_TIMEOUT, message=message, warning=True)
        else:
            await state.ctx.kube.event(
                node,
                reason=REASON_FAILED,
                message=(
                    f"drain of node {node_name} failed ({state.failure}); acknowledging so the server can "
                    "proceed"
                ),
                warning=True,
            )
