"""Retiring instances: delete, drain (with its timeout) and retiring rows that never got a VM.

A delete first confirms that no load balancer still sends the VM traffic (``loadbalancers``; while one
drains it, the instance is held as draining, its record is marked ``deleting`` and the delete raises
``DeregistrationPending`` for a later retry), then marks the record ``deleting`` before the provider
call and ``deleted`` after, so an interrupted or held delete is finished by the next leader. A provider
call that fails leaves the row draining and due (``_hold_due``), so this leader retries that same
delete. ``drain`` starts the drain timeout: the row's ``delete_at`` is now plus the group's timeout,
watchers are told to drain the node, and the planner deletes the instance on the agent's ack or at
``delete_at``.
``retire_unlaunched`` retires a row whose create never reached the provider. A row without a provider
id whose agent registered is not such a row: its VM exists, and deleting it waits until a provider sync
has adopted the VM by its tags (``AdoptionPending``).

A ``deleted`` that cannot be written into the record is written again by the next GC cycles
(``owedstatus``).

Deciding *which* instance to retire is not done here (``nstance.core.plan``).
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import timedelta

from nstance.db import repo
from nstance.db.rows import InstanceRow
from nstance.providers.base import InstanceStatus
from nstance.server.reconcile.loadbalancers import DeregistrationPending, LoadBalancerSync
from nstance.server.reconcile.owedstatus import OwedStatuses
from nstance.server.state.context import ShardContext
from nstance.server.state.events import InstanceEventData

log = logging.getLogger(__name__)


class AdoptionPending(Exception):
    """The instance's VM exists (its agent registered) but its provider id is not known: no provider
    call can delete it yet. The next provider sync adopts it by its tags (or finds it gone)."""


class Retirer:
    """Deletes and drains instances; every step is fenced by shard leadership."""

    def __init__(self, ctx: ShardContext, owed: OwedStatuses) -> None:
        self._ctx = ctx
        self._owed = owed
        self.lbs = LoadBalancerSync(ctx)
        #: Instances whose ``delete`` is running: the provider sync must not take their VM, gone
        #: because of that very delete, for one that vanished on its own and delete it again.
        self.deleting: Counter[str] = Counter()
        #: Instances held for load balancers whose record already says ``deleting`` (written once).
        self.held: set[str] = set()

    async def delete(self, row: InstanceRow, reason: str) -> None:
        """Delete the VM (if any) and retire the instance; safe to repeat.

        Raises DeregistrationPending while a load balancer still drains the VM; the instance is then
        held as draining (due now), so the next reconcile of its group tries the delete again.
        """
        ctx = self._ctx
        ctx.fence()
        if row.provider_id and not await self.lbs.release(row):
            self._hold_due(row, reason)
            # The delete is decided: the record says so before anyone hears "deleting", so that a
            # leader taking over finishes it (``recovery``) instead of keeping the VM. A DeleteInstance
            # answered "deleting" was lost with the leader that held it.
            if row.id not in self.held:
                await self._owed.commit(row.tenant, row.id, "deleting")
                self.held.add(row.id)
            raise DeregistrationPending(
                f"instance {row.id}: a load balancer is still draining it ({reason}); it is deleted once "
                "deregistration is confirmed"
            )
        self.deleting[row.id] += 1
        self.held.discard(row.id)
        try:
            await self._delete(row, reason)
        finally:
            self.deleting[row.id] -= 1
            if not self.deleting[row.id]:
                del self.deleting[row.id]

    async def _delete(self, row: InstanceRow, reason: str) -> None:
        ctx = self._ctx
        self._publish(row, "deleting", reason)
        now = ctx.clock.now()
        await self._set_record_status(row, "deleting")
        if row.provider_id:
            ctx.fence()
            try:
                await ctx.provider.delete_instance(row.id, row.provider_id)
            except BaseException:
                # The record already says ``deleting``: the delete stays committed. Left active, the
                # row could serve again (its agent reconnects) and a later plan would retire another
                # member, leaving this VM under a ``deleting`` record nothing finishes.
                self._hold_due(row, reason)
                raise
            self._ctx.fault_point("after-provider-delete")
            self.lbs.forget(row.id)
        with ctx.db.write_connection() as session:
            repo.set_provider_status(session, row.id, InstanceStatus.DELETED.value, now=now)
            repo.soft_delete(session, row.id, now=ctx.clock.now())
        await self._set_record_status(row, "deleted")
        log.info("instance %s of %s/%s deleted (%s)", row.id, row.tenant, row.group_key, reason)
        self._publish(row, "deleted", reason)
        ctx.metrics.record_retirement(reason)

    def _hold_due(self, row: InstanceRow, reason: str) -> None:
        """Hold a delete that could not finish now as draining and due: the row stops counting toward
        its group and the group's next reconcile tries that same delete again."""
        now = self._ctx.clock.now()
        with self._ctx.db.write_connection() as session:
            repo.start_drain(session, row.id, reason=reason, now=now, delete_at=now)

    async def delete_or_hold(self, row: InstanceRow, reason: str) -> bool:
        """``delete``, but a delete waiting for load balancers is not an error: False, retried later."""
        try:
            await self.delete(row, reason)
        except DeregistrationPending as exc:
            log.info("%s", exc)
            return False
        return True

    async def retire_unlaunched(self, row: InstanceRow, reason: str) -> None:
        """Retire a row whose create never reached the provider (nothing to delete there)."""
        ctx = self._ctx
        with ctx.db.write_connection() as session:
            repo.soft_delete(session, row.id, now=ctx.clock.now())
        await self._set_record_status(row, "deleted")
        log.info("instance %s of %s/%s retired without a VM (%s)", row.id, row.tenant, row.group_key, reason)

    def drain(self, row: InstanceRow, reason: str, timeout: timedelta) -> bool:
        """Start draining: watchers are told to drain the node; deletion follows on ack or timeout."""
        ctx = self._ctx
        ctx.fence()
        now = ctx.clock.now()
        delete_at = now + timeout
        with ctx.db.write_connection() as session:
            started = repo.start_drain(session, row.id, reason=reason, now=now, delete_at=delete_at)
        if started:
            log.info("instance %s draining (%s) until %s", row.id, reason, delete_at.isoformat())
            ctx.metrics.record_retirement(reason)
            self.lbs.start_deregistration(row)
            ctx.events.instances.publish(
                InstanceEventData(
                    instance_id=row.id,
                    tenant=row.tenant,
                    group=row.group_key,
                    provider_id=row.provider_id or "",
                    status="pending_deletion",
                    reason=reason,
                    unhealthy_at=now,
                    delete_at=delete_at,
                )
            )
        return started

    async def _set_record_status(self, row: InstanceRow, status: str) -> None:
        """Write the record's status if still leading; else the next leader finishes from what it finds.
        A ``deleted`` that cannot be written now is owed (``owedstatus``)."""
        await self._owed.write(row.tenant, row.id, status, owe=status == "deleted")

    def _publish(self, row: InstanceRow, status: str, reason: str) -> None:
        self._ctx.events.instances.publish(
            InstanceEventData(
                instance_id=row.id,
                tenant=row.tenant,
                group=row.group_key,
                provider_id=row.provider_id or "",
                status=status,
                reason=reason,
            )
        )
