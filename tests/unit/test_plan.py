"""The group planner: what a group of a given size and membership needs next."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nstance.core.plan import (
    Action,
    Member,
    PlanInput,
    Reason,
    next_on_demand_wakeup,
    next_wakeup,
    pass_order,
    plan_group,
    plan_on_demand,
    visibly_differs,
)

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def member(name: str, age_min: int, **kw: object) -> Member:
    return Member(instance_id=name, created_at=NOW - timedelta(minutes=age_min), **kw)  # type: ignore[arg-type]


def test_scale_up_from_nothing() -> None:
    plan = plan_group(PlanInput(desired=3), [], NOW)
    assert plan.create == 3
    assert plan.delete == ()


def test_at_size_does_nothing() -> None:
    members = [member("a", 5, registered=True), member("b", 4, registered=True)]
    assert plan_group(PlanInput(desired=2), members, NOW).empty


def test_scale_down_prefers_never_registered_then_oldest() -> None:
    members = [
        member("old-registered", 50, registered=True),
        member("new-registered", 10, registered=True),
        member("unregistered", 5),
        member("mid-registered", 30, registered=True),
    ]
    plan = plan_group(PlanInput(desired=2), members, NOW)
    assert [a.instance_id for a in plan.delete] == ["unregistered", "old-registered"]
    assert all(a.reason == Reason.SCALE_DOWN for a in plan.delete)
    assert plan.create == 0


def test_unhealthy_and_failed_are_deleted_and_replaced() -> None:
    members = [
        member("ok", 10, registered=True),
        member("sick", 20, registered=True, unhealthy=True),
        member("broken", 1, failed=True),
    ]
    plan = plan_group(PlanInput(desired=3), members, NOW)
    assert set(plan.delete) == {Action("sick", Reason.UNHEALTHY), Action("broken", Reason.CREATE_FAILED)}
    assert plan.create == 2


def test_unhealthy_goes_before_any_healthy_victim_on_scale_down() -> None:
    members = [
        member("sick", 1, unhealthy=True),
        member("a", 50, registered=True),
        member("b", 40, registered=True),
    ]
    plan = plan_group(PlanInput(desired=2), members, NOW)
    assert plan.delete == (Action("sick", Reason.UNHEALTHY),)
    assert plan.create == 0


def test_draining_members_do_not_count_and_are_the_first_to_go() -> None:
    drain_until = NOW + timedelta(minutes=1)
    members = [
        member("draining", 60, registered=True, draining=True, delete_at=drain_until),
        member("a", 50, registered=True),
        member("b", 40, registered=True),
    ]
    # size 2: the draining one is already leaving; nothing else to do
    assert plan_group(PlanInput(desired=2), members, NOW).empty
    # size 3: one replacement for the draining one
    assert plan_group(PlanInput(desired=3), members, NOW).create == 1
    # size 1: the draining one plus the oldest of the rest
    plan = plan_group(PlanInput(desired=1), members, NOW)
    assert [a.instance_id for a in plan.delete] == ["a"]


def test_drain_ends_on_ack_or_deadline() -> None:
    members = [
        member(
            "acked", 60, registered=True, draining=True, drain_acked=True, delete_at=NOW + timedelta(hours=1)
        ),
        member("late", 60, registered=True, draining=True, delete_at=NOW - timedelta(seconds=1)),
    ]
    plan = plan_group(PlanInput(desired=0), members, NOW)
    assert set(plan.delete) == {Action("acked", Reason.DRAIN_COMPLETE), Action("late", Reason.DRAIN_TIMEOUT)}


def test_scale_down_drains_registered_victims_when_drain_timeout_set() -> None:
    members = [member("reg", 50, registered=True), member("unreg", 5)]
    plan = plan_group(PlanInput(desired=0, drain_timeout=timedelta(minutes=5)), members, NOW)
    assert plan.drain == (Action("reg", Reason.SCALE_DOWN),)
    assert plan.delete == (Action("unreg", Reason.SCALE_DOWN),)


def test_group_deleted_removes_everyone() -> None:
    members = [member("a", 5, registered=True), member("b", 4)]
    plan = plan_group(PlanInput(desired=None), members, NOW)
    assert {a.instance_id for a in plan.delete} == {"a", "b"}
    assert all(a.reason == Reason.GROUP_DELETED for a in plan.delete)
    assert plan.create == 0


def test_drift_rotates_one_at_a_time_and_not_while_draining() -> None:
    spec = PlanInput(desired=3, infra_hash="new", drain_timeout=timedelta(minutes=5))
    members = [member(n, 30 - i, registered=True, infra_hash="old") for i, n in enumerate("abc")]
    plan = plan_group(spec, members, NOW)
    assert plan.drain == (Action("a", Reason.DRIFT),)
    assert plan.create == 1  # the replacement
    draining = [
        *members[1:],
        member(
            "a", 30, registered=True, infra_hash="old", draining=True, delete_at=NOW + timedelta(minutes=1)
        ),
    ]
    new = member("d", 0, infra_hash="new")
    assert plan_group(spec, [*draining, new], NOW).empty


def test_a_member_recorded_with_the_legacy_hash_of_the_same_config_has_not_drifted() -> None:
    # Rows written before the hashes were upstream's carry the legacy hash: an upgrade rotates nothing,
    # while a member of another config (neither hash) still rotates.
    spec = PlanInput(
        desired=2, infra_hash="go", legacy_infra_hash="legacy", drain_timeout=timedelta(minutes=5)
    )
    members = [member("a", 30, registered=True, infra_hash="legacy"), member("b", 20, infra_hash="go")]
    assert plan_group(spec, members, NOW).empty
    stale = [member("a", 30, registered=True, infra_hash="legacy-of-another-config"), members[1]]
    assert plan_group(spec, stale, NOW).drain == (Action("a", Reason.DRIFT),)


def test_a_member_without_a_recorded_hash_is_judged_by_its_instance_type_and_template() -> None:
    # A VM adopted from its tags after its record was lost has no recorded hash. A change of instance
    # type since then must still reach it; a difference nobody can see is not assumed.
    spec = PlanInput(
        desired=2,
        infra_hash="new",
        drain_timeout=timedelta(minutes=5),
        instance_type="m7i.xlarge",
        template="app",
    )
    other_type = member("a", 30, registered=True, instance_type="m7i.large", template="app")
    same = member("b", 20, registered=True, instance_type="m7i.xlarge", template="app")
    assert plan_group(spec, [other_type, same], NOW).drain == (Action("a", Reason.DRIFT),)
    assert plan_group(spec, [same, member("c", 10, registered=True, instance_type="m7i.xlarge")], NOW).empty
    other_template = member("d", 40, registered=True, instance_type="m7i.xlarge", template="old")
    assert plan_group(spec, [other_template, same], NOW).drain == (Action("d", Reason.DRIFT),)
    unknown = member("e", 40, registered=True)  # nothing known: kept, as before
    assert plan_group(spec, [unknown, same], NOW).empty
    assert visibly_differs("", "", "m7i.xlarge", "app") is False
    assert visibly_differs("m7i.large", "app", "", "") is False


def test_forced_expiry_even_while_draining_eligible_only_when_calm() -> None:
    spec = PlanInput(desired=2, eligible_age=timedelta(hours=1), forced_age=timedelta(hours=5))
    calm = [member("old", 90, registered=True), member("young", 10, registered=True)]
    assert plan_group(spec, calm, NOW).delete[0] == Action("old", Reason.ELIGIBLE_EXPIRY)
    busy = [
        member("ancient", 6 * 60, registered=True),
        member("old", 90, registered=True),
        member("leaving", 1, registered=True, draining=True, delete_at=NOW + timedelta(minutes=1)),
    ]
    plan = plan_group(spec, busy, NOW)
    assert plan.delete == (Action("ancient", Reason.FORCED_EXPIRY),)


def test_next_wakeup_is_the_earliest_deadline() -> None:
    spec = PlanInput(desired=2, eligible_age=timedelta(hours=1))
    members = [
        member("young", 10, registered=True),
        member("leaving", 1, draining=True, delete_at=NOW + timedelta(minutes=2)),
    ]
    assert next_wakeup(spec, members, NOW) == NOW + timedelta(minutes=2)
    assert next_wakeup(PlanInput(desired=1), [member("a", 1)], NOW) is None


# --- health, spot and on-demand expiry -------------------------------------------------------------


def test_a_silent_registered_member_is_replaced_and_drained() -> None:
    limit = timedelta(minutes=3)
    quiet = member("quiet", 30, registered=True, last_seen=NOW - timedelta(minutes=4))
    fine = member("fine", 20, registered=True, last_seen=NOW - timedelta(minutes=1))
    spec = PlanInput(desired=2, drain_timeout=timedelta(minutes=5), silence_limit=limit)
    plan = plan_group(spec, [quiet, fine], NOW)
    assert plan.create == 1
    assert [(a.instance_id, a.reason) for a in plan.drain] == [("quiet", Reason.SILENT)]
    assert plan.delete == ()


def test_a_member_quiet_for_less_than_the_limit_is_left_alone_and_a_wakeup_is_set_for_the_limit() -> None:
    limit = timedelta(minutes=3)
    m = member("a", 30, registered=True, last_seen=NOW - timedelta(minutes=2))
    spec = PlanInput(desired=1, silence_limit=limit)
    assert plan_group(spec, [m], NOW).empty
    assert next_wakeup(spec, [m], NOW) == NOW + timedelta(minutes=1)


def test_a_never_registered_member_is_not_judged_by_health() -> None:
    spec = PlanInput(desired=1, silence_limit=timedelta(minutes=3))
    assert plan_group(spec, [member("new", 60)], NOW).empty


def test_a_spot_notice_replaces_and_drains_without_waiting_for_silence() -> None:
    spec = PlanInput(desired=1, drain_timeout=timedelta(minutes=2), silence_limit=timedelta(minutes=3))
    m = member("spot", 5, registered=True, last_seen=NOW, spot_notice=True)
    plan = plan_group(spec, [m], NOW)
    assert plan.create == 1
    assert [(a.instance_id, a.reason) for a in plan.drain] == [("spot", Reason.SPOT)]


def test_without_a_drain_timeout_a_silent_member_is_deleted_after_its_replacement_is_asked_for() -> None:
    spec = PlanInput(desired=1, silence_limit=timedelta(minutes=3))
    m = member("quiet", 30, registered=True, last_seen=NOW - timedelta(hours=1))
    plan = plan_group(spec, [m], NOW)
    assert plan.create == 1
    assert [a.reason for a in plan.delete] == [Reason.SILENT]


def test_a_replacement_under_way_blocks_drift_rotation() -> None:
    spec = PlanInput(
        desired=2, infra_hash="new", drain_timeout=timedelta(minutes=5), silence_limit=timedelta(minutes=3)
    )
    quiet = member("quiet", 30, registered=True, last_seen=NOW - timedelta(hours=1), infra_hash="new")
    old = member("old", 40, registered=True, last_seen=NOW, infra_hash="old")
    plan = plan_group(spec, [quiet, old], NOW)
    assert [a.instance_id for a in plan.drain] == ["quiet"]


def test_on_demand_members_expire_by_draining_without_replacement() -> None:
    old = member("old", 120, registered=True)
    young = member("young", 10, registered=True)
    plan = plan_on_demand(
        [old, young], ondemand_age=timedelta(hours=1), drain_timeout=timedelta(minutes=5), now=NOW
    )
    assert plan.create == 0
    assert [(a.instance_id, a.reason) for a in plan.drain] == [("old", Reason.ONDEMAND_EXPIRY)]
    assert next_on_demand_wakeup([young], ondemand_age=timedelta(hours=1), now=NOW) == NOW + timedelta(
        minutes=50
    )


def test_an_acknowledged_on_demand_drain_becomes_a_delete() -> None:
    m = member("od", 120, registered=True, draining=True, drain_acked=True)
    plan = plan_on_demand([m], ondemand_age=timedelta(hours=1), drain_timeout=timedelta(minutes=5), now=NOW)
    assert [a.reason for a in plan.delete] == [Reason.DRAIN_COMPLETE]


def test_pass_order_puts_groups_whose_count_differs_from_their_size_first() -> None:
    keys = [("t", "c"), ("t", "a"), ("t", "gone"), ("t", "b"), ("s", "z")]
    sizes = {("t", "a"): 3, ("t", "b"): 2, ("t", "c"): 0, ("s", "z"): 5}
    managed = {("t", "a"): 3, ("t", "b"): 1, ("t", "gone"): 4, ("s", "z"): 6}
    assert pass_order(keys, sizes, managed) == [
        ("s", "z"),  # over its size
        ("t", "b"),  # short of it
        ("t", "gone"),  # removed, still holding instances
        ("t", "a"),  # at its size
        ("t", "c"),  # at its size of 0
    ]
    assert pass_order([], {}, {}) == []
