"""``CachedKube`` against the API emulator: reads answered from memory, write-through, conflicts, 404s.

The emulator counts the requests it served (its ``/metrics`` counters), so "answered from memory"
means no request was made.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from nstance.operator.kube import Kube, KubeError, Object, load_configuration
from nstance.operator.kubecache import CachedKube, ObjectCache
from nstance.operator.sync_kinds import NSTANCE_SHARD_GROUPS
from nstance.testing.kubeapi import KubeAPIServer
from nstance.testing.kubeapi.metrics import RequestKey, parse

REPO = Path(__file__).resolve().parents[2]
NS = "default"


def version(o: Object | None) -> str:
    assert o is not None
    return str(o["metadata"]["resourceVersion"])


@asynccontextmanager
async def cached_kube(tmp_path: Path) -> AsyncIterator[tuple[KubeAPIServer, CachedKube]]:
    async with KubeAPIServer(crds=[REPO / "config" / "crd" / "bases"]) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        kube = Kube.from_configuration(await load_configuration(str(kubeconfig)))
        try:
            yield api, CachedKube(kube, ObjectCache())
        finally:
            await kube.close()


def shard_group(name: str, group: str) -> Object:
    return {
        "metadata": {"name": name, "labels": {"nstance.dev/group": group}},
        "spec": {"group": group, "shard": "s1", "size": 1},
    }


def calls(api: KubeAPIServer, verb: str) -> int:
    return sum(n for k, n in api.request_counts.counts.items() if k.verb == verb)


async def test_reads_are_answered_from_memory_after_one_prime_list(tmp_path: Path) -> None:
    async with cached_kube(tmp_path) as (api, kube):
        await kube.create(NSTANCE_SHARD_GROUPS, shard_group("a--s1", "a"), NS)
        await kube.create(NSTANCE_SHARD_GROUPS, shard_group("b--s1", "b"), NS)
        lists, gets = calls(api, "LIST"), calls(api, "GET")
        found = await kube.list(NSTANCE_SHARD_GROUPS, NS, labels="nstance.dev/group=a")
        assert [o["metadata"]["name"] for o in found] == ["a--s1"]
        assert len(await kube.list(NSTANCE_SHARD_GROUPS, NS)) == 2
        assert calls(api, "LIST") == lists + 1  # the prime list only
        patched = await kube.patch(NSTANCE_SHARD_GROUPS, "a--s1", {"spec": {"size": 2}}, NS)
        held = await kube.get(NSTANCE_SHARD_GROUPS, "a--s1", NS)
        assert held is not None
        assert held["spec"]["size"] == 2
        assert version(held) == version(patched)
        assert calls(api, "GET") == gets
        # A selector the cache cannot evaluate goes to the server.
        await kube.list(NSTANCE_SHARD_GROUPS, NS, labels="nstance.dev/group!=a")
        assert calls(api, "LIST") == lists + 2


async def test_list_view_reads_the_cache_without_copies_and_the_server_without_a_cache(
    tmp_path: Path,
) -> None:
    async with cached_kube(tmp_path) as (api, kube):
        await kube.create(NSTANCE_SHARD_GROUPS, shard_group("b--s1", "b"), NS)
        await kube.create(NSTANCE_SHARD_GROUPS, shard_group("a--s1", "a"), NS)
        lists = calls(api, "LIST")
        first = await kube.list_view(NSTANCE_SHARD_GROUPS, NS)
        second = await kube.list_view(NSTANCE_SHARD_GROUPS, NS)
        assert [o["metadata"]["name"] for o in first] == ["a--s1", "b--s1"]
        assert all(a is b for a, b in zip(first, second, strict=True))  # held objects, not copies
        assert calls(api, "LIST") == lists + 1  # the prime list only
        plain = Kube(kube.api)  # no cache: the same answer, from the server
        assert [o["metadata"]["name"] for o in await plain.list_view(NSTANCE_SHARD_GROUPS, NS)] == [
            "a--s1",
            "b--s1",
        ]
        assert calls(api, "LIST") == lists + 2


async def test_conflict_makes_the_next_get_read_the_server(tmp_path: Path) -> None:
    async with cached_kube(tmp_path) as (api, kube):
        created = await kube.create(NSTANCE_SHARD_GROUPS, shard_group("a--s1", "a"), NS)
        other = Kube(kube.api)
        await other.patch(NSTANCE_SHARD_GROUPS, "a--s1", {"spec": {"size": 5}}, NS)  # behind the cache's back
        stale = {"metadata": {"resourceVersion": version(created)}, "spec": {"size": 3}}
        with pytest.raises(KubeError) as refused:
            await kube.patch(NSTANCE_SHARD_GROUPS, "a--s1", stale, NS)
        assert refused.value.status == 409
        gets = calls(api, "GET")
        fresh = await kube.get(NSTANCE_SHARD_GROUPS, "a--s1", NS)
        assert fresh is not None
        assert fresh["spec"]["size"] == 5
        assert calls(api, "GET") == gets + 1


async def test_not_found_write_forgets_the_object(tmp_path: Path) -> None:
    async with cached_kube(tmp_path) as (_, kube):
        await kube.create(NSTANCE_SHARD_GROUPS, shard_group("a--s1", "a"), NS)
        await Kube(kube.api).delete(NSTANCE_SHARD_GROUPS, "a--s1", NS)
        with pytest.raises(KubeError):
            await kube.patch(NSTANCE_SHARD_GROUPS, "a--s1", {"spec": {"size": 2}}, NS)
        assert await kube.list(NSTANCE_SHARD_GROUPS, NS) == []
        assert await kube.get(NSTANCE_SHARD_GROUPS, "a--s1", NS) is None


async def test_emulator_metrics_name_the_client(tmp_path: Path) -> None:
    async with cached_kube(tmp_path) as (api, kube):
        await kube.create(NSTANCE_SHARD_GROUPS, shard_group("a--s1", "a"), NS)
        async with aiohttp.ClientSession() as session, session.get(f"{api.url}/metrics") as response:
            counts = parse(await response.text())
        key = RequestKey(
            "POST", "infrastructure.cluster.x-k8s.io", "nstanceshardgroups", "", "nstance-operator"
        )
        assert counts[key] == 1
