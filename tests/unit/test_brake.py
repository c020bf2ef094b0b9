"""The mass-deletion brake: per-group budgets and the presumption of a server-side fault."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nstance.core.plan import Member
from nstance.server.reconcile.brake import (
    ORPHANS,
    REPLACEMENTS,
    BrakeLimits,
    DeletionBudget,
    hold_silent,
    mass_silence,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LIMIT = timedelta(seconds=30)
KEY = ("default", "web")


def member(iid: str, *, silent: bool, registered: bool = True) -> Member:
    seen = NOW - (timedelta(minutes=5) if silent else timedelta(seconds=1))
    return Member(instance_id=iid, created_at=NOW - timedelta(hours=1), registered=registered, last_seen=seen)


def test_budget_counts_distinct_instances_per_group_and_kind_in_a_trailing_window() -> None:
    limits = BrakeLimits(max_deletions=2, interval=timedelta(minutes=10))
    budget = DeletionBudget()
    assert budget.take(ORPHANS, KEY, "a", 0.0, limits)
    assert budget.take(ORPHANS, KEY, "a", 1.0, limits)  # the same instance again is free
    assert budget.take(ORPHANS, KEY, "b", 2.0, limits)
    assert not budget.take(ORPHANS, KEY, "c", 3.0, limits)
    assert budget.take(ORPHANS, ("default", "db"), "c", 3.0, limits)  # another group
    assert budget.take(REPLACEMENTS, KEY, "c", 3.0, limits)  # another judgement
    assert budget.take(ORPHANS, KEY, "c", 600.5, limits)  # "a" left the window


def test_mass_silence_needs_both_a_count_and_a_fraction() -> None:
    limits = BrakeLimits(silent_fraction=0.5, min_silent=2)
    assert not mass_silence(1, 1, limits)  # one instance of one: replaced
    assert mass_silence(2, 2, limits)
    assert not mass_silence(10, 2, limits)
    assert mass_silence(10, 5, limits)
    assert not mass_silence(0, 0, limits)


def test_a_group_going_silent_at_once_is_held_whole() -> None:
    members = [member(f"i{n}", silent=n < 3) for n in range(4)]
    verdict = hold_silent(KEY, members, LIMIT, NOW, budget=DeletionBudget(), mono=0.0, limits=BrakeLimits())
    assert verdict.held is not None
    assert "3 of 4 registered instances stopped reporting at once" in verdict.held
    assert all(m.last_seen == NOW for m in verdict.members[:3])


def test_a_few_silent_members_are_let_through_up_to_the_budget() -> None:
    members = [member(f"i{n}", silent=n < 3) for n in range(10)]
    limits = BrakeLimits(max_deletions=2)
    verdict = hold_silent(KEY, members, LIMIT, NOW, budget=DeletionBudget(), mono=0.0, limits=limits)
    held = [m for m, orig in zip(verdict.members, members, strict=True) if m.last_seen != orig.last_seen]
    assert [m.instance_id for m in held] == ["i2"]
    assert verdict.held is not None
    assert "1 silent instances wait" in verdict.held


def test_nothing_silent_changes_nothing() -> None:
    members = [member(f"i{n}", silent=False) for n in range(3)]
    verdict = hold_silent(KEY, members, LIMIT, NOW, budget=DeletionBudget(), mono=0.0, limits=BrakeLimits())
    assert verdict.held is None
    assert verdict.members == members


def test_silence_that_did_not_start_together_is_not_presumed_the_servers_fault() -> None:
    early = Member(instance_id="a", created_at=NOW, registered=True, last_seen=NOW - timedelta(minutes=20))
    late = Member(instance_id="b", created_at=NOW, registered=True, last_seen=NOW - timedelta(minutes=2))
    well = member("c", silent=False)
    verdict = hold_silent(
        KEY, [early, late, well], LIMIT, NOW, budget=DeletionBudget(), mono=0.0, limits=BrakeLimits()
    )
    assert verdict.held is None  # two separate deaths: both replaced


def test_silence_carried_over_a_failover_is_not_presumed_together_unless_everyone_is_silent() -> None:
    since = NOW - timedelta(minutes=5)  # this leadership began then: earlier silence is clamped to it
    carried = [Member(instance_id=i, created_at=NOW, registered=True, last_seen=since) for i in "ab"]
    budget = DeletionBudget()
    verdict = hold_silent(
        KEY,
        [*carried, member("c", silent=False)],
        LIMIT,
        NOW,
        budget=budget,
        mono=0.0,
        limits=BrakeLimits(),
        since=since,
    )
    assert verdict.held is None
    verdict = hold_silent(
        KEY, carried, LIMIT, NOW, budget=budget, mono=0.0, limits=BrakeLimits(), since=since
    )
    assert verdict.held is not None  # the whole group: a full outage


def test_a_mass_silence_is_held_at_most_max_hold_then_replaced_at_the_budgeted_rate() -> None:
    members = [member(f"i{n}", silent=True) for n in range(4)]
    budget = DeletionBudget()
    limits = BrakeLimits(max_deletions=1, max_hold=timedelta(minutes=5))
    first = hold_silent(KEY, members, LIMIT, NOW, budget=budget, mono=0.0, limits=limits)
    assert first.held is not None
    assert "at once" in first.held
    later = hold_silent(KEY, members, LIMIT, NOW, budget=budget, mono=301.0, limits=limits)
    assert later.held is not None
    assert "3 silent instances wait" in later.held  # one replaced, the rest at the budget's pace


def test_hold_left_says_when_a_mass_silence_hold_runs_out_so_the_group_is_rechecked_then() -> None:
    members = [member(f"i{n}", silent=True) for n in range(4)]
    budget = DeletionBudget()
    limits = BrakeLimits(max_hold=timedelta(minutes=5))
    assert budget.hold_left(KEY, 0.0, limits) is None
    hold_silent(KEY, members, LIMIT, NOW, budget=budget, mono=10.0, limits=limits)
    assert budget.hold_left(KEY, 100.0, limits) == 210.0
    assert budget.hold_left(KEY, 310.0, limits) is None  # run out: replaced at the budgeted rate, no timer
    hold_silent(KEY, [member("i0", silent=False)], LIMIT, NOW, budget=budget, mono=320.0, limits=limits)
    assert budget.hold_left(KEY, 320.0, limits) is None
