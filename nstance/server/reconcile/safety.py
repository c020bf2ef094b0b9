"""The leader's safety holds and the mass-deletion brake, as the reconcile steps use them.

``brake`` decides (pure) how many instances a group may lose to the leader's own judgement and
``holds`` keeps what is held back; ``Safety`` applies them with the shard's config, clock, metrics
and events: ``brake_silent`` shows the health replacements the brake holds back as serving,
``set_hold`` sets or clears a hold (``/health``, ``nstance_degraded``, ``WatchErrors``) and
``report_error`` tells error watchers about a failure an operator should see.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from nstance.core.plan import Member
from nstance.server.reconcile import brake
from nstance.server.reconcile.holds import Holds
from nstance.server.state.context import ShardContext
from nstance.server.state.events import ErrorEventData

log = logging.getLogger(__name__)


class Safety:
    """Holds, deletion budgets and error reports of one shard."""

    def __init__(self, ctx: ShardContext) -> None:
        self._ctx = ctx
        #: What the leader holds back and why (``/health``); the brake's per-group deletion budgets.
        self.holds = Holds()
        self.budget = brake.DeletionBudget()

    def brake_limits(self) -> brake.BrakeLimits:
        snapshot = self._ctx.config.snapshot()
        if snapshot is None:
            return brake.BrakeLimits()
        return brake.limits_from(snapshot.config.shard.deletion_brake)

    def set_hold(self, topic: str, reason: str | None, *, tenant: str = "", group: str = "") -> None:
        """Set or clear a safety hold; a new or changed one is reported once on ``WatchErrors``.

        The holds of each kind are also one ``degraded`` component (``/health``, ``nstance_degraded``).
        Setting what is already set changes nothing (every reconcile of every group sets its own).
        """
        if self.holds.reason(topic) == reason:
            return
        if self.holds.set(topic, reason) and reason is not None:
            self.report_error(tenant, group, "", reason)
        ctx = self._ctx
        ctx.metrics.set_safety_holds(self.holds.counts())
        kind = topic.split(" ", 1)[0]
        component = kind.replace("-", "_")
        summary = self.holds.summary(kind)
        if summary is None:
            ctx.degraded.clear(component)
            ctx.metrics.set_degraded(component, None)
        else:
            ctx.degraded.set(component, "held", summary)
            ctx.metrics.set_degraded(component, "held")

    def brake_silent(
        self,
        key: tuple[str, str],
        members: list[Member],
        silence_limit: timedelta | None,
        now: datetime,
        since: datetime | None = None,
    ) -> list[Member]:
        """``members`` with the health replacements the brake holds back shown as serving (reported)."""
        verdict = brake.hold_silent(
            key,
            members,
            silence_limit,
            now,
            budget=self.budget,
            mono=self._ctx.clock.monotonic(),
            limits=self.brake_limits(),
            since=since,
        )
        self.set_hold(f"{brake.REPLACEMENTS} {key[0]}/{key[1]}", verdict.held, tenant=key[0], group=key[1])
        return verdict.members

    def hold_left(self, key: tuple[str, str]) -> float | None:
        """Seconds until the group's mass-silence hold runs out (``None``: no hold in force)."""
        return self.budget.hold_left(key, self._ctx.clock.monotonic(), self.brake_limits())

    def report_error(self, tenant: str, group: str, instance_id: str, message: str) -> None:
        """Tell error watchers (and the log) about a failure an operator should see."""
        log.warning("%s/%s %s: %s", tenant, group, instance_id or "-", message)
        self._ctx.events.errors.publish(
            ErrorEventData(
                tenant=tenant,
                group=group,
                instance_id=instance_id,
                error=message,
                timestamp=self._ctx.clock.now(),
            )
        )
