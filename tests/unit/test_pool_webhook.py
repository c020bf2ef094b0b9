"""Restricted editing of static groups: the NstanceMachinePool admission rule (nstance.operator.webhook)."""

from __future__ import annotations

from typing import Any

import pytest

from nstance.operator.webhook import static_pool_change_problem


def pool(*, static: bool, **spec: Any) -> dict[str, Any]:
    base = {
        "group": "control-plane",
        "shards": ["zone-a", "zone-b"],
        "template": "cp",
        "subnetPool": "private",
    }
    return {"spec": {**base, **spec}, "status": {"isStatic": static}}


@pytest.mark.parametrize(
    ("field", "value"),
    [("template", "other"), ("subnetPool", "public"), ("shards", ["zone-a"])],
)
def test_a_static_pool_refuses_restricted_fields(field: str, value: Any) -> None:
    problem = static_pool_change_problem(pool(static=True), pool(static=True, **{field: value}))
    assert problem is not None
    assert problem.startswith(
        f"spec.{field} cannot change while the group is static (defined in the shard config)"
    )
    assert "remove it from the shard config first" in problem
    assert repr(value) in problem


def test_reordering_the_shards_of_a_static_pool_is_refused() -> None:
    # The order decides which shard gets the remainder, so it is part of the shard list.
    problem = static_pool_change_problem(pool(static=True), pool(static=True, shards=["zone-b", "zone-a"]))
    assert problem is not None
    assert problem.startswith("spec.shards cannot change")


def test_clearing_a_restricted_field_of_a_static_pool_is_refused() -> None:
    new = pool(static=True)
    del new["spec"]["template"]
    problem = static_pool_change_problem(pool(static=True), new)
    assert problem is not None
    assert problem.startswith("spec.template cannot change")


@pytest.mark.parametrize(("field", "value"), [("instanceType", "m7i.large"), ("vars", {"role": "cp"})])
def test_a_static_pool_keeps_the_unrestricted_fields_editable(field: str, value: Any) -> None:
    assert static_pool_change_problem(pool(static=True), pool(static=True, **{field: value})) is None


def test_a_dynamic_pool_may_change_everything() -> None:
    changed = pool(static=False, template="other", subnetPool="public", shards=["zone-c"])
    assert static_pool_change_problem(pool(static=False), changed) is None


def test_a_pool_without_status_is_not_static() -> None:
    old = {"spec": {"group": "g", "shards": ["a"], "template": "t"}}
    new = {"spec": {"group": "g", "shards": ["b"], "template": "u"}}
    assert static_pool_change_problem(old, new) is None


def test_absent_and_empty_values_are_the_same() -> None:
    old = pool(static=True)
    old["spec"]["subnetPool"] = ""
    new = pool(static=True)
    del new["spec"]["subnetPool"]
    assert static_pool_change_problem(old, new) is None
