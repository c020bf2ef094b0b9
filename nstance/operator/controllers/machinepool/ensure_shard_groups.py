"""Step: one NstanceShardGroup per listed shard, with the pool's config and that shard's size.

Each shard group is named ``{group}--{shard}``, labelled with the group and shard, and controlled by
the pool (owner reference, so Kubernetes garbage-collects it with the pool). Its spec is a copy of the
pool's group, template, instanceType, subnetPool and vars plus the shard's share of the replicas. A
shard group is created when missing and patched only when its spec or labels differ; the shards'
writes are made concurrently. A shard group of
that name that has no controller is adopted; one controlled by another object is left alone and the
pool waits (it is usually the previous pool's, still being deleted).

Must not: delete shard groups (``delete_orphan_shard_groups`` does) or call shards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nstance.core.steps import Requeue
from nstance.operator.controllers.common import controller_uid, is_deleting, merge_diff, meta, spec
from nstance.operator.controllers.machinepool.reasons import PoolReason
from nstance.operator.controllers.machinepool.state import PoolState
from nstance.operator.controllers.resources import NSTANCE_SHARD_GROUPS
from nstance.operator.crds.names import GROUP_LABEL, READY, SHARD_LABEL, shard_group_name
from nstance.operator.kube import KubeError, Object, owner_reference


def shard_group_spec(pool: Mapping[str, Any], shard: str, size: int) -> dict[str, Any]:
    """The spec a pool's shard group should have (``None`` marks fields to remove)."""
    pool_spec = spec(pool)
    variables = pool_spec.get("vars")
    return {
        "group": pool_spec.get("group"),
        "shard": shard,
        "size": size,
        "template": pool_spec.get("template") or None,
        "instanceType": pool_spec.get("instanceType") or None,
        "subnetPool": pool_spec.get("subnetPool") or None,
        "vars": dict(variables) if isinstance(variables, Mapping) and variables else None,
    }


def shard_group_labels(group: str, shard: str) -> dict[str, str]:
    return {GROUP_LABEL: group, SHARD_LABEL: shard}


@dataclass(frozen=True)
class EnsureShardGroups:
    name: str = "ensure_shard_groups"

    async def __call__(self, state: PoolState) -> None:
        kube = state.ctx.kube
        listed = await kube.list(NSTANCE_SHARD_GROUPS, state.namespace, labels=f"{GROUP_LABEL}={state.group}")
        by_name = {str(meta(sg).get("name")): sg for sg in listed}
        state.owned = [sg for sg in listed if controller_uid(sg) == state.uid]
        blocked: list[str] = []

        async def ensure(shard: str, size: int) -> None:
            name = shard_group_name(state.group, shard)
            desired = shard_group_spec(state.obj, shard, size)
            current = by_name.get(name)
            if current is None:
                current = await kube.get(NSTANCE_SHARD_GROUPS, name, state.namespace)
            if current is None:
                state.shard_groups[shard] = await self._create(state, name, shard, desired)
                return
            owner = controller_uid(current)
            if is_deleting(current) or owner not in (None, state.uid):
                blocked.append(name)
                return
            state.shard_groups[shard] = await self._update(
                state, current, shard, desired, adopt=owner is None
            )

        # The shards' writes are independent: made together, a pool change waits for one round trip.
        await asyncio.gather(*(ensure(shard, size) for shard, size in state.sizes.items()))
        state.shard_groups = {
            shard: state.shard_groups[shard] for shard in state.sizes if shard in state.shard_groups
        }
        if blocked:
            order = [shard_group_name(state.group, shard) for shard in state.sizes]
            blocked.sort(key=order.index)
            message = (
                f"NstanceShardGroup {', '.join(blocked)} belongs to another object (or is being deleted); "
                "waiting for it to go away"
            )
            state.set_condition(READY, False, PoolReason.RECONCILING, message)
            await state.write_status()
            raise Requeue(state.ctx.timings.unreachable_retry, message)

    async def _create(self, state: PoolState, name: str, shard: str, desired: dict[str, Any]) -> Object:
        body = {
            "metadata": {
                "name": name,
                "namespace": state.namespace,
                "labels": shard_group_labels(state.group, shard),
                "ownerReferences": [owner_reference(state.obj)],
            },
            "spec": {k: v for k, v in desired.items() if v is not None},
        }
        try:
            created = await state.ctx.kube.create(NSTANCE_SHARD_GROUPS, body, state.namespace)
        except KubeError as exc:
            if exc.status == 409:
                raise Requeue(0, f"NstanceShardGroup {name} appeared while creating it") from None
            raise
        state.logger.info("created NstanceShardGroup %s (size %d)", name, desired["size"])
        return created

    async def _update(
        self, state: PoolState, current: Object, shard: str, desired: dict[str, Any], *, adopt: bool
    ) -> Object:
        patch: dict[str, Any] = {}
        spec_patch = merge_diff(spec(current), desired)
        if spec_patch:
            patch["spec"] = spec_patch
        labels = meta(current).get("labels") or {}
        label_patch = {k: v for k, v in shard_group_labels(state.group, shard).items() if labels.get(k) != v}
        if label_patch:
            patch["metadata"] = {"labels": label_patch}
        if adopt:
            refs = [dict(r) for r in meta(current).get("ownerReferences") or []]
            refs.append(owner_reference(state.obj))
            patch.setdefault("metadata", {})["ownerReferences"] = refs
        if not patch:
            return current
        name = str(meta(current).get("name"))
        updated = await state.ctx.kube.patch(NSTANCE_SHARD_GROUPS, name, patch, state.namespace)
        state.logger.info("updated NstanceShardGroup %s: %s", name, sorted(spec_patch) or "metadata")
        return updated
