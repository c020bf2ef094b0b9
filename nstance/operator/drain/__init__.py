"""The drain coordinator: drains Kubernetes Nodes before the shard servers delete their instances.

Responsible for (spec "Drain Coordination", reference §5.8, improving §10 items 16 and 20):

* Per shard a WatchInstances stream; each event is handled by a task of its own keyed by instance ID
  (``coordinator``), which runs a list of named steps with the same runner as the controllers
  (``nstance.core.steps``; the lists are in ``steps``, one file per step):
* ``pending_deletion`` (``STEPS``): the Node comes from ``ctx.nodes`` (the watch-fed index, never a
  LIST per event; ``find_node``). No Node → AcknowledgeDrained at once. Otherwise, until the deadline
  (``delete_at``, or now + ``timings.drain_fallback`` when the event has none): cordon (skipped when
  already unschedulable; ``cordon_node``), evict every pod on the Node except DaemonSet pods, mirror
  pods and pods already terminating (``evict_pods``); an eviction refused with 429 (a disruption
  budget) is retried every ``timings.drain_poll``; 404 means the pod is gone; then poll until no
  such pod is left and acknowledge (``acknowledge_drain``; NOT_FOUND: the server already deleted the
  instance, which is fine). When the deadline passes first the coordinator acknowledges anyway: the
  server deletes the instance at that time regardless, and the ack only spares it the wait for its
  own timer. Events on the Node record start (NstanceDrainStarted), success (NstanceDrainSucceeded),
  refused evictions (NstanceDrainBlocked), API trouble (NstanceDrainRetrying) and a missed deadline
  (NstanceDrainTimeout); an NstanceMachine whose ``status.instanceID`` is the instance carries the
  condition Draining while it lasts (``start_drain`` … ``finish_drain``).
* ``deleted`` (``DELETED_STEPS``): the NstanceMachine with that ``status.instanceID`` (from
  ``MachineIndex``, an in-memory index fed by a watch on NstanceMachines in all namespaces) gets
  ``ready=false`` and ServerDeleted=True on its status, then its owning CAPI Machine is deleted (CAPI
  cascades to the NstanceMachine, whose finalizer sees ServerDeleted and skips DeleteInstance). No
  owner, or the owner is gone: the NstanceMachine is deleted directly. Machine already being deleted,
  or no NstanceMachine: nothing.

Must not: list all Nodes per event, evict DaemonSet or mirror pods, start a second drain for one
instance, or raise for shard or API trouble (``run`` ends only when cancelled).
"""

from __future__ import annotations

from nstance.operator.drain.coordinator import DrainCoordinator
from nstance.operator.drain.rules import condition_reason, event_deadline, pods_to_drain

__all__ = ["DrainCoordinator", "condition_reason", "event_deadline", "pods_to_drain"]
