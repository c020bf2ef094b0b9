"""The sync manager: imports server groups into Kubernetes and mirrors shard state onto shard groups.

Responsible for (spec "Operator Sync", reference §5.7, improving §10 item 15):

* **Initial import.** Nothing is written to Kubernetes objects until ListGroups succeeded on every
  configured shard. Each shard is retried forever with exponential backoff and jitter (the process
  never exits over it); ``imported`` is set after the first complete import pass and
  ``missing_shards()`` names the shards still missing (for readiness and logs).
* **Pool import.** Groups are aggregated across shards (``sync_plan.aggregate``). A group that no
  NstanceMachinePool has as ``spec.group`` gets a Cluster API MachinePool (replicas = the sum of the
  shards' sizes) and then an NstanceMachinePool named after the group, both only if missing (409 is
  success). The MachinePool is created first, so the pool controller never sees a pool whose replicas
  are not yet set. Existing pools are never resized or edited here: after the import Kubernetes is the
  source of truth. Pools are created only while every configured shard is synced (the all-shards
  safety check), so a shard that is down or newly added never yields a pool with a wrong count.
* **Watch.** Per shard a WatchGroups stream (``streams.keep_stream``; every (re)connect starts with a
  full ListGroups of that shard) updates the cache ``shard → group → GroupState``; each change marks
  the state dirty and one writer brings NstanceShardGroup status (replicas, sorted providerIDs,
  isStatic, ShardReachable) in line, skipping objects that are already current. A pass reads the
  shard groups and pools through ``ctx.kube``, which in the operator answers from its read cache
  (``kubecache``: kopf's watch events plus the operator's own writes), so a pass costs API calls only
  for what it writes. A write that loses a conflict is compared again after ``CONFLICT_RETRY``.
  A lost stream sets ShardReachable=False (reason StreamLost) on the shard's shard groups and
  records a ShardUnreachable Event. Every ``timings.resync`` seconds each synced shard is listed
  again (safety net).
* **Errors.** Per shard a WatchErrors stream: each error becomes a Warning Event (reason
  ProviderError) on the NstanceMachine whose ``status.instanceID`` it names, else on the
  NstanceShardGroup ``{group}--{shard}``, else on the NstanceCluster. Repeats of the same error on the
  same object within ``ERROR_EVENT_WINDOW`` (numbers in the text ignored) are recorded once.
* Shards added to or removed from the config start or stop their streams without a restart.

Events are diagnostics, not state, and are recorded before the import too. This module must not
change MachinePool replicas or any spec of an existing object, and must not raise for shard or API
trouble: ``run`` ends only when cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from typing import Final

from google.protobuf.empty_pb2 import Empty

from nstance.operator.context import RPC_TIMEOUT, OperatorContext
from nstance.operator.crds.models import InvalidResource
from nstance.operator.crds.names import shard_group_name
from nstance.operator.drain_machines import MachineIndex, machine_index_for
from nstance.operator.kube import KubeError, Object, Resource
from nstance.operator.streams import ShardStreams, describe_rpc_error
from nstance.operator.sync_kinds import (
    CAPI_MACHINE_POOLS,
    NSTANCE_CLUSTERS,
    NSTANCE_MACHINE_POOLS,
    NSTANCE_SHARD_GROUPS,
)
from nstance.operator.sync_plan import (
    AggregatedGroup,
    GroupState,
    ShardObservation,
    aggregate,
    capi_machine_pool,
    existing_pool_groups,
    name_problem,
    nstance_machine_pool,
    pools_to_create,
    shard_group_status_patch,
)
from nstance.rpc import operator_pb2

log = logging.getLogger(__name__)

ERROR_EVENT_WINDOW: Final = 60.0
"""Seconds during which the same error on the same object is recorded as an Event only once.
Errors that differ only in numbers (retry delays, counters) count as the same error."""
_DIGITS: Final = re.compile(r"[0-9]+")
CONFLICT_RETRY: Final = 0.2
"""Seconds before a pass that lost a write conflict compares again (the winner's watch event is
usually in the read cache by then; an immediate pass would only conflict again)."""

REASON_PROVIDER_ERROR: Final = "ProviderError"
REASON_SHARD_UNREACHABLE: Final = "ShardUnreachable"
REASON_SHARD_RECONNECTED: Final = "ShardReconnected"
REASON_GROUP_IMPORTED: Final = "GroupImported"
REASON_GROUP_NOT_IMPORTED: Final = "GroupNotImported"


def group_state(group: operator_pb2.GroupStatus) -> GroupState:
    """The wire ``GroupStatus`` as the sync manager keeps it."""
    return GroupState(
        key=group.key,
        size=group.size,
        actual_size=group.actual_size,
        provider_ids=tuple(sorted(group.provider_ids)),
        is_static=group.is_static,
        template=group.template,
        instance_type=group.instance_type,
        subnet_pool=group.subnet_pool,
        vars=dict(group.vars),
    )


class SyncManager:
    """Server → Kubernetes sync for one operator; see the module docstring. ``run`` until cancelled."""

    def __init__(self, ctx: OperatorContext, *, machines: MachineIndex | None = None) -> None:
        self._ctx = ctx
        self._streams = ShardStreams(ctx)
        self._backoff = self._streams.backoff
        self._machines, self._own_machines = machine_index_for(ctx, machines)
        self.imported = asyncio.Event()
        """Set once every configured shard was listed and the first import pass completed."""
        self._cache: dict[str, dict[str, GroupState]] = {}
        self._fresh: set[str] = set()
        self._lost: dict[str, str] = {}
        self._events_seen: dict[str, int] = {}
        self._dirty = asyncio.Event()
        self._reported: set[str] = set()
        self._recent_errors: dict[tuple[str, str], float] = {}
        self._cluster: Object | None = None
        self._waiting_logged: tuple[str, ...] | None = None
        self.passes = 0
        """Completed write passes (each compares every shard group and pool with the cache)."""

    # --- what others read --------------------------------------------------------------------------

    def missing_shards(self) -> list[str]:
        """Configured shards whose groups are not currently known (never listed, or stream lost)."""
        return [shard for shard in self._ctx.shards.configured() if shard not in self._fresh]

    def groups(self, shard: str) -> Mapping[str, GroupState]:
        """The cached groups of ``shard`` (empty when unknown)."""
        return dict(self._cache.get(shard) or {})

    # --- the loops ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Import, watch and resync until cancelled; never raises for shard or API trouble."""
        streams = self._streams
        async with asyncio.TaskGroup() as tasks:
            if self._own_machines:
                tasks.create_task(self._machines.run(), name="sync:machine-index")
            tasks.create_task(
                streams.follow(self._watch_groups, name="WatchGroups", on_removed=self._shard_removed),
                name="sync:groups",
            )
            tasks.create_task(streams.follow(self._watch_errors, name="WatchErrors"), name="sync:errors")
            tasks.create_task(self._resync_loop(), name="sync:resync")
            tasks.create_task(self._write_loop(), name="sync:writer")

    async def _watch_groups(self, shard: str) -> None:
        await self._streams.keep(
            shard,
            name="WatchGroups",
            open_call=lambda stub: stub.WatchGroups(Empty()),
            on_message=self._group_event,
            on_lost=self._group_stream_lost,
            before_open=self._full_sync,
        )

    async def _watch_errors(self, shard: str) -> None:
        await self._streams.keep(
            shard,
            name="WatchErrors",
            open_call=lambda stub: stub.WatchErrors(Empty()),
            on_message=self._error_event,
        )

    async def _list_groups(self, shard: str) -> dict[str, GroupState]:
        shards = self._ctx.shards
        try:
            response: operator_pb2.ListGroupsResponse = await shards.stub(shard).ListGroups(
                Empty(), timeout=RPC_TIMEOUT
            )
        except Exception as exc:
            shards.report(shard, False, f"ListGroups: {describe_rpc_error(exc)}")
            raise
        shards.report(shard, True)
        return {group.key: group_state(group) for group in response.groups}

    async def _full_sync(self, shard: str) -> None:
        """Before each (re)connect of a shard's group stream: replace its cache with a full list."""
        self._cache[shard] = await self._list_groups(shard)
        self._fresh.add(shard)
        error = self._lost.pop(shard, None)
        log.info("shard %s: listed %d groups", shard, len(self._cache[shard]))
        self._dirty.set()
        if error is not None:
            await self._shard_events(
                shard, REASON_SHARD_RECONNECTED, f"shard {shard} is reachable again", warning=False
            )

    async def _group_event(self, shard: str, event: operator_pb2.GroupEvent) -> None:
        self._events_seen[shard] = self._events_seen.get(shard, 0) + 1
        cache = self._cache.setdefault(shard, {})
        key = event.group.key
        if not key:
            log.warning("shard %s: a group event without a group key; ignored", shard)
            return
        if event.type == operator_pb2.GroupEvent.TYPE_UPSERT:
            cache[key] = group_state(event.group)
        elif event.type == operator_pb2.GroupEvent.TYPE_DELETE:
            cache.pop(key, None)
        else:
            log.warning("shard %s: group event of unknown type %s for %s; ignored", shard, event.type, key)
            return
        self._dirty.set()

    async def _group_stream_lost(self, shard: str, error: str) -> None:
        self._fresh.discard(shard)
        first = shard not in self._lost
        self._lost[shard] = error
        self._dirty.set()
        if first:
            await self._shard_events(
                shard,
                REASON_SHARD_UNREACHABLE,
                f"lost the connection to shard {shard}: {error}",
                warning=True,
            )

    async def _shard_removed(self, shard: str) -> None:
        self._cache.pop(shard, None)
        self._fresh.discard(shard)
        self._lost.pop(shard, None)
        self._dirty.set()

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self._ctx.timings.resync)
            shards = [shard for shard in self._ctx.shards.configured() if shard in self._fresh]
            await asyncio.gather(*(self._resync(shard) for shard in shards))
            self._dirty.set()

    async def _resync(self, shard: str) -> None:
        seen = self._events_seen.get(shard, 0)
        try:
            groups = await self._list_groups(shard)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the stream notices a dead shard; the next resync retries
            log.warning("shard %s: periodic ListGroups failed: %s", shard, describe_rpc_error(exc))
            return
        # A stream event that arrived while the list was on its way is newer than the list: keep it.
        if shard in self._fresh and self._events_seen.get(shard, 0) == seen:
            self._cache[shard] = groups

    async def _write_loop(self) -> None:
        attempt = 0
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self._write_pass()
                self.passes += 1
                attempt = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - API trouble: retry the whole pass after a pause
                delay = self._backoff.delay(attempt)
                attempt += 1
                log.warning("sync: writing to Kubernetes failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                self._dirty.set()

    # --- writing -----------------------------------------------------------------------------------

    async def _write_pass(self) -> None:
        configured = list(self._ctx.shards.configured())
        missing = tuple(shard for shard in configured if shard not in self._fresh)
        if not self.imported.is_set() and (missing or not configured):
            if missing != self._waiting_logged:
                self._waiting_logged = missing
                log.warning(
                    "sync: waiting for ListGroups of shard(s) %s before writing anything to Kubernetes",
                    ", ".join(missing) or "(none configured)",
                )
            return
        await self._update_shard_groups(configured)
        if missing or not configured:
            return
        await self._import_pools(configured)
        if not self.imported.is_set():
            log.info("sync: initial import done (shards %s)", ", ".join(configured))
            self.imported.set()

    async def _update_shard_groups(self, configured: list[str]) -> None:
        ns = self._ctx.namespace
        now = self._ctx.clock.now()
        for obj in await self._ctx.kube.list_view(NSTANCE_SHARD_GROUPS, ns):
            meta = obj.get("metadata") or {}
            spec = obj.get("spec") or {}
            group, shard = spec.get("group"), spec.get("shard")
            if not isinstance(group, str) or shard not in configured or meta.get("deletionTimestamp"):
                continue
            if shard in self._fresh:
                observed = ShardObservation(True, (self._cache.get(shard) or {}).get(group))
            elif shard in self._lost:
                observed = ShardObservation(False, error=self._lost[shard])
            else:
                continue
            patch = shard_group_status_patch(obj, observed, shard=shard, now=now)
            if patch is None:
                continue
            try:
                await self._ctx.kube.patch(NSTANCE_SHARD_GROUPS, str(meta["name"]), patch, ns, status=True)
            except KubeError as exc:
                if exc.status == 404:
                    continue
                if exc.status == 409:
                    # Someone else wrote it meanwhile: compare again once their write has been seen.
                    asyncio.get_running_loop().call_later(CONFLICT_RETRY, self._dirty.set)
                    continue
                if exc.status >= 500 or exc.status == 0:
                    raise
                log.warning("sync: cannot update the status of NstanceShardGroup %s: %s", meta["name"], exc)

    async def _import_pools(self, configured: list[str]) -> None:
        ns = self._ctx.namespace
        pools = await self._ctx.kube.list_view(NSTANCE_MACHINE_POOLS, ns)
        existing = existing_pool_groups(pools)
        if all(key in existing for shard in configured for key in self._cache.get(shard) or {}):
            return  # every group has its pool (nearly every pass): nothing to aggregate
        groups = aggregate(self._cache, configured)
        for group in pools_to_create(groups, existing):
            await self._import_pool(group)

    async def _import_pool(self, group: AggregatedGroup) -> None:
        ns, cluster_name = self._ctx.namespace, self._ctx.capi_cluster_name
        problem = name_problem(group.key)
        pool: Object | None = None
        if problem is None:
            try:
                pool = nstance_machine_pool(group, namespace=ns, cluster_name=cluster_name)
            except InvalidResource as exc:
                problem = f"group {group.key!r} cannot be imported: {exc}"
        if problem is not None or pool is None:
            await self._report_once(group.key, f"{problem}; no NstanceMachinePool was created for it")
            return
        for conflict in group.conflicts:
            log.warning("sync: group %s differs between shards: %s (kept the first)", group.key, conflict)
        machine_pool = capi_machine_pool(group, namespace=ns, cluster_name=cluster_name)
        if not await self._create(CAPI_MACHINE_POOLS, machine_pool, group.key):
            return
        if not await self._create(NSTANCE_MACHINE_POOLS, pool, group.key):
            return
        message = (
            f"imported group {group.key} from shard(s) {', '.join(group.shards)}: "
            f"MachinePool {group.key} with {group.replicas} replicas"
        )
        log.info("sync: %s", message)
        cluster = await self._cluster_object()
        if cluster is not None:
            await self._ctx.kube.event(cluster, reason=REASON_GROUP_IMPORTED, message=message)

    async def _create(self, res: Resource, body: Object, key: str) -> bool:
        """Create ``body`` if missing: True when it exists afterwards (409 counts), False when refused."""
        try:
            await self._ctx.kube.create(res, body, self._ctx.namespace)
        except KubeError as exc:
            if exc.status == 409:
                return True
            if exc.status >= 500 or exc.status in (0, 429):
                raise
            await self._report_once(
                key, f"the API server refused to create {res.kind} {body['metadata']['name']}: {exc}"
            )
            return False
        return True

    async def _report_once(self, key: str, message: str) -> None:
        """A warning (log and an Event on the NstanceCluster) about a group that cannot be imported."""
        if key in self._reported:
            return
        self._reported.add(key)
        log.warning("sync: %s", message)
        cluster = await self._cluster_object()
        if cluster is not None:
            await self._ctx.kube.event(
                cluster, reason=REASON_GROUP_NOT_IMPORTED, message=message, warning=True
            )

    async def _cluster_object(self) -> Object | None:
        if self._cluster is None:
            try:
                self._cluster = await self._ctx.kube.get(
                    NSTANCE_CLUSTERS, self._ctx.capi_cluster_name, self._ctx.namespace
                )
            except KubeError as exc:
                log.warning("sync: cannot read NstanceCluster %s: %s", self._ctx.capi_cluster_name, exc)
        return self._cluster

    async def _shard_events(self, shard: str, reason: str, message: str, *, warning: bool) -> None:
        """An Event on every NstanceShardGroup of ``shard`` (on the NstanceCluster when there is none)."""
        try:
            targets = [
                obj
                for obj in await self._ctx.kube.list_view(NSTANCE_SHARD_GROUPS, self._ctx.namespace)
                if (obj.get("spec") or {}).get("shard") == shard
            ]
            if not targets:
                cluster = await self._cluster_object()
                targets = [cluster] if cluster is not None else []
            for target in targets:
                await self._ctx.kube.event(target, reason=reason, message=message, warning=warning)
        except KubeError as exc:
            log.warning("shard %s: cannot record the %s event: %s", shard, reason, exc)

    # --- errors ------------------------------------------------------------------------------------

    async def _error_event(self, shard: str, event: operator_pb2.ErrorEvent) -> None:
        target = await self._error_target(shard, event.group, event.instance_id)
        where = f"shard {shard}"
        if event.group:
            where += f", group {event.group}"
        if event.instance_id:
            where += f", instance {event.instance_id}"
        message = f"{where}: {event.error or 'unknown error'}"
        if target is None:
            log.warning("sync: provider error with nowhere to record it: %s", message)
            return
        uid = str((target.get("metadata") or {}).get("uid") or "")
        if not self._first_in_window((uid, _DIGITS.sub("#", message))):
            return
        await self._ctx.kube.event(target, reason=REASON_PROVIDER_ERROR, message=message, warning=True)

    async def _error_target(self, shard: str, group: str, instance_id: str) -> Object | None:
        if instance_id:
            machine = self._machines.find(instance_id)
            if machine is not None:
                return machine
        if group:
            try:
                found = await self._ctx.kube.get(
                    NSTANCE_SHARD_GROUPS, shard_group_name(group, shard), self._ctx.namespace
                )
            except KubeError as exc:
                log.warning("sync: cannot read NstanceShardGroup %s: %s", shard_group_name(group, shard), exc)
                found = None
            if found is not None:
                return found
        return await self._cluster_object()

    def _first_in_window(self, key: tuple[str, str]) -> bool:
        now = self._ctx.clock.monotonic()
        for old in [k for k, at in self._recent_errors.items() if now - at >= ERROR_EVENT_WINDOW]:
            del self._recent_errors[old]
        if key in self._recent_errors:
            return False
        self._recent_errors[key] = now
        return True
