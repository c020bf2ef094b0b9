"""Admission rule for NstanceMachinePool updates: restricted editing of static groups.

A group defined in a shard's server config is *static*: its template, subnet pool and shards belong to
that config (typically the nodes that run the control plane and this operator), so the API refuses to
change them from Kubernetes. ``status.isStatic`` (aggregated from the shard groups) says whether a pool
is static; while it is true, an update that changes ``spec.template``, ``spec.subnetPool`` or
``spec.shards`` (including their order, which decides where replicas go) is refused with a message that
names the field and what to do. Size (the MachinePool's replicas), ``instanceType`` and ``vars`` stay
editable. Creation and deletion are always allowed. The shard server enforces the same rule for
template and subnet pool; the webhook makes the refusal visible at ``kubectl apply`` time.

Must not: talk to Kubernetes or shards; ``static_pool_change_problem`` is a pure function and the kopf
registration lives in ``handlers.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

RESTRICTED_FIELDS: Final = ("template", "subnetPool", "shards")
"""spec fields of a static pool that cannot change, in the order they are checked."""

_WHY: Final = {
    "template": "a static group's template",
    "subnetPool": "a static group's subnet pool",
    "shards": "a static group's shard list",
}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _normalised(field: str, value: Any) -> Any:
    # An absent field and an empty one mean the same to the server ("use the config's value").
    if field == "shards":
        return list(value) if isinstance(value, list | tuple) else []
    return value or None


def static_pool_change_problem(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """Why the update from ``old`` to ``new`` must be refused, or None when it is allowed."""
    if not _mapping(old.get("status")).get("isStatic"):
        return None
    old_spec, new_spec = _mapping(old.get("spec")), _mapping(new.get("spec"))
    for field in RESTRICTED_FIELDS:
        before = _normalised(field, old_spec.get(field))
        after = _normalised(field, new_spec.get(field))
        if before != after:
            return (
                f"spec.{field} cannot change while the group is static (defined in the shard config); "
                f"remove it from the shard config first ({_WHY[field]} is set there: "
                f"current {before!r}, requested {after!r})"
            )
    return None
