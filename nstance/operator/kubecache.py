"""A read cache for the kinds a pool change touches, so reconciles and sync passes read from memory.

``ObjectCache`` keeps, per cached ``Resource`` (NstanceMachinePools, CAPI MachinePools and
NstanceShardGroups by default), every object as the operator last saw it. It is fed by the watch
events kopf hands to the controllers (``observe``) and by the operator's own writes; of two versions
of an object the one with the higher ``metadata.resourceVersion`` wins, and a deleted object leaves a
tombstone so an older version arriving late does not bring it back. Because the event that triggers a
reconcile is put into the cache before the reconcile is queued, a reconcile always reads at least the
version that triggered it.

``CachedKube`` is a ``Kube`` whose reads of cached kinds are answered from the cache:

* ``get`` returns the cached object; a miss (an object no event has shown yet) reads the API server
  and remembers the answer;
* ``list`` with no selector or an equality label selector (``a=b,c=d``) is
  answered from the cache once the kind has been *primed* for that namespace (or cluster-wide) by one
  full list from the API server, which the first such call makes; other selectors go to the server.
  A label selection reads an index of the held objects by (label, value), not every object: a pool
  reconcile lists its own three shard groups, and a burst of pool changes used to scan every shard
  group (and sort them) once per pool;
* ``create``/``patch``/``replace`` remember the object the server returned; a 404 forgets the object
  (and tombstones it), a 409 or 422 marks the cached version stale so the next ``get`` goes to the
  server.

Caveat: a prime list taken before kopf's own first list can hold an object deleted in between, which
no event will ever remove; the first write to it fails with 404 and forgets it. Callers that *refuse*
to act because of what they read (the duplicate-group check) confirm with ``live_list``.

Versions are compared as integers (what kube-apiserver and the emulator send); when either is not an
integer the newest arrival wins. Must not: decide anything about the objects it holds, or write to the
API server except on behalf of its caller.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from nstance.operator.kube import Kube, KubeError, Object, Resource
from nstance.operator.sync_kinds import CAPI_MACHINE_POOLS, NSTANCE_MACHINE_POOLS, NSTANCE_SHARD_GROUPS

log = logging.getLogger(__name__)

Ref = tuple[str, str]
"""(namespace, name); the namespace is "" for cluster-scoped kinds."""

POOL_CHANGE_KINDS: Final = (NSTANCE_MACHINE_POOLS, CAPI_MACHINE_POOLS, NSTANCE_SHARD_GROUPS)
"""The kinds cached by default: what a pool change reads (kopf watches each of them)."""

TOMBSTONES_MAX: Final = 10_000
"""Deleted objects remembered per kind (the oldest are forgotten first)."""


def _ref(obj: Mapping[str, Any]) -> Ref:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _label_pairs(obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The (label, value) pairs a selection can match: both strings, as the API server sends them."""
    return [(k, v) for k, v in _labels(obj).items() if isinstance(k, str) and isinstance(v, str)]


def json_copy(obj: Object) -> Object:
    """A deep copy of a decoded JSON object, as ``copy.deepcopy`` makes it but about four times faster
    (pickle's C code; ``deepcopy`` walks in Python and keeps a memo). The cache copies every object it
    takes in or hands out, several per pool change: with ``deepcopy`` that was a quarter of the
    operator's CPU in a burst. Only this process's own objects are pickled, never outside bytes."""
    copied: Object = pickle.loads(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
    return copied


def version_of(obj: Mapping[str, Any]) -> int | None:
    """``metadata.resourceVersion`` as an integer (None when absent or not a number)."""
    value = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(value) if value.isdigit() else None


def label_equalities(selector: str) -> dict[str, str] | None:
    """``a=b,c==d`` as a mapping; None for any other selector syntax (sets, !=, existence)."""
    wanted: dict[str, str] = {}
    for term in (t.strip() for t in selector.split(",")):
        if not term:
            continue
        if "!" in term or " " in term or "(" in term:
            return None
        key, sep, value = term.replace("==", "=").partition("=")
        if not sep or not key:
            return None
        wanted[key] = value
    return wanted


class KindCache:
    """The objects of one kind."""

    def __init__(self, resource: Resource) -> None:
        self.resource = resource
        self._objects: dict[Ref, Object] = {}
        self._gone: dict[Ref, int | None] = {}
        self._stale: set[Ref] = set()
        self._primed: set[str | None] = set()
        # Objects by each (label, value) they carry, so a label selection reads only its matches; and
        # the held refs in name order, sorted again only when an object comes or goes (not when a
        # newer version of one replaces it: a burst replaces hundreds per second).
        self._by_label: dict[tuple[str, str], set[Ref]] = {}
        self._order: list[Ref] | None = None

    def put(self, obj: Mapping[str, Any]) -> None:
        """Remember ``obj`` unless the cache holds a newer version or a newer deletion."""
        ref = _ref(obj)
        if not ref[1]:
            return
        version = version_of(obj)
        held = self._objects.get(ref)
        if held is not None:
            held_version = version_of(held)
            if version is not None and held_version is not None and version < held_version:
                return
        elif ref in self._gone:
            gone = self._gone[ref]
            if version is not None and gone is not None and version <= gone:
                return
            del self._gone[ref]
        if held is None:
            self._order = None
        else:
            self._unindex(ref, held)
        kept = json_copy(dict(obj))
        self._objects[ref] = kept
        for pair in _label_pairs(kept):
            self._by_label.setdefault(pair, set()).add(ref)
        self._stale.discard(ref)

    def drop(self, obj: Mapping[str, Any]) -> None:
        """``obj`` was deleted (its last version): forget it and keep a tombstone."""
        ref = _ref(obj)
        held = self._objects.pop(ref, None)
        if held is not None:
            self._unindex(ref, held)
            self._order = None
        self._stale.discard(ref)
        self._gone.pop(ref, None)
        self._gone[ref] = version_of(obj)
        while len(self._gone) > TOMBSTONES_MAX:
            del self._gone[next(iter(self._gone))]

    def mark_stale(self, ref: Ref) -> None:
        """The held version is known to be outdated: ``get`` misses until a newer one arrives
        (lists still show the held version, so the object does not vanish from them meanwhile)."""
        if ref in self._objects:
            self._stale.add(ref)

    def get(self, namespace: str, name: str) -> Object | None:
        """A copy of the held object; None when there is none or it is marked stale."""
        ref = (namespace, name)
        obj = self._objects.get(ref)
        return json_copy(obj) if obj is not None and ref not in self._stale else None

    def primed(self, namespace: str | None) -> bool:
        return None in self._primed or namespace in self._primed

    def prime(self, namespace: str | None, objects: Iterable[Mapping[str, Any]]) -> None:
        """A full list of ``namespace`` (None = every namespace) from the API server."""
        for obj in objects:
            self.put(obj)
        self._primed.add(namespace)

    def view(self, namespace: str | None) -> list[Object]:
        """The held objects of ``namespace`` (None = all) themselves, in name order: read only."""
        if self._order is None:
            self._order = sorted(self._objects)
        objects = self._objects
        return [objects[ref] for ref in self._order if namespace is None or ref[0] == namespace]

    def select(self, namespace: str | None, labels: Mapping[str, str]) -> list[Object]:
        """Copies of the objects in ``namespace`` (None = all) carrying every label of ``labels``."""
        if not labels:
            return [json_copy(obj) for obj in self.view(namespace)]
        # The smallest index set of the wanted labels holds every match; check the others on it.
        refs = min((self._by_label.get(pair, set()) for pair in labels.items()), key=len)
        found = []
        for ref in sorted(refs):
            if namespace is not None and ref[0] != namespace:
                continue
            obj = self._objects[ref]
            have = _labels(obj)
            if all(have.get(k) == v for k, v in labels.items()):
                found.append(json_copy(obj))
        return found

    def _unindex(self, ref: Ref, held: Mapping[str, Any]) -> None:
        for pair in _label_pairs(held):
            refs = self._by_label.get(pair)
            if refs is not None:
                refs.discard(ref)
                if not refs:
                    del self._by_label[pair]


class ObjectCache:
    """A ``KindCache`` per cached resource."""

    def __init__(self, resources: Sequence[Resource] = POOL_CHANGE_KINDS) -> None:
        self._kinds = {resource: KindCache(resource) for resource in resources}

    def kind(self, resource: Resource) -> KindCache | None:
        return self._kinds.get(resource)

    def observe(self, resource: Resource, event_type: str | None, obj: Mapping[str, Any]) -> None:
        """A watch event of ``resource`` (kopf's ``type``: None for listed objects, or ADDED,
        MODIFIED, DELETED)."""
        kind = self._kinds.get(resource)
        if kind is None:
            return
        if event_type == "DELETED":
            kind.drop(obj)
        else:
            kind.put(obj)


class CachedKube(Kube):
    """``Kube`` with reads of the cached kinds answered from ``cache`` (see the module docstring)."""

    def __init__(self, kube: Kube, cache: ObjectCache) -> None:
        super().__init__(kube.api)
        self.cache = cache

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> Object | None:
        kind = self.cache.kind(res)
        if kind is not None:
            held = kind.get(namespace or "", name)
            if held is not None:
                return held
        obj = await super().get(res, name, namespace)
        if kind is not None and obj is not None:
            kind.put(obj)
        return obj

    async def live_list(
        self, res: Resource, namespace: str | None = None, *, labels: str = ""
    ) -> list[Object]:
        """A list from the API server itself (for decisions that must not rest on a stale cache)."""
        items = await super().list(res, namespace, labels=labels)
        kind = self.cache.kind(res)
        if kind is not None:
            for item in items:
                kind.put(item)
        return items

    async def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        labels: str = "",
        fields: str = "",
    ) -> list[Object]:
        kind = self.cache.kind(res)
        wanted = label_equalities(labels)
        if kind is None or fields or wanted is None:
            return await super().list(res, namespace, labels=labels, fields=fields)
        if not kind.primed(namespace):
            kind.prime(namespace, await super().list(res, namespace))
        return kind.select(namespace, wanted)

    async def list_view(self, res: Resource, namespace: str | None = None) -> Sequence[Mapping[str, Any]]:
        """The cached objects themselves, no copies (``Kube.list_view``): a sync pass reads every pool
        and shard group, and copying them all on every pass was most of the operator's CPU in a burst."""
        kind = self.cache.kind(res)
        if kind is None:
            return await super().list_view(res, namespace)
        if not kind.primed(namespace):
            kind.prime(namespace, await super().list(res, namespace))
        return kind.view(namespace)

    async def create(self, res: Resource, body: Mapping[str, Any], namespace: str | None = None) -> Object:
        return self._remember(res, await super().create(res, body, namespace))

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        namespace: str | None = None,
        *,
        status: bool = False,
    ) -> Object:
        try:
            written = await super().patch(res, name, patch, namespace, status=status)
        except KubeError as exc:
            self._failed(res, name, namespace, exc)
            raise
        return self._remember(res, written)

    async def replace(
        self, res: Resource, name: str, body: Mapping[str, Any], namespace: str | None = None
    ) -> Object:
        try:
            written = await super().replace(res, name, body, namespace)
        except KubeError as exc:
            self._failed(res, name, namespace, exc)
            raise
        return self._remember(res, written)

    def _remember(self, res: Resource, obj: Object) -> Object:
        kind = self.cache.kind(res)
        if kind is not None and obj:
            kind.put(obj)
        return obj

    def _failed(self, res: Resource, name: str, namespace: str | None, exc: KubeError) -> None:
        kind = self.cache.kind(res)
        if kind is None:
            return
        ref = (namespace or "", name)
        if exc.status == 404:
            kind.drop({"metadata": {"namespace": ref[0], "name": name}})
        elif exc.status in (409, 422):
            kind.mark_stale(ref)
