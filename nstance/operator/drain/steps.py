"""The drain coordinator's steps, in order.

``STEPS`` (a ``pending_deletion`` event): find the Node, announce the drain, cordon, evict until no pod
must leave or the deadline passes, record the outcome, AcknowledgeDrained, remember it as finished.
``ACKNOWLEDGE_AGAIN_STEPS`` (an event for a drain that finished before): AcknowledgeDrained only.
``DELETED_STEPS`` (a ``deleted`` event): find the NstanceMachine, mark it ServerDeleted, delete its
Machine. Must not: hold logic.
"""

from __future__ import annotations

from typing import Final

from nstance.core.steps import Step
from nstance.operator.drain.acknowledge_drain import AcknowledgeDrain
from nstance.operator.drain.cordon_node import CordonNode
from nstance.operator.drain.delete_machine import DeleteMachine
from nstance.operator.drain.evict_pods import EvictPods
from nstance.operator.drain.find_machine import FindMachine
from nstance.operator.drain.find_node import FindNode
from nstance.operator.drain.finish_drain import FinishDrain
from nstance.operator.drain.mark_server_deleted import MarkServerDeleted
from nstance.operator.drain.record_outcome import RecordOutcome
from nstance.operator.drain.start_drain import StartDrain
from nstance.operator.drain.state import DeletedState, DrainState

STEPS: Final[tuple[Step[DrainState], ...]] = (
    FindNode(),
    StartDrain(),
    CordonNode(),
    EvictPods(),
    RecordOutcome(),
    AcknowledgeDrain(),
    FinishDrain(),
)

ACKNOWLEDGE_AGAIN_STEPS: Final[tuple[Step[DrainState], ...]] = (AcknowledgeDrain(),)

DELETED_STEPS: Final[tuple[Step[DeletedState], ...]] = (
    FindMachine(),
    MarkServerDeleted(),
    DeleteMachine(),
)
