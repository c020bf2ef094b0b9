"""The operator's controllers: one work queue per kind, and the routing of watch events to keys.

``Controllers(ctx)`` owns a ``WorkQueue`` per controller (NstanceCluster, NstanceMachinePool,
NstanceShardGroup, NstanceMachine, on-demand Pod). kopf's event handlers (``nstance.operator.handlers``)
call the ``on_*`` methods with each watch event; these decide which objects need a reconcile:

* an object's own changes count only when its *trigger* changes (uid, generation, deletion,
  finalizers, and a few kind-specific fields), so status writes do not loop;
* a CAPI MachinePool change re-runs the NstanceMachinePool of the same name (spec.replicas);
* any change of a shard group (status included) re-runs the pool that controls it; clearing a shard
  group's ``status.observedGeneration`` makes it apply its group to the shard again;
* a deleted pool re-runs the other pools of the same group (a DuplicateGroup pool can take over);
* a CAPI Machine change re-runs its NstanceMachine (failure domain, deletion) and its on-demand Pod
  (nodeRef, for pinning).

Must not: talk to Kubernetes or shards itself (the reconcile functions do), or block the handlers.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Mapping
from typing import Any

from nstance.operator.context import OperatorContext
from nstance.operator.controllers import cluster, machine, machinepool, ondemand, shardgroup
from nstance.operator.controllers.common import controller_uid, is_deleting, meta, spec, status
from nstance.operator.controllers.ondemand.names import (
    has_gate,
    is_on_demand_pod,
    on_demand_group,
    on_demand_instance_type,
)
from nstance.operator.controllers.queue import Key, Reconcile, WorkQueue
from nstance.operator.controllers.shardcalls import ShardCallError
from nstance.operator.crds.names import (
    KIND_MACHINE,
    KIND_MACHINE_POOL,
    SERVER_DELETED,
)
from nstance.operator.kube import KubeError

__all__ = ["Controllers", "Key", "WorkQueue"]

DELETED = "DELETED"

EXPECTED_FAILURES: tuple[type[BaseException], ...] = (KubeError, ShardCallError, TimeoutError)
"""Reconcile failures that are the outside world's (logged without a traceback and retried)."""


def key_of(obj: Mapping[str, Any]) -> Key:
    m = meta(obj)
    return (str(m.get("namespace") or ""), str(m.get("name") or ""))


def _base_trigger(obj: Mapping[str, Any]) -> tuple[Hashable, ...]:
    m = meta(obj)
    return (
        str(m.get("uid") or ""),
        int(m.get("generation") or 0),
        is_deleting(obj),
        tuple(str(f) for f in m.get("finalizers") or []),
    )


def _owner_name(obj: Mapping[str, Any], kind: str) -> str | None:
    for ref in meta(obj).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("kind") == kind:
            return str(ref.get("name") or "")
    return None


class Controllers:
    """Work queues of every controller, bound to one operator context."""

    def __init__(self, ctx: OperatorContext, *, workers: int = 4) -> None:
        self.ctx = ctx

        def queue(name: str, reconcile: Reconcile, count: int) -> WorkQueue:
            return WorkQueue(name, reconcile, count, expected=EXPECTED_FAILURES)

        self.clusters = queue("nstancecluster", functools.partial(cluster.reconcile, ctx), 1)
        self.pools = queue("nstancemachinepool", functools.partial(machinepool.reconcile, ctx), workers)
        self.shard_groups = queue("nstanceshardgroup", functools.partial(shardgroup.reconcile, ctx), workers)
        self.machines = queue("nstancemachine", functools.partial(machine.reconcile, ctx), workers)
        self.pods = queue("ondemandpod", functools.partial(ondemand.reconcile, ctx), workers)
        self._pool_groups: dict[Key, str] = {}

    @property
    def queues(self) -> tuple[WorkQueue, ...]:
        return (self.clusters, self.pools, self.shard_groups, self.machines, self.pods)

    def start(self) -> None:
        for queue in self.queues:
            queue.start()

    async def stop(self) -> None:
        for queue in self.queues:
            await queue.stop()

    async def wait_idle(self) -> None:
        """Until no queue has work queued or running (delayed retries do not count)."""
        while any(q.busy for q in self.queues):
            for queue in self.queues:
                await queue.wait_idle()

    # --- routing ------------------------------------------------------------------------------

    def on_cluster(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        key = key_of(obj)
        if event_type == DELETED:
            self.clusters.forget(key)
            return
        initialization = status(obj).get("initialization") or {}
        self.clusters.observe(key, (*_base_trigger(obj), initialization.get("provisioned")))

    def on_pool(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        key = key_of(obj)
        group = str(spec(obj).get("group") or "")
        if event_type == DELETED:
            self.pools.forget(key)
            self._pool_groups.pop(key, None)
            for other, other_group in self._pool_groups.items():
                if other_group == group:
                    self.pools.enqueue(other)
            return
        self._pool_groups[key] = group
        annotations = meta(obj).get("annotations") or {}
        self.pools.observe(key, (*_base_trigger(obj), tuple(sorted(annotations.items()))))

    def on_machine_pool(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        template = spec(obj).get("template") or {}
        ref = (template.get("spec") or {}).get("infrastructureRef") if isinstance(template, Mapping) else None
        if isinstance(ref, Mapping) and ref.get("kind") not in (None, KIND_MACHINE_POOL):
            return  # another infrastructure provider's pool
        self.pools.enqueue(key_of(obj))

    def on_shard_group(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        key = key_of(obj)
        if event_type == DELETED:
            self.shard_groups.forget(key)
        else:
            # observedGeneration is part of the trigger so that clearing it (sync manager, or a user)
            # asks for the group to be applied to its shard again.
            observed = status(obj).get("observedGeneration")
            self.shard_groups.observe(key, (*_base_trigger(obj), observed))
        owner = _owner_name(obj, KIND_MACHINE_POOL)
        if owner and controller_uid(obj) is not None:
            self.pools.enqueue((key[0], owner))

    def on_machine(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        key = key_of(obj)
        if event_type == DELETED:
            self.machines.forget(key)
            return
        server_deleted = any(
            isinstance(c, Mapping) and c.get("type") == SERVER_DELETED and c.get("status") == "True"
            for c in status(obj).get("conditions") or []
        )
        self.machines.observe(key, (*_base_trigger(obj), server_deleted))

    def on_capi_machine(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        namespace = key_of(obj)[0]
        ref = spec(obj).get("infrastructureRef") or {}
        if isinstance(ref, Mapping) and ref.get("kind") == KIND_MACHINE and ref.get("name"):
            self.machines.enqueue((namespace, str(ref["name"])))
        pod = _owner_name(obj, "Pod")
        if pod:
            self.pods.enqueue((namespace, pod))

    def on_pod(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        key = key_of(obj)
        if event_type == DELETED:
            self.pods.forget(key)
            return
        if not is_on_demand_pod(obj):
            return
        trigger = (
            *_base_trigger(obj),
            on_demand_group(obj),
            on_demand_instance_type(obj),
            has_gate(obj),
            str(spec(obj).get("nodeName") or ""),
        )
        self.pods.observe(key, trigger)
