"""Drain step: remember the drain as finished (a later event for it is only acknowledged again) and
end the Draining condition on the instance's NstanceMachine with how it ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from nstance.operator.crds import names
from nstance.operator.drain.machine_status import set_machine_condition
from nstance.operator.drain.state import DrainState, Outcome

CONDITION_REASONS: Final = {
    Outcome.DRAINED: "Drained",
    Outcome.TIMED_OUT: "DrainTimedOut",
    Outcome.FAILED: "DrainFailed",
}
"""The Draining=False reason for each way a drain ends."""


@dataclass(frozen=True)
class FinishDrain:
    name: str = "finish_drain"

    async def __call__(self, state: DrainState) -> None:
        state.ledger.finished[state.iid] = state.ctx.clock.monotonic()
        if state.node is None:
            return
        outcome = state.outcome if state.outcome is not Outcome.NONE else Outcome.FAILED
        await set_machine_condition(
            state.ctx,
            state.machines,
            state.iid,
            names.DRAINING,
            False,
            reason=CONDITION_REASONS[outcome],
            message=f"node {state.node_name}: {outcome}",
        )
