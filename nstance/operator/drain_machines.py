"""An in-memory index of NstanceMachines by ``status.instanceID``, kept current by a watch.

Kubernetes has no field index for custom status fields, and a LIST per server event (every deleted
pool instance sends one) would cost a full read of every NstanceMachine each time. ``MachineIndex``
is a ``WatchedIndex`` over NstanceMachines in every namespace (list once, then watch from the list's
version, re-listing after a dropped stream or a 410 Gone, with backoff); ``find`` answers from memory.
Used by the drain coordinator (``deleted`` events, the Draining condition) and by the sync manager
(routing WatchErrors to the machine); ``machine_index_for`` gives each the index it was handed, or a
new one it must run itself.

It never writes to Kubernetes. Objects it returns are snapshots: callers re-read before they compare.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nstance.operator.context import OperatorContext
from nstance.operator.sync_kinds import NSTANCE_MACHINES
from nstance.operator.watchindex import ListWatch, WatchedIndex


def instance_id_of(machine: Mapping[str, Any]) -> str:
    """The ``status.instanceID`` of an NstanceMachine ("" when it has none yet)."""
    return str((machine.get("status") or {}).get("instanceID") or "")


def _instance_keys(machine: Mapping[str, Any]) -> set[str]:
    instance_id = instance_id_of(machine)
    return {instance_id} if instance_id else set()


class MachineIndex(WatchedIndex):
    """NstanceMachines by instance ID; ``run`` keeps it current, ``find(instance_id)`` looks one up."""

    def __init__(self, kube: ListWatch, *, backoff_base: float = 1.0, backoff_cap: float = 30.0) -> None:
        super().__init__(
            kube, NSTANCE_MACHINES, _instance_keys, backoff_base=backoff_base, backoff_cap=backoff_cap
        )


def machine_index_for(ctx: OperatorContext, shared: MachineIndex | None) -> tuple[MachineIndex, bool]:
    """``(shared, False)`` when a component is handed an index its owner runs, else a new index with
    the context's backoff and True: the component must then ``run`` it itself."""
    if shared is not None:
        return shared, False
    timings = ctx.timings
    return MachineIndex(ctx.kube, backoff_base=timings.backoff_base, backoff_cap=timings.backoff_cap), True
