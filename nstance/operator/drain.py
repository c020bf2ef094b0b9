"""The drain coordinator: drains Kubernetes Nodes before the shard servers delete their instances.

Responsible for (spec "Drain Coordination", reference §5.8, improving §10 items 16 and 20):

* Per shard a WatchInstances stream (``streams.keep_stream``; the server sends the drains in progress
  on connect, then live events). Each event is dispatched to a task of its own keyed by instance ID,
  so a long drain never holds up other instances or shards. An event for an instance whose task is
  running is ignored; an event for an instance whose drain already finished is answered with another
  AcknowledgeDrained (idempotent on the server), never with a second drain.
* ``pending_deletion``: the Node comes from ``ctx.nodes`` (the watch-fed index, never a LIST per
  event). No Node → AcknowledgeDrained at once. Otherwise, until the deadline (``delete_at``, or now +
  ``timings.drain_fallback`` when the event has none): cordon (skipped when already unschedulable),
  evict every pod on the Node except DaemonSet pods, mirror pods and pods already terminating; an
  eviction refused with 429 (a disruption budget) is retried every ``timings.drain_poll``; 404 means
  the pod is gone; then poll until no such pod is left and acknowledge (NOT_FOUND: the server already
  deleted the instance, which is fine). When the deadline passes first the coordinator acknowledges
  anyway: the server deletes the instance at that time regardless, and the ack only spares it the
  wait for its own timer. Events on the Node record start (NstanceDrainStarted), success
  (NstanceDrainSucceeded), refused evictions (NstanceDrainBlocked), API trouble
  (NstanceDrainRetrying) and a missed deadline (NstanceDrainTimeout); an NstanceMachine whose
  ``status.instanceID`` is the instance carries the condition Draining while it lasts.
* ``deleted``: the NstanceMachine with that ``status.instanceID`` (from ``MachineIndex``, an in-memory
  index fed by a watch on NstanceMachines in all namespaces) gets ``ready=false`` and ServerDeleted=True
  on its status, then its owning CAPI Machine is deleted (CAPI cascades to the NstanceMachine, whose
  finalizer sees ServerDeleted and skips DeleteInstance). No owner, or the owner is gone: the
  NstanceMachine is deleted directly. Machine already being deleted, or no NstanceMachine: nothing.

Must not: list all Nodes per event, evict DaemonSet or mirror pods, start a second drain for one
instance, or raise for shard or API trouble (``run`` ends only when cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import grpc
from google.protobuf.empty_pb2 import Empty

from nstance.operator.conditions import find_condition, set_condition
from nstance.operator.context import RPC_TIMEOUT, OperatorContext, ShardNotConfigured
from nstance.operator.crds import names
from nstance.operator.drain_machines import MachineIndex, machine_index_for
from nstance.operator.kube import NODES, PODS, KubeError, Object
from nstance.operator.streams import ShardStreams, describe_rpc_error, rpc_code
from nstance.operator.sync_kinds import CAPI_MACHINES, NSTANCE_MACHINES
from nstance.rpc import operator_pb2

log = logging.getLogger(__name__)

STATUS_PENDING_DELETION: Final = "pending_deletion"
STATUS_DELETING: Final = "deleting"
STATUS_DELETED: Final = "deleted"

MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"

REASON_STARTED: Final = "NstanceDrainStarted"
REASON_SUCCEEDED: Final = "NstanceDrainSucceeded"
REASON_BLOCKED: Final = "NstanceDrainBlocked"
REASON_RETRYING: Final = "NstanceDrainRetrying"
REASON_TIMEOUT: Final = "NstanceDrainTimeout"
REASON_FAILED: Final = "NstanceDrainFailed"

FINISHED_MEMORY: Final = 3600.0
"""Seconds a finished drain is remembered (a later event for it is only acknowledged again)."""
MAX_CONCURRENT_EVICTIONS: Final = 16
"""Evictions in flight per drained Node."""
CLEANUP_ATTEMPTS: Final = 6
"""Tries of the ``deleted`` clean-up when the API server fails (with backoff between them)."""

_NOT_CAMEL: Final = re.compile(r"[^A-Za-z0-9]+")


# --- pure helpers ------------------------------------------------------------------------------------


def is_daemonset_pod(pod: Mapping[str, Any]) -> bool:
    """Whether a DaemonSet owns the pod (its controller recreates it on the Node anyway)."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(owner.get("kind") == "DaemonSet" for owner in owners)


def is_mirror_pod(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is the API mirror of a static pod (the kubelet owns it; it cannot be evicted)."""
    return MIRROR_ANNOTATION in ((pod.get("metadata") or {}).get("annotations") or {})


def is_terminating(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def pods_to_drain(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods that must leave the Node before it counts as drained (terminating ones included)."""
    return [pod for pod in pods if not is_daemonset_pod(pod) and not is_mirror_pod(pod)]


def pod_ref(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def condition_reason(text: str, default: str) -> str:
    """A server reason such as ``scale-down`` as a Kubernetes condition reason (``ScaleDown``)."""
    words = [word for word in _NOT_CAMEL.split(text) if word]
    camel = "".join(word[:1].upper() + word[1:] for word in words)
    if not camel or not camel[0].isalpha():
        return default
    return camel


def event_deadline(event: operator_pb2.InstanceEvent, now: datetime, fallback: float) -> datetime:
    """When the server deletes the instance regardless: ``delete_at``, else ``now + fallback``."""
    if event.HasField("delete_at") and (event.delete_at.seconds or event.delete_at.nanos):
        moment: datetime = event.delete_at.ToDatetime(tzinfo=UTC)
        return moment
    return now + timedelta(seconds=fallback)


# --- the coordinator ---------------------------------------------------------------------------------


class DrainCoordinator:
    """Follows WatchInstances on every shard and drains Nodes; ``run`` until cancelled."""

    def __init__(self, ctx: OperatorContext, *, machines: MachineIndex | None = None) -> None:
        self._ctx = ctx
        self._streams = ShardStreams(ctx)
        self._backoff = self._streams.backoff
        self._machines, self._own_machines = machine_index_for(ctx, machines)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._task_shard: dict[str, str] = {}
        self._cleanups: dict[str, asyncio.Task[None]] = {}
        self._finished: dict[str, float] = {}
        self._acked: set[str] = set()
        self._connected: set[str] = set()
        self.drains_started = 0
        """How many drains (cordon + evict) this coordinator began; duplicates never count."""
        self.duplicates_ignored = 0
        """Events for an instance whose drain was running (for example a snapshot after a reconnect)."""

    def draining(self) -> set[str]:
        """Instance IDs whose drain (or re-acknowledgement) is running now."""
        return {iid for iid, task in self._tasks.items() if not task.done()}

    async def run(self) -> None:
        """Follow every shard's WatchInstances until cancelled; never raises for shard or API trouble."""
        try:
            async with asyncio.TaskGroup() as tasks:
                if self._own_machines:
                    tasks.create_task(self._machines.run(), name="drain:machine-index")
                tasks.create_task(
                    self._streams.follow(
                        self._watch_instances, name="WatchInstances", on_removed=self._shard_removed
                    ),
                    name="drain:instances",
                )
        finally:
            for task in [*self._tasks.values(), *self._cleanups.values()]:
                task.cancel()
            for task in [*self._tasks.values(), *self._cleanups.values()]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def connected_shards(self) -> set[str]:
        """Shards whose WatchInstances stream is established right now (known once the server answered:
        its response headers, usually sent with its first event)."""
        return set(self._connected)

    async def _watch_instances(self, shard: str) -> None:
        async def connected(_shard: str) -> None:
            self._connected.add(shard)

        async def lost(_shard: str, _error: str) -> None:
            self._connected.discard(shard)

        try:
            await self._follow_instances(shard, connected, lost)
        finally:
            self._connected.discard(shard)

    async def _follow_instances(
        self,
        shard: str,
        connected: Callable[[str], Awaitable[None]],
        lost: Callable[[str, str], Awaitable[None]],
    ) -> None:
        await self._streams.keep(
            shard,
            name="WatchInstances",
            open_call=lambda stub: stub.WatchInstances(Empty()),
            on_message=self._instance_event,
            on_lost=lost,
            on_connected=connected,
        )

    async def _shard_removed(self, shard: str) -> None:
        for iid in [iid for iid, owner in self._task_shard.items() if owner == shard]:
            task = self._tasks.get(iid)
            if task is not None and not task.done():
                log.info("instance %s: shard %s was removed from the config; its drain stops", iid, shard)
                task.cancel()

    # --- dispatch ----------------------------------------------------------------------------------

    async def _instance_event(self, shard: str, event: operator_pb2.InstanceEvent) -> None:
        iid = event.instance_id
        if not iid:
            log.warning("shard %s: an instance event without an instance id; ignored", shard)
            return
        self._forget_old()
        if event.status == STATUS_DELETED:
            running = self._tasks.get(iid)
            if running is not None and not running.done() and iid not in self._acked:
                running.cancel()  # the server deleted it: draining further is pointless
            if iid not in self._cleanups:
                self._spawn(self._cleanups, iid, shard, self._server_deleted(event))
            return
        if event.status != STATUS_PENDING_DELETION:
            log.debug("shard %s: instance %s is %s (%s)", shard, iid, event.status, event.reason)
            return
        running = self._tasks.get(iid)
        if running is not None and not running.done():
            self.duplicates_ignored += 1
            log.info("instance %s: drain already running; duplicate event ignored", iid)
            return
        if iid in self._finished:
            log.info("instance %s: drained before; acknowledging again", iid)
            deadline = event_deadline(event, self._ctx.clock.now(), self._ctx.timings.drain_fallback)
            self._spawn(self._tasks, iid, shard, self._acknowledge(shard, iid, deadline))
            return
        self._spawn(self._tasks, iid, shard, self._drain(shard, event))

    def _spawn(
        self,
        registry: dict[str, asyncio.Task[None]],
        iid: str,
        shard: str,
        work: Coroutine[Any, Any, Any],
    ) -> None:
        task: asyncio.Task[None] = asyncio.create_task(self._guard(iid, work), name=f"drain:{iid}")
        registry[iid] = task
        if registry is self._tasks:
            self._task_shard[iid] = shard

        def done(finished: asyncio.Task[None]) -> None:
            if registry.get(iid) is finished:
                del registry[iid]
                if registry is self._tasks:
                    self._task_shard.pop(iid, None)

        task.add_done_callback(done)

    async def _guard(self, iid: str, work: Coroutine[Any, Any, Any]) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("instance %s: handling its event failed", iid)

    def _forget_old(self) -> None:
        now = self._ctx.clock.monotonic()
        for iid in [iid for iid, at in self._finished.items() if now - at >= FINISHED_MEMORY]:
            del self._finished[iid]
            self._acked.discard(iid)

    # --- one drain ---------------------------------------------------------------------------------

    async def _drain(self, shard: str, event: operator_pb2.InstanceEvent) -> None:
        ctx = self._ctx
        iid, provider_id = event.instance_id, event.provider_instance_id
        deadline = event_deadline(event, ctx.clock.now(), ctx.timings.drain_fallback)
        node = await self._find_node(provider_id, deadline) if provider_id else None
        if node is None:
            log.info(
                "instance %s (%s): no Node with provider ID %r; acknowledging the drain at once",
                iid,
                event.reason or "no reason",
                provider_id,
            )
            await self._acknowledge(shard, iid, deadline)
            self._finish(iid)
            return
        node_name = str(node["metadata"]["name"])
        self.drains_started += 1
        what = (
            f"instance {iid} of group {event.group or '?'} on shard {shard} ({event.reason or 'no reason'})"
        )
        log.info("draining node %s for %s; deadline %s", node_name, what, deadline.isoformat())
        await ctx.kube.event(
            node,
            reason=REASON_STARTED,
            message=f"draining node {node_name} for {what}; deadline {deadline.isoformat()}",
        )
        await self._machine_condition(
            iid, names.DRAINING, True, reason="Draining", message=f"draining node {node_name} ({what})"
        )
        try:
            left = await self._drain_node(node, deadline)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("drain of node %s failed", node_name)
            await ctx.kube.event(
                node,
                reason=REASON_FAILED,
                message=f"drain of node {node_name} failed ({exc}); acknowledging so the server can proceed",
                warning=True,
            )
            left = None
        if left == []:
            await ctx.kube.event(
                node, reason=REASON_SUCCEEDED, message=f"node {node_name} drained; acknowledging {iid}"
            )
            outcome, reason = "drained", "Drained"
        elif left is not None:
            shown = ", ".join(left[:10]) + (f" and {len(left) - 10} more" if len(left) > 10 else "")
            message = (
                f"deadline {deadline.isoformat()} passed with pods still on node {node_name} ({shown}); "
                f"acknowledging anyway (the server deletes instance {iid} at its deadline regardless)"
            )
            log.warning("%s", message)
            await ctx.kube.event(node, reason=REASON_TIMEOUT, message=message, warning=True)
            outcome, reason = "deadline passed", "DrainTimedOut"
        else:
            outcome, reason = "drain failed", "DrainFailed"
        await self._acknowledge(shard, iid, deadline)
        self._finish(iid)
        await self._machine_condition(
            iid, names.DRAINING, False, reason=reason, message=f"node {node_name}: {outcome}"
        )

    def _finish(self, iid: str) -> None:
        self._finished[iid] = self._ctx.clock.monotonic()

    async def _find_node(self, provider_id: str, deadline: datetime) -> Object | None:
        nodes = self._ctx.nodes
        while not nodes.synced:
            # Never conclude "no Node" (and delete at once) from an index that has not loaded yet.
            if self._ctx.clock.now() >= deadline:
                return None
            await asyncio.sleep(min(self._ctx.timings.drain_poll, 0.5))
        return nodes.find(provider_id)

    async def _drain_node(self, node: Object, deadline: datetime) -> list[str]:
        """Cordon and evict until no pod must leave (``[]``) or the deadline passes (the pods left)."""
        ctx = self._ctx
        name = str(node["metadata"]["name"])
        cordoned = bool((node.get("spec") or {}).get("unschedulable"))
        blocked: set[str] = set()
        trouble_reported = False
        left: list[str] = []
        while True:
            try:
                if not cordoned:
                    await ctx.kube.patch(NODES, name, {"spec": {"unschedulable": True}})
                    cordoned = True
                    log.info("node %s cordoned", name)
                pods = pods_to_drain(await ctx.kube.list(PODS, fields=f"spec.nodeName={name}"))
                left = [pod_ref(pod) for pod in pods]
                if not pods:
                    return []
                refused = await self._evict_all([pod for pod in pods if not is_terminating(pod)])
                for ref in sorted(set(refused) - blocked):
                    await ctx.kube.event(
                        node,
                        reason=REASON_BLOCKED,
                        message=(
                            f"eviction of pod {ref} refused ({refused[ref]}); retrying every "
                            f"{ctx.timings.drain_poll:g}s until {deadline.isoformat()}"
                        ),
                        warning=True,
                    )
                blocked |= set(refused)
            except KubeError as exc:
                if exc.status == 404 and not cordoned:
                    log.info("node %s is gone; nothing to drain", name)
                    return []
                log.warning("drain of node %s: %s; retrying", name, exc)
                if not trouble_reported:
                    trouble_reported = True
                    await ctx.kube.event(
                        node,
                        reason=REASON_RETRYING,
                        message=f"drain of node {name} hit an API error ({exc}); retrying until the deadline",
                        warning=True,
                    )
            remaining = (deadline - ctx.clock.now()).total_seconds()
            if remaining <= 0:
                return left or ["(unknown: the pods could not be listed)"]
            await asyncio.sleep(min(ctx.timings.drain_poll, remaining))

    async def _evict_all(self, pods: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        """Evict ``pods``; return the ones refused (pod → why). Gone pods count as evicted."""
        limit = asyncio.Semaphore(MAX_CONCURRENT_EVICTIONS)
        refused: dict[str, str] = {}

        async def evict(pod: Mapping[str, Any]) -> None:
            meta = pod.get("metadata") or {}
            ref = pod_ref(pod)
            async with limit:
                try:
                    await self._ctx.kube.evict(str(meta.get("name")), str(meta.get("namespace")))
                    log.info("evicted pod %s", ref)
                except KubeError as exc:
                    if exc.status == 404:
                        return
                    if exc.status == 429:
                        refused[ref] = exc.message or "disruption budget"
                        log.info("eviction of pod %s refused (429: %s); will retry", ref, exc.message)
                        return
                    refused[ref] = str(exc)
                    log.warning("eviction of pod %s failed: %s; will retry", ref, exc)

        await asyncio.gather(*(evict(pod) for pod in pods))
        return refused

    async def _acknowledge(self, shard: str, iid: str, deadline: datetime) -> bool:
        """AcknowledgeDrained until the server answers or the deadline (plus one backoff cap) passed."""
        shards = self._ctx.shards
        give_up = deadline + timedelta(seconds=self._backoff.cap)
        attempt = 0
        while True:
            try:
                await shards.stub(shard).AcknowledgeDrained(
                    operator_pb2.DrainAckRequest(instance_id=iid), timeout=RPC_TIMEOUT
                )
                shards.report(shard, True)
                self._acked.add(iid)
                log.info("instance %s: drain acknowledged on shard %s", iid, shard)
                return True
            except asyncio.CancelledError:
                raise
            except ShardNotConfigured:
                log.warning("instance %s: shard %s is no longer configured; cannot acknowledge", iid, shard)
                return False
            except Exception as exc:  # noqa: BLE001 - classified below; unknown failures are retried
                code, error = rpc_code(exc), describe_rpc_error(exc)
                if code == grpc.StatusCode.NOT_FOUND:
                    shards.report(shard, True)
                    self._acked.add(iid)
                    log.info("instance %s: already deleted by shard %s (%s)", iid, shard, error)
                    return True
                if code == grpc.StatusCode.FAILED_PRECONDITION and "standby" not in error:
                    shards.report(shard, True)
                    self._acked.add(iid)
                    log.info("instance %s: shard %s no longer drains it (%s)", iid, shard, error)
                    return True
                shards.report(shard, False, f"AcknowledgeDrained: {error}")
                if self._ctx.clock.now() >= give_up:
                    log.warning(
                        "instance %s: giving up acknowledging its drain (%s); the server deletes it at its "
                        "deadline anyway",
                        iid,
                        error,
                    )
                    return False
                delay = self._backoff.delay(attempt)
                attempt += 1
                log.warning(
                    "instance %s: AcknowledgeDrained failed (%s); retrying in %.1fs", iid, error, delay
                )
                await asyncio.sleep(delay)

    # --- NstanceMachine status ---------------------------------------------------------------------

    async def _machine_condition(
        self,
        iid: str,
        kind: str,
        status: bool,
        *,
        reason: str,
        message: str,
        extra: Mapping[str, Any] | None = None,
        also_clear_draining: bool = False,
    ) -> Object | None:
        """Set a condition (and ``extra`` status fields) on the NstanceMachine of ``iid``, if there is one.

        Returns the machine as last read (None when there is none). Conflicts are retried on a fresh read.
        """
        found = self._machines.find(iid)
        if found is None:
            return None
        meta = found.get("metadata") or {}
        name, namespace = str(meta.get("name")), str(meta.get("namespace") or "")
        for _ in range(5):
            try:
                machine = await self._ctx.kube.get(NSTANCE_MACHINES, name, namespace)
            except KubeError as exc:
                log.warning("NstanceMachine %s/%s: cannot read it: %s", namespace, name, exc)
                return found
            if machine is None:
                return None
            status_obj = machine.get("status") or {}
            now = self._ctx.clock.now()
            conditions = set_condition(
                status_obj.get("conditions"), kind, status, reason=reason, message=message, now=now
            )
            draining = find_condition(conditions, names.DRAINING)
            if also_clear_draining and draining is not None and draining.get("status") == "True":
                conditions = set_condition(
                    conditions, names.DRAINING, False, reason="InstanceDeleted", message=message, now=now
                )
            patch: dict[str, Any] = {"status": {**dict(extra or {}), "conditions": conditions}}
            version = (machine.get("metadata") or {}).get("resourceVersion")
            if version:  # a concurrent writer of the conditions then gets 409 and we re-read
                patch["metadata"] = {"resourceVersion": version}
            try:
                await self._ctx.kube.patch(NSTANCE_MACHINES, name, patch, namespace, status=True)
                return machine
            except KubeError as exc:
                if exc.status == 409:
                    continue
                if exc.status == 404:
                    return None
                log.warning("NstanceMachine %s/%s: cannot set %s: %s", namespace, name, kind, exc)
                return machine
        log.warning(
            "NstanceMachine %s/%s: %s not set (kept conflicting with other writers)", namespace, name, kind
        )
        return found

    # --- deleted instances -------------------------------------------------------------------------

    async def _server_deleted(self, event: operator_pb2.InstanceEvent) -> None:
        iid = event.instance_id
        await self._machines.wait_synced()
        for attempt in range(CLEANUP_ATTEMPTS):
            try:
                await self._clean_up_deleted(event)
                return
            except KubeError as exc:
                delay = self._backoff.delay(attempt)
                log.warning(
                    "instance %s: clean-up after deletion failed (%s); retrying in %.1fs", iid, exc, delay
                )
                await asyncio.sleep(delay)
        log.error("instance %s: gave up cleaning up its NstanceMachine after %d tries", iid, CLEANUP_ATTEMPTS)

    async def _clean_up_deleted(self, event: operator_pb2.InstanceEvent) -> None:
        iid = event.instance_id
        if self._machines.find(iid) is None:
            log.debug("instance %s was deleted; no NstanceMachine refers to it", iid)
            return
        reason = condition_reason(event.reason, "Deleted")
        machine = await self._machine_condition(
            iid,
            names.SERVER_DELETED,
            True,
            reason=reason,
            message=f"the shard server deleted instance {iid} ({event.reason or 'no reason given'})",
            extra={"ready": False},
            also_clear_draining=True,
        )
        if machine is None:
            return
        meta = machine.get("metadata") or {}
        name, namespace = str(meta.get("name")), str(meta.get("namespace") or "")
        owners = [
            ref
            for ref in meta.get("ownerReferences") or []
            if ref.get("kind") == names.CAPI_KIND_MACHINE
            and str(ref.get("apiVersion", "")).startswith(f"{names.CAPI_GROUP}/")
        ]
        for owner in owners:
            owner_name = str(owner.get("name"))
            capi_machine = await self._ctx.kube.get(CAPI_MACHINES, owner_name, namespace)
            if capi_machine is None:
                continue
            if (capi_machine.get("metadata") or {}).get("deletionTimestamp"):
                log.info("instance %s: Machine %s/%s is already being deleted", iid, namespace, owner_name)
                return
            await self._ctx.kube.delete(CAPI_MACHINES, owner_name, namespace)
            log.info("instance %s deleted by the server: deleted Machine %s/%s", iid, namespace, owner_name)
            return
        if meta.get("deletionTimestamp"):
            return
        await self._ctx.kube.delete(NSTANCE_MACHINES, name, namespace)
        log.info(
            "instance %s deleted by the server: deleted orphaned NstanceMachine %s/%s", iid, namespace, name
        )
