"""WatchedIndex (and its users NodeIndex and MachineIndex): list, then watch from the list's version.

Most tests drive the index through a scripted fake of the two Kubernetes calls, so each watch event
and each failure happens exactly when the test says; one test runs it against the in-memory API
server, whose watch history is shorter than the age of the listed objects.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from nstance.operator.drain_machines import MachineIndex
from nstance.operator.kube import NODES, KubeError, Object, Resource
from nstance.operator.nodes import NodeIndex
from nstance.operator.watchindex import WatchedIndex

WatchQueue = asyncio.Queue[tuple[str, Object] | BaseException | None]


def obj(name: str, rv: int, key: str = "", namespace: str = "") -> Object:
    meta: Object = {"name": name, "resourceVersion": str(rv)}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, "spec": {"key": key}}


def keys(o: Any) -> set[str]:
    key = str((o.get("spec") or {}).get("key") or "")
    return {key} if key else set()


class FakeApi:
    """list_with_version answers from ``lists`` (the last one repeats); each watch reads a queue the
    test feeds: an event, an exception to raise, or None to end the stream."""

    def __init__(self, *lists: tuple[list[Object], str] | BaseException) -> None:
        self.lists = list(lists)
        self.list_calls = 0
        self.watch_versions: list[str] = []
        self.watches: asyncio.Queue[WatchQueue] = asyncio.Queue()

    async def list_with_version(
        self, res: Resource, namespace: str | None = None, *, labels: str = "", fields: str = ""
    ) -> tuple[list[Object], str]:
        self.list_calls += 1
        answer = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
        if isinstance(answer, BaseException):
            raise answer
        items, version = answer
        return [dict(item) for item in items], version

    async def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        labels: str = "",
        resource_version: str = "",
        timeout_seconds: int = 300,
    ) -> AsyncIterator[tuple[str, Object]]:
        self.watch_versions.append(resource_version)
        queue: WatchQueue = asyncio.Queue()
        self.watches.put_nowait(queue)
        while True:
            item = await queue.get()
            try:
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
            finally:
                queue.task_done()  # the index has handled the event (or the end of the stream)


async def feed(queue: WatchQueue, *items: tuple[str, Object] | BaseException | None) -> None:
    """Send ``items`` on a watch and return once the index has handled all of them."""
    for item in items:
        queue.put_nowait(item)
    await queue.join()


@contextlib.asynccontextmanager
async def running(index: WatchedIndex | NodeIndex | MachineIndex) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(index.run())
    try:
        yield task
        assert not task.done(), "run() must never end on its own"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def index_of(api: FakeApi) -> WatchedIndex:
    return WatchedIndex(api, NODES, keys, backoff_base=0.001, backoff_cap=0.002)


async def test_the_watch_starts_at_the_lists_own_version_not_the_newest_objects() -> None:
    api = FakeApi(([obj("a", 5, "k-a"), obj("b", 7, "k-b")], "42"))
    index = index_of(api)
    assert not index.synced
    async with running(index):
        await api.watches.get()
        assert index.synced
        assert api.watch_versions == ["42"]
        assert index.find("k-a") == obj("a", 5, "k-a")
        assert index.get("b") == obj("b", 7, "k-b")
        assert index.find("") is None
        assert index.find("k-x") is None


async def test_without_a_list_version_the_watch_starts_at_the_newest_object() -> None:
    api = FakeApi(([obj("a", 5), obj("b", 9), obj("c", 7)], ""))
    async with running(index_of(api)):
        await api.watches.get()
    assert api.watch_versions == ["9"]


async def test_watch_events_add_rekey_and_remove_objects() -> None:
    api = FakeApi(([], "10"))
    index = index_of(api)
    async with running(index):
        watch = await api.watches.get()
        await feed(watch, ("ADDED", obj("b", 11, "k-1")))
        assert index.find("k-1") == obj("b", 11, "k-1")
        await feed(watch, ("MODIFIED", obj("b", 12, "k-2")))
        assert index.find("k-1") is None
        assert index.find("k-2") == obj("b", 12, "k-2")
        await feed(watch, ("DELETED", obj("b", 13, "k-2")))
        assert index.find("k-2") is None
        assert index.get("b") is None


async def test_a_key_taken_over_by_another_object_survives_the_first_ones_deletion() -> None:
    api = FakeApi(([obj("a", 5, "shared")], "6"))
    index = index_of(api)
    async with running(index):
        watch = await api.watches.get()
        await feed(watch, ("ADDED", obj("b", 7, "shared")), ("DELETED", obj("a", 8, "shared")))
        assert index.find("shared") == obj("b", 7, "shared")


async def test_objects_in_different_namespaces_with_one_name_are_kept_apart() -> None:
    api = FakeApi(([obj("m", 1, "i-1", "ns1"), obj("m", 2, "i-2", "ns2")], "3"))
    index = index_of(api)
    async with running(index):
        watch = await api.watches.get()
        await feed(watch, ("DELETED", obj("m", 4, "i-1", "ns1")))
        assert index.find("i-1") is None
        assert index.get("m", "ns2") == obj("m", 2, "i-2", "ns2")


async def test_an_ended_stream_is_watched_again_from_the_last_version_seen_without_a_relist() -> None:
    api = FakeApi(([], "10"))
    async with running(index_of(api)):
        watch = await api.watches.get()
        bookmark: Object = {"metadata": {"resourceVersion": "60"}}
        await feed(watch, ("ADDED", obj("a", 50, "k")), ("BOOKMARK", bookmark), None)
        await api.watches.get()
    assert api.watch_versions == ["10", "60"]
    assert api.list_calls == 1


async def test_a_410_error_event_relists_and_drops_what_disappeared_meanwhile() -> None:
    api = FakeApi(([obj("a", 5, "k-a")], "6"), ([obj("b", 90, "k-b")], "95"))
    index = index_of(api)
    async with running(index):
        watch = await api.watches.get()
        watch.put_nowait(("ERROR", {"code": 410, "reason": "Expired"}))
        await api.watches.get()
        assert api.list_calls == 2
        assert api.watch_versions == ["6", "95"]
        assert index.find("k-a") is None
        assert index.find("k-b") == obj("b", 90, "k-b")


async def test_api_failures_are_retried_and_never_end_the_loop() -> None:
    api = FakeApi(KubeError(500, "InternalError", "etcd is down"), ([obj("a", 5, "k-a")], "6"))
    index = index_of(api)
    async with running(index):
        watch = await api.watches.get()
        assert index.synced
        await feed(watch, ConnectionResetError("stream broke"))
        await api.watches.get()
        assert api.list_calls == 3
        assert index.find("k-a") == obj("a", 5, "k-a")


async def test_node_index_finds_a_node_by_the_servers_provider_instance_id() -> None:
    node = {"metadata": {"name": "node-1", "resourceVersion": "3"}, "spec": {"providerID": "aws:///z/i-123"}}
    bare = {"metadata": {"name": "node-2", "resourceVersion": "4"}, "spec": {}}
    api = FakeApi(([node, bare], "5"))
    nodes = NodeIndex(api, backoff_base=0.001, backoff_cap=0.002)
    async with running(nodes):
        await nodes.wait_synced()
        assert nodes.synced
        assert nodes.find("i-123") == node
        assert nodes.find("aws:///z/i-123") == node
        assert nodes.find("") is None
        assert nodes.get("node-2") == bare


async def test_machine_index_finds_machines_by_instance_id_across_namespaces() -> None:
    def machine(name: str, namespace: str, instance_id: str) -> Object:
        status = {"instanceID": instance_id} if instance_id else {}
        return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"}, "status": status}

    api = FakeApi(([machine("m1", "a", "i-1"), machine("m2", "b", "")], "2"))
    machines = MachineIndex(api, backoff_base=0.001, backoff_cap=0.002)
    async with running(machines):
        watch = await api.watches.get()
        assert machines.synced
        assert machines.find("i-1") == machine("m1", "a", "i-1")
        assert machines.find("") is None
        await feed(watch, ("MODIFIED", machine("m2", "b", "i-2")))
        assert machines.find("i-2") == machine("m2", "b", "i-2")
    assert api.watch_versions == ["2"]
