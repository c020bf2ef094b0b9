"""The mass-deletion brake: how many VMs a group may lose to the leader's own judgement per interval.

Two judgements can destroy a fleet when the server, not the fleet, is what is broken: "no record
explains this VM" (orphan deletion) and "this agent stopped reporting" (health replacement). Both are
bounded here, per group and per ``interval``:

* at most ``max_deletions`` distinct instances per group per interval, for each judgement separately;
* when at least ``min_silent`` registered members *and* at least ``silent_fraction`` of them went
  silent together (``went_silent_together``), the fault is presumed to be on the server's side (its
  network, its clock, its agent port) - like Kubernetes' node lifecycle controller in an unhealthy
  zone - and no silent member is replaced for up to ``max_hold``; the hold is reported instead.

What is held is reported through ``Holds`` (the ``/health`` reason, a metric, ``WatchErrors``). Time is
the caller's monotonic seconds; nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from nstance.config.shard import DeletionBrakeConfig
from nstance.core.ids import GroupKey
from nstance.core.plan import Member, is_silent

ORPHANS = "orphan-deletions"
REPLACEMENTS = "health-replacements"


@dataclass(frozen=True, slots=True)
class BrakeLimits:
    """Bounds on deletions the leader decides on its own (see the module docstring)."""

    max_deletions: int = 5
    interval: timedelta = timedelta(minutes=10)
    silent_fraction: float = 0.5
    min_silent: int = 2
    max_hold: timedelta = timedelta(minutes=5)


class DeletionBudget:
    """Distinct instance ids spent per (judgement, group) in the trailing interval."""

    def __init__(self) -> None:
        self._spent: dict[tuple[str, GroupKey], deque[tuple[float, str]]] = {}
        self._held_since: dict[GroupKey, float] = {}

    def _window(self, kind: str, key: GroupKey, now: float, limits: BrakeLimits) -> deque[tuple[float, str]]:
        spent = self._spent.setdefault((kind, key), deque())
        horizon = now - limits.interval.total_seconds()
        while spent and spent[0][0] <= horizon:
            spent.popleft()
        return spent

    def take(self, kind: str, key: GroupKey, instance_id: str, now: float, limits: BrakeLimits) -> bool:
        """Spend one deletion on ``instance_id`` (free if already spent on it in the window)."""
        spent = self._window(kind, key, now, limits)
        if any(iid == instance_id for _, iid in spent):
            return True
        if len(spent) >= limits.max_deletions:
            return False
        spent.append((now, instance_id))
        return True

    def hold_age(self, key: GroupKey, now: float) -> float:
        """Seconds the group's mass-silence hold has lasted (starting it now if there is none)."""
        return now - self._held_since.setdefault(key, now)

    def hold_left(self, key: GroupKey, now: float, limits: BrakeLimits) -> float | None:
        """Seconds until the group's mass-silence hold runs out, or ``None`` if none is in force.

        The caller re-checks the group then: a held member is shown as just seen, so its own silence
        wake-up would come up to one silence limit after the hold has ended.
        """
        since = self._held_since.get(key)
        if since is None:
            return None
        left = since + limits.max_hold.total_seconds() - now
        return left if left > 0 else None

    def end_hold(self, key: GroupKey) -> None:
        self._held_since.pop(key, None)

    def keys(self, kind: str) -> list[GroupKey]:
        """Groups that spent budget of ``kind`` (held or not), so a hold on them can be cleared."""
        return [key for k, key in self._spent if k == kind]


def mass_silence(registered: int, silent: int, limits: BrakeLimits) -> bool:
    """Whether so much of a group is silent at once that the server is presumed to be at fault."""
    if silent < max(1, limits.min_silent) or registered <= 0:
        return False
    return silent >= math.ceil(limits.silent_fraction * registered)


@dataclass(frozen=True, slots=True)
class SilenceVerdict:
    """``members`` with held silent ones shown as just seen; ``held`` says why, if any were held."""

    members: list[Member]
    held: str | None = None


def went_silent_together(
    silent: Sequence[Member], registered: int, silence_limit: timedelta, since: datetime | None
) -> bool:
    """Whether the silent members stopped reporting at about the same time.

    Every registered member silent counts as together (a full outage). Otherwise their last reports
    must lie within one ``silence_limit`` of each other, and none may date from before this leadership
    (``since``): silence carried over a failover says nothing about when it began.
    """
    if len(silent) >= registered:
        return True
    seen = [m.last_seen for m in silent if m.last_seen is not None]
    if len(seen) < len(silent) or (since is not None and any(s <= since for s in seen)):
        return False
    return max(seen) - min(seen) <= silence_limit


def hold_silent(
    key: GroupKey,
    members: Sequence[Member],
    silence_limit: timedelta | None,
    now: datetime,
    *,
    budget: DeletionBudget,
    mono: float,
    limits: BrakeLimits,
    since: datetime | None = None,
) -> SilenceVerdict:
    """Let through only the health replacements the brake allows; the rest count as serving for now.

    A mass silence is held for at most ``limits.max_hold``; if it lasts longer, the silent members are
    replaced at the budgeted rate (the presumption of a server-side fault has had its chance).
    """
    silent = [m for m in members if not m.draining and not m.spot_notice and is_silent(m, silence_limit, now)]
    if not silent or silence_limit is None:
        budget.end_hold(key)
        return SilenceVerdict(list(members))
    registered = sum(1 for m in members if m.registered and not m.draining)
    mass = mass_silence(registered, len(silent), limits) and went_silent_together(
        silent, registered, silence_limit, since
    )
    if mass and budget.hold_age(key, mono) < limits.max_hold.total_seconds():
        held = {m.instance_id for m in silent}
        reason = (
            f"{len(silent)} of {registered} registered instances stopped reporting at once; presuming a "
            f"fault on the server's side and replacing none of them for up to {limits.max_hold}"
        )
    else:
        if not mass:
            budget.end_hold(key)
        held = {
            m.instance_id for m in silent if not budget.take(REPLACEMENTS, key, m.instance_id, mono, limits)
        }
        reason = (
            f"{len(held)} silent instances wait: at most {limits.max_deletions} health replacements per "
            f"{limits.interval} per group"
        )
    if not held:
        return SilenceVerdict(list(members))
    shown = [dataclasses.replace(m, last_seen=now) if m.instance_id in held else m for m in members]
    return SilenceVerdict(shown, reason)


def limits_from(config: DeletionBrakeConfig) -> BrakeLimits:
    """The brake's limits from the shard config's ``deletion_brake`` section."""
    return BrakeLimits(
        max_deletions=config.max_deletions,
        interval=config.interval,
        silent_fraction=config.silent_fraction,
        min_silent=config.min_silent,
        max_hold=config.max_hold,
    )
