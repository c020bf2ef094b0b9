"""Drain step: evict every pod that must leave the Node, until none is left or the deadline passes.

Pods that must leave: all but DaemonSet and mirror pods (``rules.pods_to_drain``); terminating pods
are waited for, not evicted again. An eviction refused with 429 (a disruption budget) is retried every
``drain_poll`` and recorded once per pod as a NstanceDrainBlocked Event; 404 means the pod is gone.
Must not: evict DaemonSet or mirror pods.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from nstance.operator.context import OperatorContext
from nstance.operator.drain.node_phase import NodePhase
from nstance.operator.drain.reasons import REASON_BLOCKED
from nstance.operator.drain.rules import is_terminating, pod_ref, pods_to_drain
from nstance.operator.drain.state import DrainState, Outcome
from nstance.operator.kube import PODS, KubeError, Object

log = logging.getLogger(__name__)

MAX_CONCURRENT_EVICTIONS: Final = 16
"""Evictions in flight per drained Node."""


@dataclass(frozen=True)
class EvictPods(NodePhase):
    name: str = "evict_pods"

    async def work(self, state: DrainState, node: Object) -> bool:
        ctx = state.ctx
        pods = pods_to_drain(await ctx.kube.list(PODS, fields=f"spec.nodeName={state.node_name}"))
        state.pods_left = [pod_ref(pod) for pod in pods]
        if not pods:
            state.outcome = Outcome.DRAINED
            return True
        refused = await evict_all(ctx, [pod for pod in pods if not is_terminating(pod)])
        for ref in sorted(set(refused) - state.blocked):
            await ctx.kube.event(
                node,
                reason=REASON_BLOCKED,
                message=(
                    f"eviction of pod {ref} refused ({refused[ref]}); retrying every "
                    f"{ctx.timings.drain_poll:g}s until {state.deadline.isoformat()}"
                ),
                warning=True,
            )
        state.blocked |= set(refused)
        return False


async def evict_all(ctx: OperatorContext, pods: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Evict ``pods``; return the ones refused (pod → why). Gone pods count as evicted."""
    limit = asyncio.Semaphore(MAX_CONCURRENT_EVICTIONS)
    refused: dict[str, str] = {}

    async def evict(pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        ref = pod_ref(pod)
        async with limit:
            try:
                await ctx.kube.evict(str(meta.get("name")), str(meta.get("namespace")))
                log.info("evicted pod %s", ref)
            except KubeError as exc:
                if exc.status == 404:
                    return
                if exc.status == 429:
                    refused[ref] = exc.message or "disruption budget"
                    log.info("eviction of pod %s refused (429: %s); will retry", ref, exc.message)
                    return
                refused[ref] = str(exc)
                log.warning("eviction of pod %s failed: %s; will retry", ref, exc)

    await asyncio.gather(*(evict(pod) for pod in pods))
    return refused
