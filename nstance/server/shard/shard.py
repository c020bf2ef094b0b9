"""One shard's control plane: the Operator API operations, and the leader session it owns.

``Shard`` implements ``ShardAPI`` for the gRPC servicer (reads work on every server; changes are
refused by the servicer on standbys): group reads and edits, instance reads, on-demand creates,
deletes and drain acks, config refresh and operator certificate renewal. What runs only while this
server leads - recovery, the reconciler, GC, the config check, metrics, images, the leader address -
is the ``LeaderSession`` (``nstance.server.leadership.session``); ``start_leading`` and
``stop_leading`` hand over to it, and the shard's changes reach its reconciler through
``session.enqueue``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
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
from nstance.core.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from nstance.core.ids import GroupKey
from nstance.db import repo
from nstance.db.rows import InstanceRow
from nstance.objectstore.base import ObjectNotFound
from nstance.pki.certs import issue_client_certificate
from nstance.pki.operator_record import operator_record, operator_record_key
from nstance.providers.features import instance_type_check
from nstance.server.agents.hub import AgentHub
from nstance.server.leadership import session as leader_session
from nstance.server.leadership.leadernet import LeaderAddress
from nstance.server.leadership.session import LeaderSession
from nstance.server.reconcile.cacherepair import CacheRepair
from nstance.server.reconcile.images import ImageService
from nstance.server.reconcile.instances import InstanceOps
from nstance.server.reconcile.members import provider_status_of, status_of
from nstance.server.reconcile.reconciler import INLINE_READ_ROWS, Reconciler
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

#: Lifetime of a renewed operator certificate (a year, as registration issues by default).
OPERATOR_CERT_TTL = timedelta(hours=8760)


class Shard:
    """The shard server's state and behaviour behind the Operator API."""

    def __init__(
        self,
        ctx: ShardContext,
        *,
        resync_interval: float = 60.0,
        metrics_interval: float = leader_session.METRICS_INTERVAL,
    ) -> None:
        self.ctx = ctx
        self.events: Events = ctx.events
        self.ops = InstanceOps(ctx)
        self.agents = AgentHub(
            ctx, db_writer=self.ops.db_writer, secrets=ctx.secrets, lbs=self.ops.lbs, signals=self
        )
        #: What runs while this server leads (recovery, reconciler, GC, config check, metrics, images).
        self.session = LeaderSession(
            ctx,
            self.ops,
            on_config_change=self._apply_change,
            on_recovered=self.agents.revalidate,
            resync_interval=resync_interval,
            metrics_interval=metrics_interval,
        )
        #: This server's edits of groups.jsonc: concurrent UpsertGroup/DeleteGroup calls share writes.
        self._groups = GroupsWriter(
            ctx.store, ctx.config, self._apply_group_edit, fault_point=ctx.fault_point
        )
        #: On-demand creates under way by instance id: ((tenant, group), task).
        self._on_demand_creates: dict[str, tuple[GroupKey, asyncio.Future[tuple[str, str]]]] = {}

    # --- leadership -------------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.ctx.is_leader()

    def health_deadline(self, key: GroupKey) -> None:
        """Reconcile ``key`` when an agent that just registered could first count as silent."""
        self.session.health_deadline(key)

    def agent_registered(self, tenant: str, group: str, instance_id: str) -> None:
        """A registered agent is judged by its health reports from now on: its group is reconciled
        once its missed-reports deadline could pass (one timer per group, however many register)."""
        self.health_deadline((tenant, group))

    def group_changed(self, key: GroupKey) -> None:
        """Mark a group for reconcile now (no-op while not leading)."""
        self.session.enqueue([key])

    def leader_address(self) -> str:
        return self.ctx.leadership.leader_address()

    async def start_leading(self) -> None:
        """Recover state and start the leader's work (``LeaderSession.start``)."""
        await self.session.start()

    async def stop_leading(self, grace: float | None = None) -> None:
        """Stop the leader's work (``LeaderSession.stop``)."""
        await self.session.stop(grace)

    async def flush_config_copy(self) -> None:
        """Write the disk copy of the config a recent group edit left waiting (at shutdown)."""
        await self._groups.flush_now()

    async def standby_config_loop(self) -> None:
        """On a standby, check the config documents to report a broken one (``LeaderSession``)."""
        await self.session.standby_config_loop()

    @property
    def leading(self) -> bool:
        return self.session.leading

    @property
    def reconciler(self) -> Reconciler | None:
        """The current leadership's reconciler (None while not leading)."""
        return self.session.reconciler

    @property
    def images(self) -> ImageService:
        return self.session.images

    @property
    def leader_net(self) -> LeaderAddress:
        return self.session.leader_net

    @property
    def cache_repair(self) -> CacheRepair:
        return self.session.cache_repair

    def on_instance_changed(self, tenant: str, group: str) -> None:
        """Something about an instance of this group changed (health, drain ack): reconcile it."""
        self.session.enqueue([(tenant, group)])

    # --- reads ------------------------------------------------------------------------------

    def _snapshot(self) -> ConfigSnapshot:
        snapshot = self.ctx.config.snapshot()
        if snapshot is None:
            raise Unavailable("the shard config is not loaded yet; see the server's health endpoint")
        return snapshot

    def _view(self, merged: MergedGroupConfig, serving: list[str | None] | None = None) -> GroupView:
        """The group's view; ``serving`` are the provider ids of its serving managed instances (read
        here when not given; see ``repo.serving_provider_ids``)."""
        if serving is None:
            with self.ctx.db.read_connection() as conn:
                found = repo.serving_provider_ids(conn, tenant=merged.tenant, group_key=merged.group)
            serving = found.get(merged.group, [])
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
            provider_ids=sorted(pid for pid in serving if pid),
        )

    def list_groups(self, tenant: str) -> list[GroupView]:
        """Every group of ``tenant`` with its serving instances: one query for the tenant, not one per group.

        Blocking (a query over every instance of the tenant): the servicer runs it in a thread.
        """
        snapshot = self._snapshot()
        with self.ctx.db.read_connection() as conn:
            by_group = repo.serving_provider_ids(conn, tenant=tenant)
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
        if row is None:
            self._refuse_if_unreadable(instance_id)
        if row is None or row.tenant != tenant:
            raise NotFound(f"instance {instance_id!r} does not exist in this shard")
        return _instance_view(row)

    async def list_instances(
        self,
        tenant: str,
        group: str = "",
        *,
        after: tuple[datetime, str] | None = None,
        limit: int | None = None,
    ) -> list[InstanceView]:
        """A tenant's (or one group's) instances oldest first; ``after``/``limit`` read one page."""

        def read() -> list[InstanceView]:
            with self.ctx.db.read_connection() as conn:
                rows = repo.list_active_instances(
                    conn, tenant=tenant, group_key=group or None, after=after, limit=limit
                )
            return [_instance_view(row) for row in rows]

        return await asyncio.to_thread(read)  # a shard may hold 100,000 rows: not on the loop

    def draining_instances(self, tenant: str) -> list[tuple[InstanceView, str, datetime | None]]:
        out: list[tuple[InstanceView, str, datetime | None]] = []
        with self.ctx.db.read_connection() as conn:
            rows = repo.awaiting_drain_ack(conn, tenant=tenant)
        for row in rows:
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
        """A loaded or refreshed config: check the images again, then the groups' changes."""
        self.images.kick()
        self._apply_group_edit(change)

    def _apply_group_edit(self, change: ConfigChange) -> None:
        """This server's write of groups.jsonc (no image check: images are set in config.jsonc only,
        and that check ran on the loop between the edited group's reconcile steps)."""
        for tenant, group in sorted(change.changed):
            self.events.groups.publish(GroupEventData(kind="upsert", tenant=tenant, group=group))
        for tenant, group in sorted(change.removed):
            self.events.groups.publish(GroupEventData(kind="delete", tenant=tenant, group=group))
        self.session.enqueue(change.changed | change.removed)

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
        together = await self._groups.submit(
            lambda current: apply_upsert(config, current, tenant, group, update), (tenant, group)
        )
        before, after = snapshot.merged(tenant, group), self._snapshot().merged(tenant, group)
        sizes = [merged.size for merged in (before, after) if merged is not None]
        if together == 1 and max(sizes, default=0) <= INLINE_READ_ROWS:
            # One small group written alone: its rows are read on the loop in well under a millisecond.
            # A worker thread here ran at the same time as the group's reconcile and slowed the way to
            # its first create (the GIL hand-overs), by more than the read itself costs.
            return self._group_view(tenant, group)
        # In a thread, so a burst of upserts answered together (or a large group) does not hold the loop.
        return await asyncio.to_thread(self._group_view, tenant, group)

    async def delete_group(self, tenant: str, group: str) -> bool:
        """Remove the group's dynamic entry (a static group's overrides); whether there was one.

        Idempotent, as upstream's DeleteGroup: a group without a dynamic entry (unknown, already
        deleted, or static without overrides) is answered OK and nothing is written. Upstream's
        operator removes an NstanceShardGroup's finalizer only once DeleteGroup succeeds, so a
        refusal here kept a retried or already-removed group in deletion for ever.
        """
        if group not in self._snapshot().dynamic.get(tenant, {}):
            return False
        await self._groups.submit(lambda current: apply_delete(current, tenant, group), (tenant, group))
        return True

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
                return existing.id, provider_status_of(existing)
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
        if row is None:
            self._refuse_if_unreadable(instance_id)
        if row is None or row.tenant != tenant:
            return "unknown"
        if row.deleted_at is not None:
            return "deleted"
        deleted = await self.ops.delete_or_hold(row, "operator-request")
        self.on_instance_changed(row.tenant, row.group_key)
        return "deleted" if deleted else "deleting"

    def _refuse_if_unreadable(self, instance_id: str) -> None:
        """Raise Unavailable when an unreadable record may describe ``instance_id``: the instance is
        not unknown, only unreadable now (its VM is kept), and "unknown" would tell the operator that
        nothing is left to delete."""
        needle = instance_id.encode()
        for problem in self.ops.unreadable:
            if problem.instance_id == instance_id or needle in problem.raw:
                raise Unavailable(
                    f"instance {instance_id!r}: its record {problem.key} cannot be read; retry once it is "
                    "repaired"
                )

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
        provider_status=provider_status_of(row),
        created_at=row.created_at,
        last_seen=row.health_at or row.provider_at,
        provider_id=row.provider_id or "",
        on_demand=bool(row.on_demand),
        draining=row.drain_started_at is not None and row.drain_acked_at is None,
    )
