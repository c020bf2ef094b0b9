"""The operator's config edits in the simulation: dynamic groups made and deleted, instance types changed.

The seeds hold every invariant with the edits on, the edits really happen, and each new promise has
teeth: a mutation that breaks it in the server is reported.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from nstance.core import plan as plan_module
from nstance.server.reconcile import reconciler as reconciler_module
from nstance.server.shard.shard import Shard
from nstance.simulation.group_edits import GroupEdits
from nstance.simulation.run import SeedResult, run_seed

pytestmark = pytest.mark.slow

#: Seeds the tests run with the edits on (under a second each). Wide enough for a mutation: on some
#: seeds the last change of an instance type sets the one the group had, or a crash replaced its VMs.
SEEDS = range(6)


def _problems(results: list[SeedResult]) -> list[str]:
    return [p for r in results for p in r.problems]


def test_seeds_with_config_edits_hold_every_invariant() -> None:
    results = [run_seed(seed, group_edits=True) for seed in SEEDS]
    assert all(r.ok for r in results), [(r.seed, r.problems[:3]) for r in results]
    # The edits happened and were acknowledged: a run that changes nothing proves nothing.
    assert sum(r.stats["group_edits"] for r in results) >= 15
    acknowledged = [
        line for r in results for line in r.trace if "operator: " in line and " failed: " not in line
    ]
    for edit in ("instance type m7i.xlarge", "(dynamic) size", "(dynamic) deleted"):
        assert any(edit in line for line in acknowledged), edit


def test_the_edits_are_drawn_on_some_seeds_of_the_default_mix_only() -> None:
    def enabled(seed: int, *, drawn: bool) -> bool:
        world: Any = SimpleNamespace(seed=seed)
        return GroupEdits(world, drawn=drawn).enabled

    assert 0 < sum(enabled(seed, drawn=True) for seed in range(20)) < 20
    assert not any(enabled(seed, drawn=False) for seed in range(20))  # a narrowed fault mix


def test_drift_that_is_never_rotated_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard removed: no member ever counts as drifted, so a changed instance type is never rolled out."""
    monkeypatch.setattr(plan_module, "has_drifted", lambda member, spec: False)
    problems = _problems([run_seed(seed, group_edits=True) for seed in SEEDS])
    assert any(p.startswith("drift: instance") for p in problems), problems


def test_a_deleted_group_that_keeps_its_vms_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard removed: a group the config no longer has is planned as if nothing had to change."""
    original = reconciler_module.plan_group

    def keeps_removed_groups(spec: Any, members: Any, now: Any) -> plan_module.GroupPlan:
        if spec.desired is None:
            return plan_module.GroupPlan()
        return original(spec, members, now)

    monkeypatch.setattr(reconciler_module, "plan_group", keeps_removed_groups)
    problems = _problems([run_seed(seed, group_edits=True) for seed in SEEDS])
    assert any("was deleted, but" in p for p in problems), problems


def test_a_lost_group_deletion_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DeleteGroup acknowledged without being stored."""

    async def forgetful(self: Shard, tenant: str, group: str) -> bool:
        return True

    monkeypatch.setattr(Shard, "delete_group", forgetful)
    problems = _problems([run_seed(seed, group_edits=True) for seed in SEEDS])
    assert any(p.startswith("lost update: group d") and "None" in p for p in problems), problems
