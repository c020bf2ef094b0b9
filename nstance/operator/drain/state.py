"""Per-run state of the drain coordinator's steps, and the ledger the coordinator keeps across runs.

``DrainState`` is one ``pending_deletion`` event being handled (``STEPS``, or
``ACKNOWLEDGE_AGAIN_STEPS``); ``DeletedState`` one ``deleted`` event (``DELETED_STEPS``). Both carry
the operator context, the NstanceMachine index, the shard and the event; ``DrainLedger`` is what the
steps record for the coordinator (drains started, drains acknowledged, drains finished and when).

Must not: do I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from nstance.core.backoff import Backoff
from nstance.core.steps import StepState
from nstance.operator.context import OperatorContext
from nstance.operator.drain_machines import MachineIndex
from nstance.operator.kube import Object
from nstance.rpc import operator_pb2


@dataclass
class DrainLedger:
    """What the coordinator remembers across drains; steps record into it."""

    started: int = 0
    """Drains (cordon + evict) begun; duplicates never count."""
    acked: set[str] = field(default_factory=set)
    """Instances whose drain the server accepted as acknowledged."""
    finished: dict[str, float] = field(default_factory=dict)
    """Instance -> when its drain finished (the clock's monotonic time)."""


class Outcome(StrEnum):
    """How a Node's drain ended ("" while it is still going)."""

    NONE = ""
    DRAINED = "drained"
    TIMED_OUT = "deadline passed"
    FAILED = "drain failed"


@dataclass
class InstanceState(StepState):
    """What every drain step shares: the context, the machine index, the shard and the event."""

    ctx: OperatorContext
    machines: MachineIndex
    ledger: DrainLedger
    shard: str
    event: operator_pb2.InstanceEvent

    @property
    def iid(self) -> str:
        return self.event.instance_id


@dataclass
class DrainState(InstanceState):
    """One ``pending_deletion`` event: find the Node, drain it until the deadline, acknowledge."""

    deadline: datetime
    backoff: Backoff
    node: Object | None = None
    """The Node running the instance (None: no Node, the drain is acknowledged at once)."""
    cordoned: bool = False
    outcome: Outcome = Outcome.NONE
    pods_left: list[str] = field(default_factory=list)
    """The pods still to leave, as of the last look (``namespace/name``)."""
    blocked: set[str] = field(default_factory=set)
    """Pods whose eviction was refused (each reported once)."""
    trouble_reported: bool = False
    """Whether the NstanceDrainRetrying Event was recorded (once per drain)."""
    failure: str = ""

    @property
    def node_name(self) -> str:
        return str(self.node["metadata"]["name"]) if self.node is not None else ""

    @property
    def draining(self) -> bool:
        """Whether there is a Node and its drain has not ended yet."""
        return self.node is not None and self.outcome is Outcome.NONE

    def what(self) -> str:
        event = self.event
        return (
            f"instance {self.iid} of group {event.group or '?'} on shard {self.shard} "
            f"({event.reason or 'no reason'})"
        )

    def remaining(self) -> float:
        """Seconds until the deadline (negative once it passed)."""
        return (self.deadline - self.ctx.clock.now()).total_seconds()


@dataclass
class DeletedState(InstanceState):
    """One ``deleted`` event: mark the instance's NstanceMachine and delete its Machine."""

    machine: Object | None = None
    """The NstanceMachine as last read (None: there is none)."""
