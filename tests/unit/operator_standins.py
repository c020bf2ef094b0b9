"""In-memory stand-ins for what operator steps talk to, so each step can be tested on its own in the
unit tier (no socket): the Kubernetes client (objects by kind, namespace and name; merge and JSON
patches with resourceVersion checks; evictions and Events recorded; errors injected per method) and the
shard connections (an Operator API stub whose methods answer from a script).

The watch-fed indexes (Nodes, NstanceMachines) are the real ones, loaded from the stand-in: it answers
their list and never sends a watch event. The whole controllers and coordinator against the API
emulator and real shard servers are the tests in tests/integration/test_operator_*.py.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from nstance.core.clock import ManualClock
from nstance.operator.conditions import find_condition
from nstance.operator.context import OperatorContext, ShardNotConfigured, Timings
from nstance.operator.kube import PODS, KubeError, Object, Resource
from nstance.operator.nodes import NodeIndex

NS = "default"
UNREACHABLE_RETRY = 7.0
ERROR_RETRY = 11.0
RESYNC = 3.0

log = logging.getLogger("test.operator-steps")

S = TypeVar("S")


class FakeKube:
    """Objects by (plural, namespace, name); every write recorded; ``fail[method]`` raises its errors
    one per call before the call does anything."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Object] = {}
        self.events: list[tuple[str, str, bool]] = []
        self.writes: list[tuple[str, str, str]] = []
        self.evicted: list[str] = []
        self.fail: dict[str, list[BaseException]] = defaultdict(list)
        self.refuse_eviction: dict[str, KubeError] = {}
        self._version = 0

    def put(self, res: Resource, obj: Object) -> Object:
        meta = obj.setdefault("metadata", {})
        self._version += 1
        meta["resourceVersion"] = str(self._version)
        self.objects[(res.plural, str(meta.get("namespace") or ""), str(meta["name"]))] = obj
        return obj

    def find(self, res: Resource, name: str, namespace: str = "") -> Object | None:
        return self.objects.get((res.plural, namespace, name))

    def reasons(self) -> list[str]:
        """The reasons of the Events recorded, in order."""
        return [reason for reason, _, _ in self.events]

    def _maybe_fail(self, method: str) -> None:
        if self.fail[method]:
            raise self.fail[method].pop(0)

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> Object | None:
        self._maybe_fail("get")
        found = self.find(res, name, namespace or "")
        return copy.deepcopy(found) if found is not None else None

    async def list_with_version(
        self, res: Resource, namespace: str | None = None, *, labels: str = "", fields: str = ""
    ) -> tuple[list[Object], str]:
        self._maybe_fail("list")
        wanted = _selector(fields)
        labelled = _selector(labels)
        items = [
            copy.deepcopy(obj)
            for (plural, ns, _), obj in sorted(self.objects.items())
            if plural == res.plural
            and (namespace is None or ns == namespace)
            and all((obj.get("spec") or {}).get(key.removeprefix("spec.")) == v for key, v in wanted.items())
            and all(
                ((obj.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in labelled.items()
            )
        ]
        return items, str(self._version)

    async def list(
        self, res: Resource, namespace: str | None = None, *, labels: str = "", fields: str = ""
    ) -> list[Object]:
        items, _ = await self.list_with_version(res, namespace, labels=labels, fields=fields)
        return items

    async def watch(self, *_: Any, **__: Any) -> AsyncIterator[tuple[str, Object]]:
        await asyncio.Event().wait()  # nothing changes behind the test's back
        yield "", {}

    async def create(self, res: Resource, body: Mapping[str, Any], namespace: str | None = None) -> Object:
        self._maybe_fail("create")
        obj = {"apiVersion": res.api_version, "kind": res.kind, **copy.deepcopy(dict(body))}
        meta = obj.setdefault("metadata", {})
        if namespace:
            meta["namespace"] = namespace
        if self.find(res, str(meta["name"]), namespace or "") is not None:
            raise KubeError(409, "AlreadyExists", f"{res.plural} {meta['name']} already exists")
        meta.setdefault("uid", f"uid-{res.plural}-{meta['name']}")
        self.writes.append(("create", res.plural, str(meta["name"])))
        return copy.deepcopy(self.put(res, obj))

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        namespace: str | None = None,
        *,
        status: bool = False,
    ) -> Object:
        self._maybe_fail("patch")
        obj = self.find(res, name, namespace or "")
        if obj is None:
            raise KubeError(404, "NotFound", f"{res.plural} {name} not found")
        if isinstance(patch, Mapping):
            version = (patch.get("metadata") or {}).get("resourceVersion")
            if version and version != obj["metadata"]["resourceVersion"]:
                raise KubeError(409, "Conflict", "the object has been modified")
            _merge(
                obj,
                {
                    **patch,
                    "metadata": {
                        k: v for k, v in (patch.get("metadata") or {}).items() if k != "resourceVersion"
                    },
                },
            )
        else:
            changed = copy.deepcopy(obj)
            for op in patch:
                _json_patch_op(changed, op)
            obj.clear()
            obj.update(changed)
        self.writes.append(("patch", res.plural, name))
        return copy.deepcopy(self.put(res, obj))

    async def delete(self, res: Resource, name: str, namespace: str | None = None, **_: Any) -> bool:
        self._maybe_fail("delete")
        self.writes.append(("delete", res.plural, name))
        return self.objects.pop((res.plural, namespace or "", name), None) is not None

    async def evict(self, name: str, namespace: str, *, grace_period: int | None = None) -> None:
        self._maybe_fail("evict")
        if name in self.refuse_eviction:
            raise self.refuse_eviction[name]
        if self.find(PODS, name, namespace) is None:
            raise KubeError(404, "NotFound", f"pod {name} not found")
        self.evicted.append(f"{namespace}/{name}")
        del self.objects[(PODS.plural, namespace, name)]

    async def event(
        self, obj: Mapping[str, Any], *, reason: str, message: str, warning: bool = False, **_: Any
    ) -> None:
        self.events.append((reason, message, warning))


def _selector(text: str) -> dict[str, str]:
    """An equality selector (``a=1,b=2``) as a mapping."""
    return dict(part.split("=", 1) for part in text.split(",") if part)


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """A JSON merge patch (None removes a key)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _json_patch_op(obj: dict[str, Any], op: Mapping[str, Any]) -> None:
    """One JSON patch operation (test, add, replace, remove); a failed test is the API server's 422."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op["path"]).split("/")[1:]]
    *parents, last = parts
    where: Any = obj
    for part in parents:
        where = where[int(part)] if isinstance(where, list) else where.setdefault(part, {})
    kind = op["op"]
    if kind == "test":
        have = where[int(last)] if isinstance(where, list) and last.isdigit() else where.get(last)
        if have != op["value"]:
            raise KubeError(422, "Invalid", f"test operation failed at {op['path']}")
    elif kind in ("add", "replace"):
        if kind == "replace" and (isinstance(where, list) or last not in where):
            raise KubeError(422, "Invalid", f"nothing to replace at {op['path']}")
        if isinstance(where, list):
            where.insert(len(where) if last == "-" else int(last), op["value"])
        else:
            where[last] = op["value"]
    elif kind == "remove":
        try:
            del where[int(last) if isinstance(where, list) else last]
        except (KeyError, IndexError):
            raise KubeError(422, "Invalid", f"nothing to remove at {op['path']}") from None
    else:
        raise NotImplementedError(kind)


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@dataclass
class ShardStub:
    """An Operator API stub: each call of a method takes the next scripted answer (a response, or an
    exception to raise); a method without a script answers ``default`` (None)."""

    answers: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def count(self, method: str) -> int:
        return sum(1 for name, _ in self.calls if name == method)

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)

        async def answer(request: Any, timeout: float | None = None) -> Any:  # noqa: ASYNC109 - grpc's
            self.calls.append((method, request))
            script = self.answers[method]
            reply = script.pop(0) if script else None
            if isinstance(reply, BaseException):
                raise reply
            return reply

        return answer


@dataclass
class Shards:
    """The shard connections: a stub per configured shard; ``down`` shards are not reachable."""

    stubs: dict[str, ShardStub] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)
    reports: list[tuple[str, bool]] = field(default_factory=list)

    def configured(self) -> Sequence[str]:
        return list(self.stubs)

    def stub(self, shard: str) -> ShardStub:
        if shard not in self.stubs:
            raise ShardNotConfigured(shard)
        return self.stubs[shard]

    def reachable(self, shard: str) -> bool:
        return shard in self.stubs and shard not in self.down

    def report(self, shard: str, ok: bool, error: str = "") -> None:
        self.reports.append((shard, ok))

    async def wait_changed(self) -> None:
        await asyncio.Event().wait()


def context(kube: FakeKube, shards: Shards, clock: ManualClock, **timings: float) -> OperatorContext:
    """An operator context on the stand-ins, with a Node index over ``kube`` (not running yet)."""
    return OperatorContext(
        namespace=NS,
        cluster_id="test",
        tenant="default",
        kube=kube,
        shards=shards,
        nodes=NodeIndex(kube),
        clock=clock,
        timings=Timings(**timings),
    )


@dataclass
class World:
    """The stand-ins for one test: two configured shards ``s1`` and ``s2``, and a manual clock."""

    kube: FakeKube = field(default_factory=FakeKube)
    shards: Shards = field(default_factory=lambda: Shards({"s1": ShardStub(), "s2": ShardStub()}))
    clock: ManualClock = field(default_factory=ManualClock)

    def ctx(self) -> OperatorContext:
        return context(
            self.kube,
            self.shards,
            self.clock,
            unreachable_retry=UNREACHABLE_RETRY,
            error_retry=ERROR_RETRY,
            resync=RESYNC,
        )

    def state(self, make: Callable[..., S], res: Resource, obj: Object) -> S:
        """A run's state for ``obj`` as the API now holds it (stored first, so writes find it)."""
        stored = self.kube.put(res, obj)
        return make(ctx=self.ctx(), resource=res, obj=copy.deepcopy(stored), logger=log)

    def stored(self, res: Resource, name: str) -> Object:
        found = self.kube.find(res, name, NS)
        assert found is not None, f"no {res.kind} {name}"
        return found

    def stub(self, shard: str = "s1") -> ShardStub:
        return self.shards.stubs[shard]


def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The ``kind`` condition of ``obj``'s status (the test fails when there is none)."""
    found = find_condition((obj.get("status") or {}).get("conditions"), kind)
    assert found is not None, f"no {kind} condition in {obj.get('status')}"
    return dict(found)
