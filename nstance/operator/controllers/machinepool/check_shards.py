"""Step: the pool's spec must be valid and every listed shard configured; compute per-shard sizes.

The size comes from the MachinePool's ``spec.replicas`` (0 when unset) and is split with
``distribute_replicas`` in ``spec.shards`` order. A shard the operator has no connection settings for
makes the pool Invalid (Ready=False) and the run is retried after ``unreachable_retry``: the shard may
be added to the operator config without a restart. Must not: write shard groups.
"""

from __future__ import annotations

from dataclasses import dataclass

from nstance.core.distribution import distribute_replicas
from nstance.core.steps import Done, Requeue
from nstance.operator.controllers.common import spec
from nstance.operator.controllers.machinepool.reasons import PoolReason
from nstance.operator.controllers.machinepool.state import PoolState
from nstance.operator.crds.models import InvalidResource, NstanceMachinePool
from nstance.operator.crds.names import READY


def desired_replicas(machine_pool: dict[str, object] | None) -> int:
    """The MachinePool's spec.replicas (0 when there is none or it is unset)."""
    if not machine_pool:
        return 0
    value = spec(machine_pool).get("replicas")
    return int(value) if isinstance(value, int) and value > 0 else 0


@dataclass(frozen=True)
class CheckShards:
    name: str = "check_shards"

    async def __call__(self, state: PoolState) -> None:
        try:
            NstanceMachinePool.from_k8s(state.obj)
            sizes = distribute_replicas(desired_replicas(state.machine_pool), state.shards)
        except (InvalidResource, ValueError) as exc:
            message = f"spec is invalid: {exc}; fix the NstanceMachinePool spec"
            state.set_condition(READY, False, PoolReason.INVALID, message)
            state.status_updates["ready"] = False
            await state.write_status()
            raise Done(message) from None
        configured = list(state.ctx.shards.configured())
        missing = [shard for shard in state.shards if shard not in configured]
        if missing:
            message = (
                f"spec.shards lists {', '.join(repr(s) for s in missing)} but the operator config has no "
                f"such shard (configured: {', '.join(configured) or 'none'}); add it to the operator "
                "config or remove it from spec.shards"
            )
            state.set_condition(READY, False, PoolReason.INVALID, message)
            state.status_updates["ready"] = False
            await state.write_status()
            raise Requeue(state.ctx.timings.unreachable_retry, message)
        state.sizes = sizes
