"""Decide what one group needs: how many instances to create, which to delete now, which to drain.

``plan_group`` is a pure function of the group's desired size and infra hash, its managed members as
the shard's cache sees them, and the time. It performs nothing; the reconciler carries the plan out and
the next reconcile (level-triggered) sees the result. Rules:

* **Gone or broken members are replaced.** A member the provider reports stopped/suspended/repairing
  (``unhealthy``) or whose create failed is deleted at once, without drain, and does not count.
* **Silent or doomed members are replaced, then drained.** A registered member whose agent has not
  reported for ``silence_limit`` (three health intervals) while the VM runs, or whose agent reported a
  spot termination notice, does not count: a replacement is created and the member is drained (deleted
  at once when the group has no drain timeout). All of them at once - they are broken, not rotations.
* **Serving members count.** Everything else except draining members counts toward ``size``; draining
  members are already leaving, so a scale-down removes them before anything else (by not replacing
  them), and a drain that completes (acknowledged or past its deadline) turns into a delete.
* **Scale-down victims**, when more members serve than wanted: never-registered first (oldest of those
  first: a VM that never came up is the cheapest to lose), then the oldest. Registered victims are
  drained when the group has a drain timeout; never-registered ones are deleted directly.
* **Drift**: when the group is otherwise at size and nothing is draining, the oldest member whose infra
  hash differs from the group's is drained and replaced - one rotation at a time per group. A member
  recorded with the group's ``legacy_infra_hash`` (the same config, hashed the way earlier versions of
  this project did) has not drifted. A member without a recorded hash (a VM adopted from its tags after
  its record was lost, a record that never had one) is judged by what is known of it: another instance
  type or template than the group's is drift; a difference nobody can see is not assumed.
* **Expiry**: a member older than ``forced_age`` is rotated even while another drain runs; one older than
  ``eligible_age`` only when nothing is draining. One per reconcile.
* ``desired is None`` means the group no longer exists: every member goes (drained if possible).

On-demand instances are never passed to ``plan_group``: they are not counted and never scaled down.
``plan_on_demand`` expires them (drain, no replacement) once they are older than ``ondemand_age``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from nstance.core.ids import GroupKey


class Reason(StrEnum):
    """Why an instance is drained or deleted: recorded on the instance, counted in metrics and sent to
    the operator on instance events (the values are what records, logs and metrics carry)."""

    UNHEALTHY = "unhealthy"
    CREATE_FAILED = "create-failed"
    SCALE_DOWN = "scale-down"
    GROUP_DELETED = "group-deleted"
    DRIFT = "config-drift"
    FORCED_EXPIRY = "forced-expiry"
    ELIGIBLE_EXPIRY = "eligible-expiry"
    DRAIN_COMPLETE = "drain-complete"
    DRAIN_TIMEOUT = "drain-timeout"
    SILENT = "health-reports-missed"
    SPOT = "spot-termination"
    ONDEMAND_EXPIRY = "ondemand-expiry"
    REGISTRATION_TIMEOUT = "registration-timeout"
    STALE_PRE_INSERT = "stale-pre-insert"


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
    #: Last sign of life from the agent: its last health report, else its registration.
    last_seen: datetime | None = None
    #: The agent reported a spot/preemption termination notice.
    spot_notice: bool = False
    #: The instance type and template it runs ("": unknown); judged only when ``infra_hash`` is None.
    instance_type: str = ""
    template: str = ""


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

    @property
    def empty(self) -> bool:
        return self.create == 0 and not self.delete and not self.drain


@dataclass(frozen=True, slots=True)
class PlanInput:
    """The group's wanted state (``desired`` None: the group was removed)."""

    desired: int | None
    infra_hash: str | None = None
    #: The same config hashed as earlier versions of this project did: recorded by them, still a match.
    legacy_infra_hash: str | None = None
    drain_timeout: timedelta = timedelta(0)
    eligible_age: timedelta | None = None
    forced_age: timedelta | None = None
    #: A registered member silent this long (while its VM runs) is replaced; None: never.
    silence_limit: timedelta | None = None
    #: The group's instance type and template, for members without a recorded hash ("": unknown).
    instance_type: str = ""
    template: str = ""


def _victim_order(member: Member) -> tuple[bool, datetime, str]:
    # never-registered before registered; within each, oldest first
    return (member.registered, member.created_at, member.instance_id)


def has_drifted(member: Member, spec: PlanInput) -> bool:
    """Whether ``member`` was created from another infra config than the group's current one (by its
    recorded hash; without one, by ``visibly_differs``)."""
    if spec.infra_hash is None:
        return False
    if member.infra_hash is None:
        return visibly_differs(member.instance_type, member.template, spec.instance_type, spec.template)
    return member.infra_hash not in (spec.infra_hash, spec.legacy_infra_hash)


def visibly_differs(instance_type: str, template: str, group_type: str, group_template: str) -> bool:
    """Whether an instance known only by its instance type and template (each "" when unknown) runs
    another one than its group's config names.

    For instances without a recorded infra hash: after a record was lost and the VM adopted from its
    tags, a change of instance type or template made since would otherwise never reach it.
    """
    return bool(instance_type and group_type and instance_type != group_type) or bool(
        template and group_template and template != group_template
    )


def is_silent(member: Member, silence_limit: timedelta | None, now: datetime) -> bool:
    """Whether a registered member's agent has been quiet for ``silence_limit`` or longer."""
    if silence_limit is None or not member.registered or member.last_seen is None:
        return False
    return now - member.last_seen >= silence_limit


def plan_group(spec: PlanInput, members: Sequence[Member], now: datetime) -> GroupPlan:
    """The actions that move ``members`` toward ``spec`` at ``now`` (see the module docstring)."""
    deletes: list[Action] = []
    drains: list[Action] = []
    drain_allowed = spec.drain_timeout > timedelta(0)

    serving: list[Member] = []
    draining: list[Member] = []
    doomed: list[tuple[Member, str]] = []
    for member in members:
        if member.failed:
            deletes.append(Action(member.instance_id, Reason.CREATE_FAILED))
        elif member.unhealthy:
            deletes.append(Action(member.instance_id, Reason.UNHEALTHY))
        elif member.draining:
            if member.drain_acked:
                deletes.append(Action(member.instance_id, Reason.DRAIN_COMPLETE))
            elif member.delete_at is not None and member.delete_at <= now:
                deletes.append(Action(member.instance_id, Reason.DRAIN_TIMEOUT))
            else:
                draining.append(member)
        elif member.spot_notice:
            doomed.append((member, Reason.SPOT))
        elif is_silent(member, spec.silence_limit, now):
            doomed.append((member, Reason.SILENT))
        else:
            serving.append(member)

    def retire(victims: Sequence[Member], reason: str) -> None:
        for victim in victims:
            if drain_allowed and victim.registered:
                drains.append(Action(victim.instance_id, reason))
            else:
                deletes.append(Action(victim.instance_id, reason))

    for member, reason in doomed:
        retire([member], reason)

    if spec.desired is None:
        retire(sorted(serving, key=_victim_order), Reason.GROUP_DELETED)
        return GroupPlan(delete=tuple(deletes), drain=tuple(drains), serving=0)

    desired = spec.desired
    if len(serving) > desired:
        victims = sorted(serving, key=_victim_order)[: len(serving) - desired]
        retire(victims, Reason.SCALE_DOWN)
        keep = len(serving) - len(victims)
        return GroupPlan(delete=tuple(deletes), drain=tuple(drains), serving=keep)

    leaving = [*draining, *(member for member, _ in doomed)]
    rotation = _rotation(spec, serving, leaving, now)
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
                return member, Reason.FORCED_EXPIRY
    if draining:
        return None
    for member in oldest_first:
        if has_drifted(member, spec):
            return member, Reason.DRIFT
    if spec.eligible_age is not None:
        for member in oldest_first:
            if now - member.created_at >= spec.eligible_age:
                return member, Reason.ELIGIBLE_EXPIRY
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
            if spec.silence_limit is not None and member.registered and member.last_seen is not None:
                silent_at = member.last_seen + spec.silence_limit
                if silent_at > now:
                    candidates.append(silent_at)
    return min(candidates) if candidates else None


def plan_on_demand(
    members: Sequence[Member], *, ondemand_age: timedelta | None, drain_timeout: timedelta, now: datetime
) -> GroupPlan:
    """Expire on-demand members older than ``ondemand_age``: drained (or deleted), never replaced.

    Drains that completed (acknowledged or past their deadline) become deletes, as in ``plan_group``;
    a member the provider reports gone or broken is deleted. Nothing is created.
    """
    deletes: list[Action] = []
    drains: list[Action] = []
    for member in members:
        if member.failed:
            deletes.append(Action(member.instance_id, Reason.CREATE_FAILED))
        elif member.unhealthy:
            deletes.append(Action(member.instance_id, Reason.UNHEALTHY))
        elif member.draining:
            if member.drain_acked:
                deletes.append(Action(member.instance_id, Reason.DRAIN_COMPLETE))
            elif member.delete_at is not None and member.delete_at <= now:
                deletes.append(Action(member.instance_id, Reason.DRAIN_TIMEOUT))
        elif ondemand_age is not None and now - member.created_at >= ondemand_age:
            if drain_timeout > timedelta(0) and member.registered:
                drains.append(Action(member.instance_id, Reason.ONDEMAND_EXPIRY))
            else:
                deletes.append(Action(member.instance_id, Reason.ONDEMAND_EXPIRY))
    return GroupPlan(delete=tuple(deletes), drain=tuple(drains))


def next_on_demand_wakeup(
    members: Sequence[Member], *, ondemand_age: timedelta | None, now: datetime
) -> datetime | None:
    """When the next on-demand member expires or a drain deadline passes."""
    candidates: list[datetime] = []
    for member in members:
        if member.draining and member.delete_at is not None and member.delete_at > now:
            candidates.append(member.delete_at)
        elif not member.draining and ondemand_age is not None and member.created_at + ondemand_age > now:
            candidates.append(member.created_at + ondemand_age)
    return min(candidates) if candidates else None


def pass_order(
    keys: Iterable[GroupKey], sizes: Mapping[GroupKey, int], managed: Mapping[GroupKey, int]
) -> list[GroupKey]:
    """The order in which a pass over every group (a new term's first, a resync) marks them.

    Groups whose managed live rows differ from their size come first: they need creates or deletes
    (a group resized just before a failover, a removed group still holding instances), while a
    group at its size usually needs nothing. Sorted by key within each part. Only the order
    changes: every group is still reconciled, and one at its size with a broken member is repaired
    in the same pass. ``sizes``: each configured group's size (a missing key: the group is gone);
    ``managed``: each group's live managed rows as counted by the cache (missing: none).
    """
    return sorted(keys, key=lambda key: (sizes.get(key, 0) == managed.get(key, 0), key))
