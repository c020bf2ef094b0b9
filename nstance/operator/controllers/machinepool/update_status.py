"""Step: aggregate the shard groups into the pool's status (and the CAPI providerIDList).

``replicas`` is the sum of the shard groups' running instances, ``ready`` holds when every listed
shard's group is Ready, ``isStatic`` when any shard backs the group with static config (which turns
on restricted editing), ``template``/``subnetPool`` are what the shards report using.
``spec.providerIDList`` (the Cluster API MachinePool contract) is the sorted union of the shard groups'
provider IDs. The Ready condition says which shard groups are not ready and why. Must not: call shards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nstance.operator.conditions import find_condition, is_true
from nstance.operator.controllers.common import generation, meta, spec, status
from nstance.operator.controllers.machinepool.reasons import PoolReason
from nstance.operator.controllers.machinepool.state import PoolState
from nstance.operator.crds.names import READY


@dataclass(frozen=True)
class Aggregate:
    replicas: int
    ready: bool
    is_static: bool
    template: str | None
    subnet_pool: str | None
    provider_ids: list[str]
    waiting: list[str]


def aggregate(shards: list[str], groups: Mapping[str, Mapping[str, Any]]) -> Aggregate:
    """Pure: the pool's view of its shard groups (listed shards only, in order)."""
    replicas, is_static = 0, False
    template: str | None = None
    subnet_pool: str | None = None
    ids: set[str] = set()
    waiting: list[str] = []
    for shard in shards:
        group = groups.get(shard)
        if group is None:
            waiting.append(f"{shard} (no shard group yet)")
            continue
        st = status(group)
        replicas += int(st.get("replicas") or 0)
        is_static = is_static or bool(st.get("isStatic"))
        raw_config = st.get("config")
        config: Mapping[str, Any] = raw_config if isinstance(raw_config, Mapping) else {}
        template = template or (str(config.get("template")) if config.get("template") else None)
        subnet_pool = subnet_pool or (str(config.get("subnetPool")) if config.get("subnetPool") else None)
        ids.update(str(i) for i in st.get("providerIDs") or [])
        conditions = st.get("conditions")
        if not is_true(conditions, READY):
            condition = find_condition(conditions, READY)
            if condition is None:
                waiting.append(f"{shard} (not synced yet)")
            else:
                waiting.append(f"{shard} ({condition.get('reason')}: {condition.get('message')})")
    return Aggregate(
        replicas=replicas,
        ready=not waiting,
        is_static=is_static,
        template=template,
        subnet_pool=subnet_pool,
        provider_ids=sorted(ids),
        waiting=waiting,
    )


@dataclass(frozen=True)
class UpdateStatus:
    name: str = "update_status"

    async def __call__(self, state: PoolState) -> None:
        result = aggregate(state.shards, state.shard_groups)
        if list(spec(state.obj).get("providerIDList") or []) != result.provider_ids:
            state.obj = await state.ctx.kube.patch(
                state.resource, state.name, {"spec": {"providerIDList": result.provider_ids}}, state.namespace
            )
        updates = state.status_updates
        updates["ready"] = result.ready
        updates["replicas"] = result.replicas
        updates["isStatic"] = result.is_static
        updates["template"] = result.template
        updates["subnetPool"] = result.subnet_pool
        updates["observedGeneration"] = generation(state.obj)
        if state.machine_pool is not None:
            updates["observedOwnerGeneration"] = generation(state.machine_pool)
        if result.ready:
            total = sum(state.sizes.values())
            message = f"{len(state.shards)} shard group(s) ready; {result.replicas}/{total} instances running"
            state.set_condition(READY, True, PoolReason.RECONCILED, message)
        else:
            message = "waiting for shard groups: " + "; ".join(result.waiting)
            state.set_condition(READY, False, PoolReason.RECONCILING, message)
        await state.write_status()
        name = str(meta(state.obj).get("name"))
        state.logger.debug("%s: replicas %d, ready %s", name, result.replicas, result.ready)
