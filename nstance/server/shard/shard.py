"""One shard's control plane: the Operator API operations and what runs while this server leads.

``Shard`` implements ``ShardAPI`` for the gRPC servicer (reads work on every server; changes are
refused by the servicer on standbys) and owns the leader-only machinery: on acquiring leadership it
starts moving the leader address here (``leadernet``), rebuilds the cache from the records, syncs
with the provider, resolves the config's images (``images``), then starts the reconciler, the GC loop
and the image refresh, all as tasks of one ``LeaderTerm``. On losing leadership every one of those
tasks (recovery included) is cancelled at once; at an orderly shutdown while still leading, in-flight
provider calls - each of which records its own outcome - get ``shard.shutdown_timeout`` to finish.
Either way it then releases the leader address. Leadership starts a new frame of the shard's
``LeaderClock`` (``leadertime``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from nstance.config import (
    GroupUpdate,
    MergedGroupConfig,
    apply_delete,
    apply_upsert,
    group_etag,
    merged_group,
)
from nstance.config.limits import check_vars
from nstance.config.workloads import DynamicGroupConfig
from nstance.core.backoff import Backoff
from nstance.core.errors import FailedPrecondition, InvalidArgument, NotFound, NstanceError, Unavailable
from nstance.core.ids import GroupKey
from nstance.db import repo
from nstance.db.quarantine import is_corruption
from nstance.db.rows import InstanceRow
from nstance.objectstore.base import ObjectNotFound
from nstance.pki.certs import issue_client_certificate
from nstance.pki.operator_record import operator_record, operator_record_key
from nstance.providers.features import instance_type_check
from nstance.server.agents.hub import AgentHub
from nstance.server.leadership.leadernet import LeaderAddress
from nstance.server.leadership.leaderterm import LeaderTerm
from nstance.server.reconcile.cacherepair import CacheRepair
from nstance.server.reconcile.gc import gc_cycle
from nstance.server.reconcile.images import ImageService
from nstance.server.reconcile.instances import InstanceOps
from nstance.server.reconcile.members import status_of
from nstance.server.reconcile.reconciler import Reconciler
from nstance.server.reconcile.recovery import rebuild_cache, sync_provider
from nstance.server.shard.api import (
    ConfigStatusView,
    GroupView,
    InstanceRequest,
    InstanceView,
    IssuedCert,
    RefreshResult,
)
from nstance.server.state.confighealth import report_config
from nstance.server.state.configstate import ConfigChange, ConfigSnapshot
from nstance.server.state.context import ShardContext
from nstance.server.state.events import Events, GroupEventData
from nstance.server.state.groupwriter import GroupsWriter

log = logging.getLogger(__name__)

#: Seconds between refreshes of the per-group instance gauges.
METRICS_INTERVAL = 5.0
#: Lifetime of a renewed operator certificate (a year, as registration issues by default).
OPERATOR_CERT_TTL = timedelta(hours=8760)
#: Seconds between the leader's checks of the config documents' ETags (two HEAD requests each).
CONFIG_CHECK_INTERVAL = 30.0


class Shard:
    """The shard server's state and behaviour behind the Operator API."""

    def __init__(
        self,
        ctx: ShardContext,
        *,
        resync_interval: float = 60.0,
    ) -> None:
        self.ctx = ctx
        self.events: Events = ctx.events
        self.ops = InstanceOps(ctx)
        self.agents = AgentHub(
            ctx, db_writer=self.ops.db_writer, secrets=ctx.secrets, lbs=self.ops.lbs, signals=self
        )
        self._resync_interval = resync_interval
        self.images = ImageService(ctx)
        self.leader_net = LeaderAddress(ctx)
        #: This server's edits of groups.jsonc: concurrent UpsertGroup/DeleteGroup calls share writes.
        self._groups = GroupsWriter(ctx.store, ctx.config, self._apply_change, fault_point=ctx.fault_point)
        self.reconciler: Reconciler | None = None
        self._leader_tasks: list[asyncio.Task[None]] = []
        #: Every task of the current leadership (recovery included): cancelled together when it is lost.
        self._term = LeaderTerm()
        self._address_task: asyncio.Task[None] | None = None
        self._lead_lock = asyncio.Lock()
        self.leading = False
        self.cache_repair = CacheRepair(
            ctx, stop_leading=self.stop_leading, start_leading=self.start_leading, set_hold=self.ops.set_hold
        )
        with contextlib.suppress(RuntimeError):  # no running loop: attached when leadership starts
            self.cache_repair.attach()
        #: On-demand creates under way by instance id: ((tenant, group), task).
        self._on_demand_creates: dict[str, tuple[GroupKey, asyncio.Future[tuple[str, str]]]] = {}

    # --- leadership -------------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.ctx.is_leader()

    def health_deadline(self, key: GroupKey) -> None:
        """Reconcile ``key`` when an agent that just registered could first count as silent."""
        if self.reconciler is not None:
            self.reconciler.check_health_after(key)

    def agent_registered(self, tenant: str, group: str, instance_id: str) -> None:
        """A registered agent is judged by its health reports from now on: its group is reconciled
        once its missed-reports deadline could pass (one timer per group, however many register)."""
        self.health_deadline((tenant, group))

    def group_changed(self, key: GroupKey) -> None:
        """Mark a group for reconcile now (no-op while not leading)."""
        if self.reconciler is not None:
            self.reconciler.enqueue(key)

    def leader_address(self) -> str:
        return self.ctx.leadership.leader_address()

    async def start_leading(self) -> None:
        """Recover state and start the reconciler and GC (called when leadership is acquired).

        The recovery runs as a task of the leadership term, so losing leadership cancels it at once;
        this then returns normally (a cancellation of the caller itself still propagates).
        """
        recovery = self._term.start(self._recover_and_lead(), "recovery")
        try:
            await recovery
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            log.info("leadership lost during recovery")

    async def _recover_and_lead(self) -> None:
        async with self._lead_lock:
            if self.leading:
                return
            ctx = self.ctx
            self.cache_repair.attach()
            ctx.leader_clock.restart()
            log.info("shard %s: leading; rebuilding the cache from object storage", ctx.identity.shard)
            if self._address_task is None or self._address_task.done():
                self._address_task = self._term.start(self.leader_net.hold(), "leader-network")
            backoff = Backoff(base=1.0, cap=30.0)
            attempt = 0
            while True:
                if not ctx.is_leader():
                    log.info("leadership lost during recovery")
                    await self._release_address()
                    return
                try:
                    # Fresh from storage or not at all: a stale copy may miss acknowledged group changes.
                    try:
                        await asyncio.to_thread(
                            functools.partial(ctx.config.load, True, require_storage=True)
                        )
                    finally:
                        report_config(ctx, ctx.config.fault)
                    groups = await rebuild_cache(ctx, self.ops)
                    report = await sync_provider(ctx, self.ops)
                    groups |= report.groups
                    await self.images.refresh()  # creates need Image.<name> before the first reconcile
                    break
                except Exception as exc:
                    if not isinstance(exc, (NstanceError, OSError)) and not is_corruption(exc):
                        raise
                    if is_corruption(exc):  # a damaged cache cannot be rebuilt in place: start a new one
                        await asyncio.to_thread(ctx.db.replace_corrupt_file)
                    delay = backoff.delay(attempt)
                    attempt += 1
                    log.error("recovery failed: %s; retrying in %.1fs", exc, delay)
                    await asyncio.sleep(delay)
            reconciler = Reconciler(ctx, self.ops, resync_interval=self._resync_interval)
            self.reconciler = reconciler
            self.leading = True
            ctx.metrics.set_leader("shard", True)
            self._leader_tasks = [
                self._term.start(reconciler.run(), "reconciler"),
                self._term.start(self._gc_loop(reconciler), "gc"),
                self._term.start(self._metrics_loop(), "metrics"),
                self._term.start(self._config_loop(), "config"),
                self._term.start(self.images.run(), "images"),
            ]
            await reconciler.enqueue_all()
            for key in groups:
                reconciler.enqueue(key)

    async def stop_leading(self, grace: float | None = None) -> None:
        """Stop reconciling and GC.

        Leadership lost: every task of the term (recovery included) is cancelled at once. Still leading
        (an orderly shutdown): in-flight steps get ``grace`` seconds to finish, then are cancelled.
        """
        lost = not self.ctx.is_leader()
        if lost or not self.leading:
            self._term.cancel()  # before taking the lock, which a running recovery holds
        async with self._lead_lock:
            if not self.leading:
                await self._release_address()
                return
            self.leading = False
            self.ctx.metrics.set_leader("shard", False)
            timeout = grace
            if timeout is None:
                snapshot = self.ctx.config.snapshot()
                timeout = snapshot.config.shard.shutdown_timeout.total_seconds() if snapshot else 10.0
            if lost:
                timeout = 0.0
            if self.reconciler is not None:
                await self.reconciler.close()
            tasks, self._leader_tasks = self._leader_tasks, []
            for task in tasks:
                if lost or task.get_name() in ("gc", "metrics", "images", "config"):
                    task.cancel()
            _done, pending = await asyncio.wait(tasks, timeout=max(timeout, 0.01))
            for task in pending:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if pending:
                log.warning("%d in-flight tasks were cancelled after %.1fs", len(pending), timeout)
            try:
                await asyncio.wait_for(self.ops.followups.flush(), timeout=max(timeout, 0.01))
            except TimeoutError:
                log.warning(
                    "%d instance records not finished within %.1fs; the next leader adopts those VMs by tag",
                    self.ops.followups.pending,
                    timeout,
                )
            self.reconciler = None
            await self.ops.lbs.close()
            await self._release_address()
            log.info("shard %s: no longer leading", self.ctx.identity.shard)

    async def _release_address(self) -> None:
        task, self._address_task = self._address_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.leader_net.release()

    async def _gc_loop(self, reconciler: Reconciler) -> None:
        while True:
            snapshot = self.ctx.config.snapshot()
            interval = snapshot.config.shard.garbage_collection.interval.total_seconds() if snapshot else 60.0
            if interval <= 0:
                return
            await asyncio.sleep(interval)
            try:
                report = await gc_cycle(self.ctx, self.ops)
            except NstanceError as exc:
                log.warning("gc cycle failed: %s", exc)
                continue
            except Exception:
                log.exception("gc cycle failed unexpectedly; the next cycle runs as usual")
                continue
            for key in report.groups:
                reconciler.enqueue(key)

    async def _config_loop(self) -> None:
        """Pick up config.jsonc and groups.jsonc changes nobody told this leader about.

        RefreshConfig and this server's own group edits apply at once; this covers the rest: an
        upload without a refresh, or a groups.jsonc write whose answer was lost (it may have landed
        although the call failed). Unchanged ETags cost two HEAD requests and nothing else.
        """
        while True:
            await asyncio.sleep(CONFIG_CHECK_INTERVAL)
            try:
                change = await asyncio.to_thread(self.ctx.config.load)
            except NstanceError as exc:
                log.warning("config check failed (keeping the current config): %s", exc)
                continue
            finally:
                report_config(self.ctx, self.ctx.config.fault)
            if change.updated:
                log.info("config changed in object storage; applying it")
                self._apply_change(change)

    async def standby_config_loop(self) -> None:
        """On a standby, check the config documents as the leader does, to report a broken one.

        The standby's view follows storage (its reads stay current), and ``/health``, the metrics and
        ``WatchErrors`` say when the stored config is broken, empty or gone. While leading, the
        leader's own check (``_config_loop``) does this instead.
        """
        while True:
            await asyncio.sleep(CONFIG_CHECK_INTERVAL)
            if self.leading:
                continue
            try:
                await asyncio.to_thread(self.ctx.config.load)
            except NstanceError as exc:
                log.warning("config check failed (keeping the current config): %s", exc)
            finally:
                report_config(self.ctx, self.ctx.config.fault)

    async def _metrics_loop(self) -> None:
        while True:
            await asyncio.to_thread(self._update_instance_metrics)  # an aggregate over every row
            await asyncio.sleep(METRICS_INTERVAL)

    def _update_instance_metrics(self) -> None:
        with self.ctx.db.read_connection() as session:
            counts = repo.count_instances(session)
        self.ctx.metrics.set_instances(counts)

    def _enqueue(self, keys: Iterable[GroupKey]) -> None:
        if self.reconciler is not None:
            for key in keys:
                self.reconciler.enqueue(key)

    def on_instance_changed(self, tenant: str, group: str) -> None:
        """Something about an instance of this group changed (health, drain ack): reconcile it."""
        self._enqueue([(tenant, group)])

    # --- reads ------------------------------------------------------------------------------

    def _snapshot(self) -> ConfigSnapshot:
        snapshot = self.ctx.config.snapshot()
        if snapshot is None:
            raise Unavailable("the shard config is not loaded yet; see the server's health endpoint")
        return snapshot

    def _view(self, merged: MergedGroupConfig, rows: list[InstanceRow] | None = None) -> GroupView:
        """The group's view; ``rows`` are its active managed instances (read here when not given)."""
        if rows is None:
            with self.ctx.db.read_connection() as session:
                rows = repo.list_active_instances(
                    session, tenant=merged.tenant, group_key=merged.group, managed_only=True
                )
        serving = [r for r in rows if r.drain_started_at is None and r.record_state != "failed"]
        etag = group_etag(
            merged.group,
            merged.tenant,
            merged.template,
            merged.size,
            merged.instance_type,
            merged.subnet_pool,
            merged.vars,
            merged.is_static,
        )
        return GroupView(
            key=merged.group,
            tenant=merged.tenant,
            template=merged.template,
            size=merged.size,
            instance_type=merged.instance_type,
            subnet_pool=merged.subnet_pool,
            vars=dict(merged.vars),
            is_static=merged.is_static,
            etag=etag,
            actual_size=len(serving),
            provider_ids=sorted(r.provider_id for r in serving if r.provider_id),
        )

    def list_groups(self, tenant: str) -> list[GroupView]:
        """Every group of ``tenant`` with its instances: one query for the tenant, not one per group.

        Blocking (a query over every instance of the tenant): the servicer runs it in a thread.
        """
        snapshot = self._snapshot()
        with self.ctx.db.read_connection() as session:
            rows = repo.list_active_instances(session, tenant=tenant, managed_only=True)
        by_group: dict[str, list[InstanceRow]] = {}
        for row in rows:
            by_group.setdefault(row.group_key, []).append(row)
        views = []
        for t, group in snapshot.group_keys():
            if t != tenant:
                continue
            merged = snapshot.merged(t, group)
            if merged is not None:
                views.append(self._view(merged, by_group.get(group, [])))
        return views

    def find_group(self, tenant: str, group: str) -> GroupView | None:
        """The view of one group, or None when it does not exist (one query, not one per group)."""
        merged = self._snapshot().merged(tenant, group)
        return self._view(merged) if merged is not None else None

    def _group_view(self, tenant: str, group: str) -> GroupView:
        merged = self._snapshot().merged(tenant, group)
        if merged is None:
            raise NotFound(f'group "{group}" of tenant "{tenant}" does not exist')
        return self._view(merged)

    async def instance_status(self, tenant: str, instance_id: str) -> InstanceView:
        with self.ctx.db.read_connection() as session:
            row = repo.get_instance(session, instance_id)
        if row is None or row.tenant != tenant:
            raise NotFound(f"instance {instance_id!r} does not exist in this shard")
        return _instance_view(row)

    async def list_instances(self, tenant: str, group: str = "") -> list[InstanceView]:
        def read() -> list[InstanceView]:
            with self.ctx.db.read_connection() as conn:
                rows = repo.list_active_instances(conn, tenant=tenant, group_key=group or None)
            return [_instance_view(row) for row in rows]

        return await asyncio.to_thread(read)  # a shard may hold 100,000 rows: not on the loop

    def draining_instances(self, tenant: str) -> list[tuple[InstanceView, str, datetime | None]]:
        out: list[tuple[InstanceView, str, datetime | None]] = []
        with self.ctx.db.read_connection() as session:
            rows = repo.list_active_instances(session, tenant=tenant)
        for row in rows:
            if row.drain_started_at is None or row.drain_acked_at is not None:
                continue
            view = InstanceView(
                instance_id=row.id,
                tenant=row.tenant,
                group=row.group_key,
                status="pending_deletion",
                created_at=row.created_at,
                last_seen=row.health_at,
                provider_id=row.provider_id or "",
            )
            out.append((view, row.drain_reason or "", row.delete_at))
        return out

    def config_status(self) -> ConfigStatusView:
        snapshot = self._snapshot()
        return ConfigStatusView(
            etag=snapshot.config_etag,
            last_modified=snapshot.config_last_modified,
            size=snapshot.config_size,
        )

    # --- changes ----------------------------------------------------------------------------

    def _apply_change(self, change: ConfigChange) -> None:
        self.images.kick()
        for tenant, group in sorted(change.changed):
            self.events.groups.publish(GroupEventData(kind="upsert", tenant=tenant, group=group))
        for tenant, group in sorted(change.removed):
            self.events.groups.publish(GroupEventData(kind="delete", tenant=tenant, group=group))
        self._enqueue(change.changed | change.removed)

    async def _check_instance_type(self, instance_type: str, template: str, where: str) -> None:
        """Refuse an instance type that does not run the template's arch (when the provider can tell)."""
        checker = instance_type_check(self.ctx.provider)
        config = self._snapshot().config.templates.get(template)
        if checker is None or config is None or not instance_type:
            return
        await checker.check_instance_type(instance_type, config.arch, template=template, where=where)

    async def upsert_group(self, tenant: str, group: str, update: GroupUpdate) -> GroupView:
        snapshot = self._snapshot()
        config = snapshot.config
        if update.instance_type or update.template:
            current = snapshot.merged(tenant, group)
            template = update.template or (current.template if current is not None else "")
            template_config = config.templates.get(template)
            instance_type = update.instance_type or (
                current.instance_type
                if current is not None and not update.template
                else (template_config.instance_type if template_config is not None else "")
            )
            await self._check_instance_type(
                instance_type or "", template, f"groups.{tenant}.{group}.instance_type"
            )
        await self._groups.submit(
            lambda current: apply_upsert(config, current, tenant, group, update), (tenant, group)
        )
        # A query: in a thread, so a burst of upserts answered together does not hold the loop.
        return await asyncio.to_thread(self._group_view, tenant, group)

    async def delete_group(self, tenant: str, group: str) -> None:
        snapshot = self._snapshot()
        if snapshot.merged(tenant, group) is None:
            raise NotFound(f'group "{group}" of tenant "{tenant}" does not exist')
        if group in snapshot.config.groups.get(tenant, {}) and group not in snapshot.dynamic.get(tenant, {}):
            raise FailedPrecondition(
                f'group "{group}" is static (defined in config.jsonc); remove it there, or scale it to 0'
            )
        await self._groups.submit(lambda current: apply_delete(current, tenant, group), (tenant, group))

    def _on_demand_config(self, tenant: str, request: InstanceRequest) -> MergedGroupConfig:
        snapshot = self._snapshot()
        check_vars("CreateInstance", request.vars, snapshot.config.shard.limits)
        merged = snapshot.merged(tenant, request.group)
        if merged is None:
            raise NotFound(f'group "{request.group}" of tenant "{tenant}" does not exist')
        if request.template and request.template != merged.template:
            if request.template not in snapshot.config.templates:
                raise InvalidArgument(f'template "{request.template}" is not defined in the server config')
            entry = DynamicGroupConfig(
                template=request.template,
                size=0,
                instance_type=request.instance_type or None,
                subnet_pool=request.subnet_pool or merged.subnet_pool,
                vars={**merged.vars, **request.vars},
            )
            config = snapshot.config.model_copy(update={"groups": {}})
            merged = merged_group(config, {tenant: {request.group: entry}}, tenant, request.group)
            return dataclasses.replace(merged, is_static=False)
        if request.subnet_pool and request.subnet_pool not in snapshot.config.shard.subnet_pools:
            raise InvalidArgument(f'subnet pool "{request.subnet_pool}" is not defined in shard.subnet_pools')
        return dataclasses.replace(
            merged,
            instance_type=request.instance_type or merged.instance_type,
            subnet_pool=request.subnet_pool or merged.subnet_pool,
            vars={**merged.vars, **request.vars},
        )

    async def create_instance(self, tenant: str, request: InstanceRequest) -> tuple[str, str]:
        iid = request.instance_id
        if not iid:
            return await self._create_on_demand(tenant, request)
        owner = (tenant, request.group)
        running = self._on_demand_creates.get(iid)
        if running is None:
            with self.ctx.db.read_connection() as session:
                existing = repo.get_instance(session, iid)
            if existing is not None:
                if (existing.tenant, existing.group_key) != owner:
                    raise FailedPrecondition(f"instance_id {iid!r} is already used by another instance")
                return existing.id, status_of(existing)
            # Concurrent calls with this id share one create and all get its answer (docs/operator-api.md).
            task = asyncio.ensure_future(self._create_on_demand(tenant, request))
            running = self._on_demand_creates[iid] = (owner, task)
            task.add_done_callback(lambda _: self._on_demand_creates.pop(iid, None))
        if running[0] != owner:
            raise FailedPrecondition(f"instance_id {iid!r} is already used by another instance")
        return await asyncio.shield(running[1])

    async def _create_on_demand(self, tenant: str, request: InstanceRequest) -> tuple[str, str]:
        merged = self._on_demand_config(tenant, request)
        if request.instance_type:
            await self._check_instance_type(merged.instance_type, merged.template, "instance_type")
        created = await self.ops.create(merged, on_demand=True, instance_id=request.instance_id)
        return created.instance_id, created.status

    async def delete_instance(self, tenant: str, instance_id: str) -> str:
        with self.ctx.db.read_connection() as session:
            row = repo.get_instance(session, instance_id)
        if row is None or row.tenant != tenant:
            return "unknown"
        if row.deleted_at is not None:
            return "deleted"
        deleted = await self.ops.delete_or_hold(row, "operator-request")
        self.on_instance_changed(row.tenant, row.group_key)
        return "deleted" if deleted else "deleting"

    async def acknowledge_drained(self, tenant: str, instance_id: str) -> None:
        with self.ctx.db.write_connection() as session:
            row = repo.get_instance(session, instance_id)
            if row is None or row.tenant != tenant:
                raise NotFound(f"instance {instance_id!r} does not exist in this shard")
            if row.deleted_at is not None:
                return
            if row.drain_started_at is None:
                raise FailedPrecondition(
                    f"instance {instance_id!r} is not being drained; there is nothing to acknowledge "
                    "(use DeleteInstance to remove it)"
                )
            repo.acknowledge_drain(session, instance_id, now=self.ctx.clock.now())
        if row.on_demand:
            await self.ops.delete_or_hold(row, "drain-acknowledged")
        self.on_instance_changed(row.tenant, row.group_key)

    async def refresh_config(self) -> RefreshResult:
        try:
            change = await asyncio.to_thread(self.ctx.config.refresh)
        finally:
            report_config(self.ctx, self.ctx.config.fault)
        self._apply_change(change)
        return RefreshResult(
            updated=change.updated, prev_etag=change.prev_config_etag or "", etag=change.config_etag
        )

    async def renew_certificate(self, tenant: str, client_id: str, public_key_pem: bytes) -> IssuedCert:
        cluster = self.ctx.cluster_leadership
        if cluster is not None and not cluster.is_leader():
            addr = cluster.leader_address()
            where = f"; the cluster leader is at {addr}" if addr else ""
            raise FailedPrecondition(f"certificate renewal is done by the cluster leader{where}")
        issued = issue_client_certificate(
            self.ctx.ca,
            public_key_pem,
            client_id=client_id,
            tenant=tenant,
            role="operator",
            ttl=OPERATOR_CERT_TTL,
            clock=self.ctx.clock,
        )
        key = operator_record_key(tenant, self.ctx.identity.cluster_id)
        operator_id = client_id
        try:  # keep the id registration stored (an ``opr`` id); older records carry the CN
            raw, _ = await asyncio.to_thread(self.ctx.cluster_store.get, key)
            stored = json.loads(raw).get("operator_id")
            if isinstance(stored, str) and stored:
                operator_id = stored
        except (ObjectNotFound, ValueError, AttributeError):
            pass
        data = operator_record(
            cluster_id=self.ctx.identity.cluster_id,
            tenant=tenant,
            operator_id=operator_id,
            public_key_pem=public_key_pem.decode("ascii"),
            issued=issued,
            now=self.ctx.clock.now(),
        )
        await asyncio.to_thread(self.ctx.cluster_store.put, key, data)
        return IssuedCert(cert_pem=issued.cert_pem, expires_at=issued.not_after)


def _instance_view(row: InstanceRow) -> InstanceView:
    """What GetInstanceStatus and ListInstances report of one cache row."""
    return InstanceView(
        instance_id=row.id,
        tenant=row.tenant,
        group=row.group_key,
        status=status_of(row),
        created_at=row.created_at,
        last_seen=row.health_at or row.provider_at,
        provider_id=row.provider_id or "",
        on_demand=bool(row.on_demand),
        draining=row.drain_started_at is not None and row.drain_acked_at is None,
    )
