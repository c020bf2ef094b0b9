"""Step: refuse to manage a group another (older) NstanceMachinePool already manages.

Two pools driving one server group would fight over its size. The oldest pool (by creation time,
then namespace/name) keeps the group; every newer one gets Ready=False reason DuplicateGroup naming
the owner, and the run stops before anything is created. When the older pool goes away, the newer
one takes over on its next run. Every pool carries the label ``nstance.dev/group`` (set here), so the
check lists only the pools claiming this group instead of every pool in the cluster (which made a
burst of N pool changes cost N full lists). Must not: touch shard groups or shards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nstance.core.steps import Done
from nstance.operator.controllers.common import list_everywhere, meta, spec
from nstance.operator.controllers.machinepool.reasons import PoolReason
from nstance.operator.controllers.machinepool.state import PoolState
from nstance.operator.crds.names import GROUP_LABEL, READY


def _age_key(pool: Mapping[str, Any]) -> tuple[str, str, str]:
    m = meta(pool)
    return (str(m.get("creationTimestamp") or ""), str(m.get("namespace") or ""), str(m.get("name") or ""))


def group_owner(pools: Sequence[Mapping[str, Any]], group: str) -> Mapping[str, Any] | None:
    """The pool that manages ``group``: the oldest pool listing it."""
    claiming = [p for p in pools if spec(p).get("group") == group]
    return min(claiming, key=_age_key) if claiming else None


@dataclass(frozen=True)
class CheckDuplicateGroup:
    name: str = "check_duplicate_group"

    async def __call__(self, state: PoolState) -> None:
        labels = meta(state.obj).get("labels") or {}
        if labels.get(GROUP_LABEL) != state.group:
            # Labelled before the check, so a pool created at the same moment finds this one.
            label = {"metadata": {"labels": {GROUP_LABEL: state.group}}}
            await state.ctx.kube.patch(state.resource, state.name, label, state.namespace)
        pools = await list_everywhere(
            state.ctx, state.resource, state.namespace, labels=f"{GROUP_LABEL}={state.group}"
        )
        owner = group_owner(pools, state.group)
        if owner is None or meta(owner).get("uid") == state.uid:
            return
        # Refusing rests on a fresh list, not on the read cache (which may still hold a deleted pool).
        pools = await list_everywhere(
            state.ctx, state.resource, state.namespace, labels=f"{GROUP_LABEL}={state.group}", live=True
        )
        owner = group_owner(pools, state.group)
        if owner is None or meta(owner).get("uid") == state.uid:
            return
        where = f"{meta(owner).get('namespace')}/{meta(owner).get('name')}"
        message = (
            f"group {state.group!r} is already managed by NstanceMachinePool {where}; "
            "delete this pool or change its spec.group"
        )
        state.set_condition(READY, False, PoolReason.DUPLICATE_GROUP, message)
        state.status_updates["ready"] = False
        await state.write_status()
        raise Done(message)
