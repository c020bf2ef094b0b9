"""Decide what one group needs: how many instances to create, which to delete now, which to drain.

``plan_group`` is a pure function of the group's desired size and infra hash, its managed members as
the shard's cache sees them, and the time. It performs nothing; the reconciler carries the plan out and
the next reconcile (level-triggered) sees the result. Rules:

* **Gone or broken members are replaced.** A member the provider reports stopped/suspended/repairing
  (``unhealthy``) or whose create failed is deleted at once, without drain, and does not count.
* **Serving members count.** Everything else except draining members counts toward ``size``; draining
  members are already leaving, so a scale-down removes them before anything else (by not replacing
  them), and a drain that completes (acknowledged or past its deadline) turns into a delete.
* **Scale-down victims**, when more members serve than wanted: never-registered first (oldest of those
  first: a VM that never came up is the cheapest to lose), then the oldest. Registered victims are
  drained when the group has a drain timeout; never-registered ones are deleted directly.
* **Drift**: when the group is otherwise at size and nothing is draining, the oldest member whose infra
  hash differs from the group's is drained and replaced - one rotation at a time per group.
* **Expiry**: a member older than ``forced_age`` is rotated even while another drain runs; one older than
  ``eligible_age`` only when nothing is draining. One per reconcile.
* ``desired is None`` means the group no longer exists: every member goes (drained if possible).

On-demand instances are never passed in: they are not counted and never scaled down.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

#: Reasons recorded on drains and deletes (also sent to the operator on instance events).
REASON_UNHEALTHY = "unhealthy"
REASON_CREATE_FAILED = "create-failed"
REASON_SCALE_DOWN = "scale-down"
REASON_GROUP_DELETED = "group-deleted"
REASON_DRIFT = "config-drift"
REASON_FORCED_EXPIRY = "forced-expiry"
REASON_ELIGIBLE_EXPIRY = "eligible-expiry"
REASON_DRAIN_COMPLETE = "drain-complete"
REASON_DRAIN_TIMEOUT = "drain-timeout"


@dataclass(frozen=True, slots=True)
class Member:
    """One managed instance of the group, as the planner needs to see it."""

    instance_id: str
    created_at: datetime
    registered: bool = False
    unhealthy: bool = False
    failed: bool = False
    draining: bool = False
    drain_acked: bool = False
    delete_at: datetime | None = None
    infra_hash: str | None = None


@dataclass(frozen=True, slots=True)
class Action:
    """Delete or drain one instance, and why."""

    instance_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """What to do now. Empty when the group is as wanted."""

    create: int = 0
    delete: tuple[Action, ...] = ()
    drain: tuple[Action, ...] = ()
    serving: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def empty(self) -> bool:
        return self.create == 0 and not self.delete and not self.drain


@dataclass(frozen=True, slots=True)
class PlanInput:
    """The group's wanted state (``desired`` None: the group was removed)."""

    desired: int | None
    infra_hash: str | None = None
    drain_timeout: timedelta = timedelta(0)
    eligible_age: timedelta | None = None
    forced_age: timedelta | None = None


def _victim_order(member: Member) -> tuple[bool, datetime, str]:
    # never-registered before registered; within each, oldest first
    return (member.registered, member.created_at, member.instance_id)


def plan_group(spec: PlanInput, members: Sequence[Member], now: datetime) -> GroupPlan:
    """The actions that move ``members`` toward ``spec`` at ``now`` (see the module docstring)."""
    deletes: list[Action] = []
    drains: list[Action] = []
    drain_allowed = spec.drain_timeout > timedelta(0)

    serving: list[Member] = []
    draining: list[Member] = []
    for member in members:
        if member.failed:
            deletes.append(Action(member.instance_id, REASON_CREATE_FAILED))
        elif member.unhealthy:
            deletes.append(Action(member.instance_id, REASON_UNHEALTHY))
        elif member.draining:
            if member.drain_acked:
                deletes.append(Action(member.instance_id, REASON_DRAIN_COMPLETE))
            elif member.delete_at is not None and member.delete_at <= now:
                deletes.append(Action(member.instance_id, REASON_DRAIN_TIMEOUT))
            else:
                draining.append(member)
        else:
            serving.append(member)

    def retire(victims: Sequence[Member], reason: str) -> None:
        for victim in victims:
            if drain_allowed and victim.registered:
                drains.append(Action(victim.instance_id, reason))
            else:
                deletes.append(Action(victim.instance_id, reason))

    if spec.desired is None:
        retire(sorted(serving, key=_victim_order), REASON_GROUP_DELETED)
        return GroupPlan(delete=tuple(deletes), drain=tuple(drains), serving=0)

    desired = spec.desired
    if len(serving) > desired:
        victims = sorted(serving, key=_victim_order)[: len(serving) - desired]
        retire(victims, REASON_SCALE_DOWN)
        keep = len(serving) - len(victims)
        return GroupPlan(delete=tuple(deletes), drain=tuple(drains), serving=keep)

    rotation = _rotation(spec, serving, draining, now)
    if rotation is not None:
        member, reason = rotation
        retire([member], reason)
        serving = [m for m in serving if m.instance_id != member.instance_id]

    return GroupPlan(
        create=max(0, desired - len(serving)),
        delete=tuple(deletes),
        drain=tuple(drains),
        serving=len(serving),
    )


def _rotation(
    spec: PlanInput, serving: Sequence[Member], draining: Sequence[Member], now: datetime
) -> tuple[Member, str] | None:
    """At most one member to rotate (replace, then drain): forced expiry, drift, eligible expiry."""
    oldest_first = sorted(serving, key=lambda m: (m.created_at, m.instance_id))
    if spec.forced_age is not None:
        for member in oldest_first:
            if now - member.created_at >= spec.forced_age:
                return member, REASON_FORCED_EXPIRY
    if draining:
        return None
    if spec.infra_hash is not None:
        for member in oldest_first:
            if member.infra_hash is not None and member.infra_hash != spec.infra_hash:
                return member, REASON_DRIFT
    if spec.eligible_age is not None:
        for member in oldest_first:
            if now - member.created_at >= spec.eligible_age:
                return member, REASON_ELIGIBLE_EXPIRY
    return None


def next_wakeup(spec: PlanInput, members: Sequence[Member], now: datetime) -> datetime | None:
    """When this group next needs a reconcile without any event: a drain deadline or an expiry age."""
    candidates: list[datetime] = []
    for member in members:
        if member.draining and member.delete_at is not None and member.delete_at > now:
            candidates.append(member.delete_at)
        elif not member.draining and not member.unhealthy and not member.failed:
            for age in (spec.eligible_age, spec.forced_age):
                if age is not None and member.created_at + age > now:
                    candidates.append(member.created_at + age)
    return min(candidates) if candidates else None
