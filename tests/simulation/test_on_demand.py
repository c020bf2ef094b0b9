"""On-demand instances in the simulation: the operator's CreateInstance and DeleteInstance under faults.

The seeds hold every invariant with the calls on, the calls really happen, and the promises have
teeth: a mutation that breaks one in the server is reported.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from nstance.server.reconcile import members as members_module
from nstance.server.reconcile import reconciler as reconciler_module
from nstance.server.shard.shard import Shard
from nstance.simulation.on_demand import OnDemandRequests
from nstance.simulation.run import SeedResult, run_seed

pytestmark = pytest.mark.slow

#: Seeds the tests run with on-demand calls on (under a second each).
SEEDS = range(6)


def _problems(results: list[SeedResult]) -> list[str]:
    return [p for r in results for p in r.problems]


def test_seeds_with_on_demand_instances_hold_every_invariant() -> None:
    results = [run_seed(seed, on_demand=True) for seed in SEEDS]
    assert all(r.ok for r in results), [(r.seed, r.problems[:3]) for r in results]
    acknowledged = [
        line for r in results for line in r.trace if "on-demand" in line and " failed: " not in line
    ]
    # Calls were made and answered: a run that asks for nothing proves nothing.
    assert sum(1 for line in acknowledged if "operator: on-demand" in line) >= 10
    assert any("operator: delete of on-demand" in line for line in acknowledged)


def test_on_demand_calls_are_drawn_on_some_seeds_of_the_default_mix_only() -> None:
    def enabled(seed: int, *, drawn: bool) -> bool:
        world: Any = SimpleNamespace(seed=seed, clock=None)
        return OnDemandRequests(world, drawn=drawn).enabled

    assert 0 < sum(enabled(seed, drawn=True) for seed in range(20)) < 20
    assert not any(enabled(seed, drawn=False) for seed in range(20))


def test_an_acknowledged_delete_that_deletes_nothing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    async def pretends(self: Shard, tenant: str, instance_id: str) -> str:
        return "deleted"

    monkeypatch.setattr(Shard, "delete_instance", pretends)
    problems = _problems([run_seed(seed, on_demand=True) for seed in SEEDS])
    assert any("still runs after an acknowledged DeleteInstance" in p for p in problems), problems


def test_on_demand_instances_planned_as_group_members_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard removed: on-demand rows counted with the group, so scale-downs and drift take them."""
    original = members_module.read_group

    def counted(*args: Any, **kwargs: Any) -> Any:
        rows, managed, on_demand = original(*args, **kwargs)
        return rows, managed + on_demand, []

    monkeypatch.setattr(reconciler_module.group_members, "read_group", counted)
    problems = _problems([run_seed(seed, on_demand=True) for seed in SEEDS])
    assert any("the operator never deleted it" in p or "VMs run," in p for p in problems), problems
