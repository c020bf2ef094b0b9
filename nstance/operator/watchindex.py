"""A generic in-memory index of one kind of Kubernetes object, kept current by list + watch.

``WatchedIndex.run`` lists the objects once, then follows a watch that starts at the list's own
``resourceVersion`` (so nothing written between the LIST and the WATCH is missed), re-watching from the
last version seen when the server ends the stream and re-listing with backoff after a 410 Gone, an
ERROR event or any API or transport failure. Every object is kept by (namespace, name) and under each
lookup key that ``keys_of`` returns for it; ``find`` answers "which object has this key?" and ``get``
"which object has this name?" from memory. ``NodeIndex`` (Nodes by provider ID) and ``MachineIndex``
(NstanceMachines by instance ID) are thin users of it.

It never writes to Kubernetes and never raises for API trouble (``run`` ends only when cancelled).
Objects it returns are snapshots: callers re-read before they compare or write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, Protocol

from nstance.core.backoff import Backoff
from nstance.operator.kube import KubeError, Object, Resource

log = logging.getLogger(__name__)

ObjectRef = tuple[str, str]
"""(namespace, name) of an object; the namespace is "" for cluster-scoped kinds."""


class ListWatch(Protocol):
    """The two Kubernetes calls an index needs (``Kube`` offers both)."""

    async def list_with_version(
        self, res: Resource, namespace: str | None = None, *, labels: str = "", fields: str = ""
    ) -> tuple[list[Object], str]: ...

    def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        labels: str = "",
        resource_version: str = "",
        timeout_seconds: int = 300,
    ) -> AsyncIterator[tuple[str, Object]]: ...


def ref_of(obj: Mapping[str, Any]) -> ObjectRef:
    """(namespace, name) of an object as the API server sent it."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def newest_version(objects: Iterable[Mapping[str, Any]]) -> str:
    """The highest ``metadata.resourceVersion`` among ``objects`` ("" when there is none)."""
    versions = [int(str((obj.get("metadata") or {}).get("resourceVersion") or 0)) for obj in objects]
    return str(max(versions)) if versions else ""


class WatchedIndex:
    """Objects of ``resource`` by lookup key; ``run`` keeps it current, ``find``/``get`` look one up."""

    def __init__(
        self,
        kube: ListWatch,
        resource: Resource,
        keys_of: Callable[[Mapping[str, Any]], Iterable[str]],
        *,
        namespace: str | None = None,
        backoff_base: float = 1.0,
        backoff_cap: float = 30.0,
    ) -> None:
        self._kube = kube
        self._resource = resource
        self._keys_of = keys_of
        self._namespace = namespace
        self._objects: dict[ObjectRef, Object] = {}
        self._by_key: dict[str, ObjectRef] = {}
        self._synced = asyncio.Event()
        self._backoff = Backoff(base=backoff_base, cap=backoff_cap)

    @property
    def synced(self) -> bool:
        """Whether the first full list has been loaded."""
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        """Wait for the first full list."""
        await self._synced.wait()

    def find(self, key: str) -> Object | None:
        """The object indexed under ``key`` (None for an empty key or when none is)."""
        ref = self._by_key.get(key) if key else None
        return self._objects.get(ref) if ref is not None else None

    def get(self, name: str, namespace: str = "") -> Object | None:
        """The object named ``name`` (in ``namespace``; "" for cluster-scoped kinds), if known."""
        return self._objects.get((namespace, name))

    def _put(self, obj: Mapping[str, Any]) -> None:
        ref = ref_of(obj)
        if not ref[1]:
            log.debug("%s without a name in a list or watch; ignored", self._resource.kind)
            return
        self._drop(ref)
        self._objects[ref] = dict(obj)
        for key in self._keys_of(obj):
            if key:
                self._by_key[key] = ref

    def _drop(self, ref: ObjectRef) -> None:
        old = self._objects.pop(ref, None)
        if old is None:
            return
        for key in self._keys_of(old):
            if self._by_key.get(key) == ref:
                del self._by_key[key]

    async def _relist(self) -> str:
        """Replace the contents with a full list; the version the watch starts from."""
        objects, version = await self._kube.list_with_version(self._resource, self._namespace)
        self._objects.clear()
        self._by_key.clear()
        for obj in objects:
            self._put(obj)
        self._synced.set()
        # The watch starts where the list was read. The newest listed object's version is only a fallback
        # for a server that sends none: it can be older than the history the server keeps (a 410 on
        # every watch), or "" for an empty list.
        return version or newest_version(objects)

    async def run(self) -> None:
        """List and watch until cancelled; never raises for API trouble."""
        res, kind = self._resource, self._resource.kind
        attempt = 0
        while True:
            try:
                version = await self._relist()
                attempt = 0
                while True:
                    async for event, obj in self._kube.watch(res, self._namespace, resource_version=version):
                        if event == "ERROR":
                            raise KubeError(int(obj.get("code") or 410), str(obj.get("reason")), "watch")
                        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                        if event == "DELETED":
                            self._drop(ref_of(obj))
                        elif event in ("ADDED", "MODIFIED"):
                            self._put(obj)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any API or transport failure: back off, re-list
                delay = self._backoff.delay(attempt)
                attempt += 1
                log.warning("%s watch interrupted (%s); re-listing in %.1fs", kind, exc, delay)
                await asyncio.sleep(delay)
