"""The operator's controllers: one work queue per kind, and the routing of watch events to keys.

``Controllers(ctx)`` owns a ``WorkQueue`` per controller (NstanceCluster, NstanceMachinePool,
NstanceShardGroup, NstanceMachine, on-demand Pod). kopf's event handlers (``nstance.operator.handlers``)
call the ``on_*`` methods with each watch event; these decide which objects need a reconcile:

* an object's own changes count only when its *trigger* changes (uid, generation, deletion,
  finalizers, and a few kind-specific fields), so status writes do not loop;
* a CAPI MachinePool change re-runs the NstanceMachinePool of the same name (spec.replicas);
* a shard group runs on spec changes only (its generation), not on status writes - its own or the
  sync manager's; clearing ``status.observedGeneration`` of an applied (Ready) shard group makes it
  apply its group to the shard again;
* a shard-group change re-runs the pool that controls it only when something the pool decides on
  changed (``pool_view``: spec, labels, owner, deletion, and the status fields the pool aggregates),
  ``POOL_SETTLE`` seconds later so the shard groups of one change are summed up in one run;
* a deleted pool re-runs the other pools of the same group (a DuplicateGroup pool can take over);
* a CAPI Machine change re-runs its NstanceMachine (failure domain, deletion) and its on-demand Pod
  (nodeRef, for pinning).

Each event of a pool, MachinePool or shard group is put into the context's read cache
(``kubecache``, when the context's ``kube`` is a ``CachedKube``) before its key is queued.

Must not: talk to Kubernetes or shards itself (the reconcile functions do), or block the handlers.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Hashable, Mapping
from typing import Any

from nstance.operator.conditions import find_condition, is_true
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
from nstance.operator.controllers.resources import (
    CAPI_MACHINE_POOLS,
    NSTANCE_MACHINE_POOLS,
    NSTANCE_SHARD_GROUPS,
)
from nstance.operator.controllers.shardcalls import ShardCallError
from nstance.operator.crds.names import (
    KIND_MACHINE,
    KIND_MACHINE_POOL,
    READY,
    SERVER_DELETED,
)
from nstance.operator.kube import KubeError, Resource
from nstance.operator.kubecache import CachedKube

__all__ = ["Controllers", "Key", "WorkQueue"]

DELETED = "DELETED"

EXPECTED_FAILURES: tuple[type[BaseException], ...] = (KubeError, ShardCallError, TimeoutError)
"""Reconcile failures that are the outside world's (logged without a traceback and retried)."""


POOL_SETTLE = 0.5
"""Seconds a pool waits after a change of one of its shard groups before it runs (its own changes,
and its MachinePool's, run it at once)."""
POOL_WORKERS = 16
"""Concurrent pool reconciles: a run reads from the cache and waits on a few writes (its shard groups'
specs, its status), so a burst of pool changes is served in parallel rather than four at a time."""
SHARD_GROUP_WORKERS = 32
"""Concurrent shard-group reconciles. Each waits mostly on one UpsertGroup or DeleteGroup call, and a
server folds the calls queued on it into one write of its groups document, so a burst of pool changes
needs many calls in flight rather than a few in sequence (a pool change is one call per shard)."""


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


def pool_view(shard_group: Mapping[str, Any]) -> Hashable:
    """What the pool controller decides on of one of its shard groups.

    The spec, labels, owners and deletion (``ensure_shard_groups``) and the status fields the pool
    aggregates (``update_status``: replicas, isStatic, config, providerIDs, the Ready condition). A
    change elsewhere (lastSyncTime, observedGeneration, ShardReachable, ConfigValid) does not re-run
    the pool.
    """
    m, current = meta(shard_group), status(shard_group)
    ready = find_condition(current.get("conditions"), READY) or {}
    view = {
        "uid": m.get("uid"),
        "deleting": is_deleting(shard_group),
        "labels": m.get("labels"),
        "owners": m.get("ownerReferences"),
        "spec": spec(shard_group),
        "status": {name: current.get(name) for name in ("replicas", "isStatic", "config", "providerIDs")},
        "ready": [ready.get("status"), ready.get("reason"), ready.get("message")],
    }
    return json.dumps(view, sort_keys=True, default=str)


def _apply_requested(obj: Mapping[str, Any]) -> bool:
    """Whether someone cleared the ``status.observedGeneration`` of a shard group that was applied.

    Only that edge of the status is a trigger: the controller's own status write (observedGeneration
    set to the generation it applied) and the sync manager's replica updates must not run it again.
    """
    current = status(obj)
    return current.get("observedGeneration") is None and is_true(current.get("conditions"), READY)


def _owner_name(obj: Mapping[str, Any], kind: str) -> str | None:
    for ref in meta(obj).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("kind") == kind:
            return str(ref.get("name") or "")
    return None


class Controllers:
    """Work queues of every controller, bound to one operator context."""

    def __init__(
        self,
        ctx: OperatorContext,
        *,
        workers: int = 4,
        pool_workers: int = POOL_WORKERS,
        shard_group_workers: int = SHARD_GROUP_WORKERS,
    ) -> None:
        self.ctx = ctx

        def queue(name: str, reconcile: Reconcile, count: int) -> WorkQueue:
            return WorkQueue(name, reconcile, count, expected=EXPECTED_FAILURES)

        self.clusters = queue("nstancecluster", functools.partial(cluster.reconcile, ctx), 1)
        self.pools = queue(
            "nstancemachinepool", functools.partial(machinepool.reconcile, ctx), max(workers, pool_workers)
        )
        self.shard_groups = queue(
            "nstanceshardgroup",
            functools.partial(shardgroup.reconcile, ctx),
            max(workers, shard_group_workers),
        )
        self.machines = queue("nstancemachine", functools.partial(machine.reconcile, ctx), workers)
        self.pods = queue("ondemandpod", functools.partial(ondemand.reconcile, ctx), workers)
        self._cache = ctx.kube.cache if isinstance(ctx.kube, CachedKube) else None
        self._pool_groups: dict[Key, str] = {}
        self._pool_views: dict[Key, Hashable] = {}
        """The last ``pool_view`` of each shard group that re-ran its pool."""

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

    def _cached(self, resource: Resource, event_type: str | None, obj: Mapping[str, Any]) -> None:
        """Put the event's object into the read cache before its reconcile is queued, so the
        reconcile reads at least this version."""
        if self._cache is not None:
            self._cache.observe(resource, event_type, obj)

    def on_pool(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        self._cached(NSTANCE_MACHINE_POOLS, event_type, obj)
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
        self._cached(CAPI_MACHINE_POOLS, event_type, obj)
        template = spec(obj).get("template") or {}
        ref = (template.get("spec") or {}).get("infrastructureRef") if isinstance(template, Mapping) else None
        if isinstance(ref, Mapping) and ref.get("kind") not in (None, KIND_MACHINE_POOL):
            return  # another infrastructure provider's pool
        self.pools.enqueue(key_of(obj))

    def on_shard_group(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        self._cached(NSTANCE_SHARD_GROUPS, event_type, obj)
        key = key_of(obj)
        if event_type == DELETED:
            self.shard_groups.forget(key)
        else:
            self.shard_groups.observe(key, (*_base_trigger(obj), _apply_requested(obj)))
        owner = _owner_name(obj, KIND_MACHINE_POOL)
        if owner is None or controller_uid(obj) is None:
            return
        view = None if event_type == DELETED else pool_view(obj)
        if event_type == DELETED:
            self._pool_views.pop(key, None)
        elif self._pool_views.get(key) == view:
            return
        else:
            self._pool_views[key] = view
        # The shard groups of one pool change settle within moments of each other (one per shard):
        # one pool run after them writes the pool's status once instead of once per shard.
        self.pools.enqueue((key[0], owner), POOL_SETTLE)

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
