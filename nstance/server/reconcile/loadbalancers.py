"""Keeping instances registered with their group's load balancers, and the barrier before a delete.

**Registration.** An instance joins every load balancer its group names (``load_balancers``) once its
agent reports health, so a VM receives traffic only after it came up. The health-report path only
notes the instance (``on_health``, no I/O); every ``FLUSH_INTERVAL`` the noted instances are
registered per load balancer in one batch (one provider call per target group or endpoint group),
skipping any that is draining, being deleted, stopped or gone at the provider, or without a provider
id. A failed registration is sent to error watchers and retried on a report after ``RETRY_AFTER``.
Membership lives in memory, mirrored to the SQLite ``lb_instances`` table for inspection; a newly
elected leader starts with none, so each instance's next report registers it again, which every
provider treats as a no-op.

**Deregistration.** It starts when a drain starts (``start_deregistration``): the load balancer stops
sending new connections while the node drains. Before a VM is deleted, ``release`` confirms that every
load balancer of its group (and any it was registered with) reports it ``deregistered``; while one
still drains connections it returns False at once and the caller retries later (``DeregistrationPending``)
- nothing here waits or blocks a reconcile worker. A load balancer entry that is no longer in the
config cannot be asked and is skipped.

This module decides nothing about which instances exist; it only keeps load balancers in step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nstance.config import LoadBalancerConfig, MergedGroupConfig
from nstance.core.errors import NstanceError, Unavailable
from nstance.db import repo
from nstance.db.rows import InstanceRow
from nstance.providers.base import UNHEALTHY_STATUSES, InstanceStatus
from nstance.providers.features import LbTarget, TargetState, load_balancing
from nstance.server.state.context import ShardContext
from nstance.server.state.events import ErrorEventData

log = logging.getLogger(__name__)

#: Seconds between registration batches.
FLUSH_INTERVAL = 1.0
#: Seconds before a failed registration is tried again (on the instance's next health report).
RETRY_AFTER = 30.0
#: Seconds a reconcile waits before asking again whether a deregistration finished.
RECHECK_AFTER = 5.0


class DeregistrationPending(Unavailable):
    """The VM is still attached to a load balancer (connections draining); delete it later."""


def lb_target(row: InstanceRow) -> LbTarget:
    """An instance row as a load balancer target."""
    return LbTarget(instance_id=row.id, provider_id=row.provider_id or "", ip4=row.ip4 or "")


class LoadBalancerSync:
    """Registration and deregistration of one shard's instances (leader only)."""

    def __init__(self, ctx: ShardContext, *, flush_interval: float = FLUSH_INTERVAL) -> None:
        self._ctx = ctx
        self._flush_interval = flush_interval
        self._registered: set[tuple[str, str]] = set()  # (load balancer, instance id)
        self._failed_at: dict[tuple[str, str], float] = {}
        self._queued: set[str] = set()
        self._leaving: set[str] = set()
        self._waiting: set[str] = set()
        self._flush_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def enabled(self) -> bool:
        """Whether the provider can register targets at all."""
        return load_balancing(self._ctx.provider) is not None

    def registered(self, instance_id: str) -> list[str]:
        """The load balancers this leader registered ``instance_id`` with."""
        return sorted(lb for lb, iid in self._registered if iid == instance_id)

    # --- registration -------------------------------------------------------------------------

    def on_health(self, instance_id: str, merged: MergedGroupConfig) -> None:
        """An agent of ``merged``'s group reported: register it where it is not registered yet."""
        if not merged.load_balancers or instance_id in self._leaving or not self.enabled:
            return
        now = self._ctx.clock.monotonic()
        for name in merged.load_balancers:
            key = (name, instance_id)
            if key in self._registered:
                continue
            failed = self._failed_at.get(key)
            if failed is not None and now - failed < RETRY_AFTER:
                continue
            self._queued.add(instance_id)
            if self._flush_task is None or self._flush_task.done():
                self._flush_task = asyncio.get_running_loop().create_task(self._flush_later())
            return

    async def _flush_later(self) -> None:
        await asyncio.sleep(self._flush_interval)
        try:
            await self.flush()
        except NstanceError as exc:
            log.warning("load balancer registration skipped: %s", exc)

    async def flush(self) -> None:
        """Register every noted instance now (one batch per load balancer)."""
        ctx = self._ctx
        provider = load_balancing(ctx.provider)
        ids, self._queued = self._queued, set()
        if provider is None or not ids:
            return
        ctx.fence()
        snapshot = ctx.config.snapshot()
        if snapshot is None:
            return
        with ctx.db.read_connection() as session:
            rows = [row for iid in sorted(ids) if (row := repo.get_instance(session, iid)) is not None]
        batches: dict[str, list[InstanceRow]] = {}
        for row in rows:
            if (
                row.deleted_at is not None
                or row.drain_started_at is not None
                or row.id in self._leaving
                or not row.provider_id
                or (
                    row.provider_status is not None
                    and InstanceStatus(row.provider_status) in UNHEALTHY_STATUSES
                )
            ):
                continue
            merged = snapshot.merged(row.tenant, row.group_key)
            for name in merged.load_balancers if merged is not None else ():
                if (name, row.id) not in self._registered:
                    batches.setdefault(name, []).append(row)
        for name, members in sorted(batches.items()):
            lb = snapshot.config.load_balancers.get(name)
            if lb is None:
                continue
            ids_here = [row.id for row in members]
            try:
                ctx.fence()
                await provider.register_targets(name, lb, [lb_target(row) for row in members])
            except NstanceError as exc:
                self._registration_failed(name, members, exc)
                continue
            self._registered.update((name, iid) for iid in ids_here)
            for iid in ids_here:
                self._failed_at.pop((name, iid), None)
            self._record(name, ids_here, "registered")
            log.info("registered %d instances with load balancer %s", len(ids_here), name)

    def _registration_failed(self, name: str, members: list[InstanceRow], exc: Exception) -> None:
        ctx = self._ctx
        now = ctx.clock.monotonic()
        for row in members:
            self._failed_at[(name, row.id)] = now
        self._record(name, [row.id for row in members], "failed")
        first = members[0]
        message = f"cannot register {len(members)} instances with load balancer {name}: {exc}"
        log.warning("%s (retried after %.0fs)", message, RETRY_AFTER)
        ctx.events.errors.publish(
            ErrorEventData(
                tenant=first.tenant,
                group=first.group_key,
                instance_id=first.id if len(members) == 1 else "",
                error=message,
                timestamp=ctx.clock.now(),
            )
        )

    def _record(self, name: str, instance_ids: list[str], status: str) -> None:
        with self._ctx.db.write_connection() as session:
            repo.set_lb_status(session, name, instance_ids, status=status, now=self._ctx.clock.now())

    # --- deregistration -----------------------------------------------------------------------

    def _configured(self, row: InstanceRow) -> list[tuple[str, LoadBalancerConfig]]:
        """The load balancers the VM may be attached to: its group's, and any it was registered with."""
        names = set(self.registered(row.id))
        snapshot = self._ctx.config.snapshot()
        if snapshot is None:
            return []
        merged = snapshot.merged(row.tenant, row.group_key)
        if merged is not None:
            names.update(merged.load_balancers)
        with self._ctx.db.read_connection() as session:
            names.update(m.lb_key for m in repo.lb_memberships(session, row.id) if m.status != "deregistered")
        out: list[tuple[str, LoadBalancerConfig]] = []
        for name in sorted(names):
            lb = snapshot.config.load_balancers.get(name)
            if lb is None:
                log.warning(
                    "instance %s: load balancer %s is no longer configured; not deregistered", row.id, name
                )
            else:
                out.append((name, lb))
        return out

    async def _deregister(self, row: InstanceRow, lbs: list[tuple[str, LoadBalancerConfig]]) -> None:
        provider = load_balancing(self._ctx.provider)
        if provider is None:
            return
        for name, lb in lbs:
            self._ctx.fence()
            await provider.deregister_targets(name, lb, [lb_target(row)])
        self._leaving.add(row.id)

    async def _attached(
        self, row: InstanceRow, lbs: list[tuple[str, LoadBalancerConfig]]
    ) -> list[tuple[str, LoadBalancerConfig]]:
        """The load balancers among ``lbs`` that still hold the VM (registered, healthy or draining)."""
        provider = load_balancing(self._ctx.provider)
        if provider is None:
            return []
        out = []
        for name, lb in lbs:
            state = (await provider.target_states(name, lb, [lb_target(row)])).get(row.id)
            if state != TargetState.DEREGISTERED:
                out.append((name, lb))
        return out

    def start_deregistration(self, row: InstanceRow) -> None:
        """The instance is leaving (drain started): stop new traffic to it now, without waiting."""
        if not self.enabled or not row.provider_id:
            return
        self._leaving.add(row.id)
        task = asyncio.get_running_loop().create_task(self._start(row))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start(self, row: InstanceRow) -> None:
        lbs = self._configured(row)
        try:
            await self._deregister(row, lbs)
        except NstanceError as exc:
            log.warning("instance %s: deregistration not started (retried before delete): %s", row.id, exc)
            return
        for name, _ in lbs:
            self._record(name, [row.id], "deregistered")

    async def release(self, row: InstanceRow) -> bool:
        """True once no load balancer holds the VM (safe to delete); else start or continue deregistering.

        Never waits: a False answer means connections are still draining; ask again later.
        """
        if not self.enabled or not row.provider_id:
            return True
        self._leaving.add(row.id)
        holding = await self._attached(row, self._configured(row))
        if holding:
            await self._deregister(row, holding)
            holding = await self._attached(row, holding)  # without connections to drain, removal is immediate
        if holding:
            self._waiting.add(row.id)
            self._ctx.metrics.set_lb_deregistrations_waiting(len(self._waiting))
            names = ", ".join(name for name, _ in holding)
            log.info("instance %s: waiting for %s to finish deregistering it", row.id, names)
            return False
        self.forget(row.id)
        return True

    def forget(self, instance_id: str) -> None:
        """The instance is gone: drop what is known about its memberships."""
        self._registered = {key for key in self._registered if key[1] != instance_id}
        self._failed_at = {key: t for key, t in self._failed_at.items() if key[1] != instance_id}
        self._queued.discard(instance_id)
        self._waiting.discard(instance_id)
        self._ctx.metrics.set_lb_deregistrations_waiting(len(self._waiting))
        with self._ctx.db.write_connection() as session:
            repo.delete_lb_memberships(session, instance_id)

    async def close(self) -> None:
        """Leadership ended: forget in-memory membership (the next leader registers again)."""
        tasks = [t for t in (self._flush_task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._flush_task = None
        self._registered.clear()
        self._failed_at.clear()
        self._queued.clear()
        self._leaving.clear()
        self._waiting.clear()
        self._ctx.metrics.set_lb_deregistrations_waiting(0)
