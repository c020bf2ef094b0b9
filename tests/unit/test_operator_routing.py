"""Which watch events run which reconciles: status writes do not loop, pools run when their view changes.

The controllers' work queues run counting stand-ins for the reconciles, fed with the events kopf would
deliver for a pool change: the pool controller's spec patch of a shard group, the shard-group
controller's own status write, the sync manager's replica update.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from kubernetes_asyncio.client import Configuration

from nstance.operator.context import OperatorContext
from nstance.operator.controllers import Controllers, Key
from nstance.operator.kube import Kube, Object
from nstance.operator.kubecache import CachedKube, ObjectCache
from nstance.operator.nodes import NodeIndex
from nstance.operator.sync_kinds import NSTANCE_SHARD_GROUPS
from nstance.testing.waiting import eventually

NS = "default"


class NoShards:
    def configured(self) -> list[str]:
        return []


def shard_group(generation: int = 1, **status: Any) -> Object:
    return {
        "metadata": {
            "name": "web--s1",
            "namespace": NS,
            "uid": "sg-uid",
            "generation": generation,
            "resourceVersion": str(10 + generation),
            "ownerReferences": [
                {"kind": "NstanceMachinePool", "name": "web", "uid": "pool-uid", "controller": True}
            ],
        },
        "spec": {"group": "web", "shard": "s1", "size": generation},
        "status": status,
    }


def ready(message: str = "size 1, 1 running") -> list[Object]:
    return [{"type": "Ready", "status": "True", "reason": "SyncSucceeded", "message": message}]


@asynccontextmanager
async def routed() -> AsyncIterator[tuple[Controllers, Counter[str], ObjectCache]]:
    kube = Kube.from_configuration(Configuration(host="http://127.0.0.1:9"))
    cache = ObjectCache()
    ctx = OperatorContext(
        namespace=NS,
        cluster_id="c",
        tenant="default",
        kube=CachedKube(kube, cache),
        shards=NoShards(),  # type: ignore[arg-type]
        nodes=NodeIndex(kube),
    )
    controllers = Controllers(ctx)
    runs: Counter[str] = Counter()

    def counting(name: str) -> Any:
        async def reconcile(key: Key) -> None:
            runs[name] += 1

        return reconcile

    controllers.pools.reconcile = counting("pool")
    controllers.shard_groups.reconcile = counting("shard_group")
    controllers.start()
    try:
        yield controllers, runs, cache
    finally:
        await controllers.stop()
        await kube.close()


async def settled(controllers: Controllers, runs: Counter[str], expected: dict[str, int]) -> None:
    await eventually(lambda: dict(runs) == expected and not controllers.pools.pending, within=5)
    await controllers.wait_idle()


async def test_status_writes_do_not_rerun_the_shard_group() -> None:
    async with routed() as (controllers, runs, _):
        controllers.on_shard_group("ADDED", shard_group(1, observedGeneration=1, conditions=ready()))
        await settled(controllers, runs, {"shard_group": 1, "pool": 1})
        controllers.on_shard_group("MODIFIED", shard_group(2, observedGeneration=1, conditions=ready()))
        await settled(controllers, runs, {"shard_group": 2, "pool": 2})
        # Its own write after UpsertGroup: observedGeneration catches up, lastSyncTime moves.
        own = shard_group(2, observedGeneration=2, conditions=ready(), lastSyncTime="2026-01-01T00:00:01Z")
        controllers.on_shard_group("MODIFIED", own)
        # The sync manager's write: the new instance runs (the pool sums replicas, the shard group not).
        synced = copy.deepcopy(own)
        synced["status"]["replicas"] = 2
        controllers.on_shard_group("MODIFIED", synced)
        await settled(controllers, runs, {"shard_group": 2, "pool": 3})


async def test_clearing_observed_generation_applies_the_group_again() -> None:
    async with routed() as (controllers, runs, _):
        controllers.on_shard_group("ADDED", shard_group(1, observedGeneration=1, conditions=ready()))
        await settled(controllers, runs, {"shard_group": 1, "pool": 1})
        controllers.on_shard_group("MODIFIED", shard_group(1, conditions=ready()))
        await settled(controllers, runs, {"shard_group": 2, "pool": 1})


async def test_a_status_field_the_pool_does_not_use_does_not_run_it() -> None:
    async with routed() as (controllers, runs, _):
        base = shard_group(1, observedGeneration=1, conditions=ready(), replicas=1)
        controllers.on_shard_group("ADDED", base)
        await settled(controllers, runs, {"shard_group": 1, "pool": 1})
        later = copy.deepcopy(base)
        later["status"]["lastSyncTime"] = "2026-01-01T00:00:09Z"
        later["status"]["conditions"].append({"type": "ShardReachable", "status": "True"})
        controllers.on_shard_group("MODIFIED", later)
        deleted = copy.deepcopy(later)
        controllers.on_shard_group("DELETED", deleted)
        await settled(controllers, runs, {"shard_group": 1, "pool": 2})


async def test_events_fill_the_read_cache_before_the_run() -> None:
    async with routed() as (controllers, runs, cache):
        controllers.on_shard_group("ADDED", shard_group(1))
        kind = cache.kind(NSTANCE_SHARD_GROUPS)
        assert kind is not None
        held = kind.get(NS, "web--s1")
        assert held is not None
        assert held["metadata"]["generation"] == 1
        controllers.on_shard_group("DELETED", shard_group(1))
        assert kind.get(NS, "web--s1") is None
        await settled(controllers, runs, {"shard_group": 1, "pool": 1})
