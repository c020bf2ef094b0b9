"""docs/server.md's scale-down victim order is the order the planner (``nstance.core.plan``) picks."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from nstance.core.plan import Member, PlanInput, plan_group

PAGE = Path(__file__).resolve().parents[2] / "docs" / "server.md"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _documented_order() -> list[str]:
    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    match = re.search(r"victim order: (.+?) \(", text)
    assert match, "docs/server.md no longer states the victim order"
    return [part.strip() for part in match.group(1).split(", then ")]


def test_the_documented_victim_order_is_the_planners() -> None:
    members = {
        "never-registered": [
            Member(f"u{age}", created_at=NOW - timedelta(hours=age), registered=False) for age in (1, 3)
        ],
        "registered": [
            Member(
                f"r{age}",
                created_at=NOW - timedelta(hours=age),
                registered=True,
                last_seen=NOW,
            )
            for age in (2, 4)
        ],
    }
    expected: list[str] = []
    for category in _documented_order():
        kind, _, within = category.partition(" ")
        assert within == "oldest first", category
        expected += [m.instance_id for m in sorted(members[kind], key=lambda m: m.created_at)]
    plan = plan_group(PlanInput(desired=0), [m for group in members.values() for m in group], NOW)
    assert [action.instance_id for action in plan.delete] == expected == ["u3", "u1", "r4", "r2"]
