"""Kubernetes-style status conditions: read one, and compute the list with one condition set.

``set_condition`` is pure: it returns a new list in which the condition of that type has the given
status, reason and message; ``lastTransitionTime`` changes only when the status changes (the
Kubernetes convention, so ``kubectl`` shows how long a condition has held). Writing the list back to
the API server is the caller's job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

Condition = dict[str, Any]


def timestamp(moment: datetime) -> str:
    """RFC 3339 UTC with a ``Z``, second precision (how the API server writes times)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def find_condition(conditions: Sequence[Mapping[str, Any]] | None, kind: str) -> Mapping[str, Any] | None:
    """The condition of type ``kind``, if present."""
    for condition in conditions or ():
        if condition.get("type") == kind:
            return condition
    return None


def is_true(conditions: Sequence[Mapping[str, Any]] | None, kind: str) -> bool:
    """Whether the condition of type ``kind`` is present with status "True"."""
    condition = find_condition(conditions, kind)
    return condition is not None and condition.get("status") == "True"


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    kind: str,
    status: bool | str,
    *,
    reason: str,
    message: str = "",
    now: datetime,
    observed_generation: int | None = None,
) -> list[Condition]:
    """The conditions with ``kind`` set; other conditions are kept in their order."""
    value = ("True" if status else "False") if isinstance(status, bool) else status
    previous = find_condition(conditions, kind)
    since = (
        str(previous["lastTransitionTime"])
        if previous is not None and previous.get("status") == value and previous.get("lastTransitionTime")
        else timestamp(now)
    )
    updated: Condition = {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if observed_generation is not None:
        updated["observedGeneration"] = observed_generation
    result: list[Condition] = []
    placed = False
    for condition in conditions or ():
        if condition.get("type") == kind:
            result.append(updated)
            placed = True
        else:
            result.append(dict(condition))
    if not placed:
        result.append(updated)
    return result
