"""Pieces every controller shares: the per-run state base, finalizer steps and change-only writes.

* ``ObjectState`` - the object being reconciled (a dict as the API returned it), its ``Resource``, the
  operator context, a logger that names the object, and the status fields the run wants written.
* ``AddFinalizer`` / ``RemoveFinalizer`` - JSON-patch steps that add or remove one finalizer without
  clobbering finalizers other controllers put there.
* ``merge_diff`` - the smallest JSON merge patch that turns the current fields into the desired ones,
  so a write happens only when something differs (an unchanged object causes no watch event and no
  new reconcile: the loop settles).
* ``WriteStatus`` - the last step of a controller: patch ``/status`` with what the run collected.

Must not: hold controller-specific policy, or call shard servers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nstance.core.steps import Done, Requeue, Step, StepState, run_steps
from nstance.operator.conditions import set_condition
from nstance.operator.context import OperatorContext
from nstance.operator.kube import KubeError, Object, Resource
from nstance.operator.kubecache import CachedKube
from nstance.operator.objectlog import ObjectLogger

log = logging.getLogger("nstance.operator.controllers")


def object_logger(kind: str, namespace: str, name: str) -> ObjectLogger:
    where = f"{namespace}/{name}" if namespace else name
    return ObjectLogger(log, {"object": f"{kind} {where}"})


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    value = obj.get("metadata")
    return value if isinstance(value, Mapping) else {}


def spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    value = obj.get("spec")
    return value if isinstance(value, Mapping) else {}


def status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    value = obj.get("status")
    return value if isinstance(value, Mapping) else {}


def is_deleting(obj: Mapping[str, Any]) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def has_finalizer(obj: Mapping[str, Any], finalizer: str) -> bool:
    return finalizer in (meta(obj).get("finalizers") or [])


def generation(obj: Mapping[str, Any]) -> int:
    return int(meta(obj).get("generation") or 0)


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """UID of the object's controlling owner, if any."""
    for ref in meta(obj).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return str(ref.get("uid") or "")
    return None


async def list_everywhere(
    ctx: OperatorContext, resource: Resource, namespace: str, *, labels: str = "", live: bool = False
) -> list[Object]:
    """Objects of ``resource`` (matching ``labels``) in every namespace, or only in ``namespace`` when
    the operator may not list cluster-wide (a namespaced installation manages its own namespace only).
    ``live`` reads the API server even when the context's client answers from its cache."""
    kube = ctx.kube
    lister = kube.live_list if live and isinstance(kube, CachedKube) else kube.list
    try:
        return await lister(resource, labels=labels)
    except KubeError as exc:
        if exc.status != 403:
            raise
        return await lister(resource, namespace or None, labels=labels)


def merge_diff(
    current: Mapping[str, Any], desired: Mapping[str, Any], *, prune: bool = False
) -> dict[str, Any]:
    """A JSON merge patch turning ``current`` into ``desired`` for the keys of ``desired``.

    A ``None`` in ``desired`` removes the key. Nested mappings are compared key by key and replaced
    exactly (keys missing from the desired nested mapping are removed); ``prune`` applies that rule to
    the top level too. Lists are replaced whole. An empty result means nothing to write.
    """
    patch: dict[str, Any] = {}
    for key, want in desired.items():
        have = current.get(key)
        if want is None:
            if have is not None:
                patch[key] = None
        elif isinstance(want, Mapping) and isinstance(have, Mapping):
            sub = merge_diff(have, want, prune=True)
            if sub:
                patch[key] = sub
        elif isinstance(want, Mapping):
            patch[key] = _without_nones(want)
        elif have != want:
            patch[key] = want
    if prune:
        for key, have in current.items():
            if key not in desired and have is not None:
                patch[key] = None
    return patch


def _without_nones(value: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _without_nones(v) if isinstance(v, Mapping) else v for k, v in value.items() if v is not None}


@dataclass
class ObjectState(StepState):
    """What every controller's steps share; controllers subclass it with their own fields."""

    ctx: OperatorContext
    resource: Resource
    obj: Object
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger]
    status_updates: dict[str, Any] = field(default_factory=dict)
    """Status fields this run decided (merged into /status by ``WriteStatus`` when they differ)."""

    @property
    def name(self) -> str:
        return str(meta(self.obj).get("name", ""))

    @property
    def namespace(self) -> str:
        return str(meta(self.obj).get("namespace", ""))

    def current_status(self) -> Mapping[str, Any]:
        """The object's status with this run's decisions applied."""
        return {**status(self.obj), **self.status_updates}

    def set_condition(
        self, kind: str, value: bool, reason: str, message: str = "", *, with_generation: bool = False
    ) -> None:
        conditions = self.current_status().get("conditions")
        self.status_updates["conditions"] = set_condition(
            conditions,
            kind,
            value,
            reason=reason,
            message=message,
            now=self.ctx.clock.now(),
            observed_generation=generation(self.obj) if with_generation else None,
        )

    async def write_status(self) -> None:
        """Patch /status with ``status_updates`` if anything differs; keep ``obj`` current.

        The patch carries the resourceVersion this run read: lists such as ``conditions`` are
        replaced whole, so a write computed from a stale read would drop what another writer (the
        drain coordinator's ServerDeleted, the sync manager's ShardReachable) put there meanwhile.
        A conflict re-runs the steps on a fresh read instead.
        """
        patch = merge_diff(status(self.obj), self.status_updates)
        self.status_updates = {}
        if not patch:
            return
        body = {
            "metadata": {"resourceVersion": str(meta(self.obj).get("resourceVersion") or "")},
            "status": patch,
        }
        try:
            self.obj = await self.ctx.kube.patch(
                self.resource, self.name, body, self.namespace or None, status=True
            )
        except KubeError as exc:
            if exc.status == 404:
                raise Done("the object is gone") from None
            if exc.status == 409:
                raise Requeue(0, "the object changed while writing its status; reading it again") from None
            raise

    async def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.logger.log(logging.WARNING if warning else logging.INFO, "%s: %s", reason, message)
        await self.ctx.kube.event(self.obj, reason=reason, message=message, warning=warning)


@dataclass(frozen=True)
class AddFinalizer:
    """Put ``finalizer`` on the object so its deletion waits for our delete steps."""

    finalizer: str
    name: str = "add_finalizer"

    async def __call__(self, state: ObjectState) -> None:
        obj = state.obj
        if is_deleting(obj) or has_finalizer(obj, self.finalizer):
            return
        finalizers = list(meta(obj).get("finalizers") or [])
        ops: list[dict[str, Any]]
        if finalizers:
            ops = [{"op": "add", "path": "/metadata/finalizers/-", "value": self.finalizer}]
        else:
            # No list yet: create it, but only if nobody changed the object since we read it.
            version = str(meta(obj).get("resourceVersion") or "")
            ops = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": version},
                {"op": "add", "path": "/metadata/finalizers", "value": [self.finalizer]},
            ]
        state.obj = await _json_patch(state, ops)


@dataclass(frozen=True)
class RemoveFinalizer:
    """Take ``finalizer`` off the object (the last delete step): Kubernetes may then remove it."""

    finalizer: str
    name: str = "remove_finalizer"

    async def __call__(self, state: ObjectState) -> None:
        finalizers = list(meta(state.obj).get("finalizers") or [])
        if self.finalizer not in finalizers:
            return
        index = finalizers.index(self.finalizer)
        ops = [
            {"op": "test", "path": f"/metadata/finalizers/{index}", "value": self.finalizer},
            {"op": "remove", "path": f"/metadata/finalizers/{index}"},
        ]
        state.obj = await _json_patch(state, ops)
        state.logger.info("finalizer %s removed", self.finalizer)


async def _json_patch(state: ObjectState, ops: list[dict[str, Any]]) -> Object:
    try:
        return await state.ctx.kube.patch(state.resource, state.name, ops, state.namespace or None)
    except KubeError as exc:
        if exc.status == 404:
            raise Done("the object is gone") from None
        if exc.status in (409, 422):
            # A "test" operation failed: the object changed since we read it. Read it again.
            raise Requeue(0, f"object changed while patching its finalizers ({exc.message})") from None
        raise


@dataclass(frozen=True)
class WriteStatus:
    """Write the status fields the run collected (no write when nothing changed)."""

    name: str = "write_status"

    async def __call__(self, state: ObjectState) -> None:
        await state.write_status()


S = TypeVar("S", bound="ObjectState")

StateFactory = Callable[[OperatorContext, Resource, Object, ObjectLogger], S]


async def reconcile_object(
    ctx: OperatorContext,
    resource: Resource,
    key: tuple[str, str],
    *,
    finalizer: str | None,
    make_state: StateFactory[S],
    steps: Sequence[Step[S]],
    delete_steps: Sequence[Step[S]],
) -> float | None:
    """Read the object behind ``key`` and run its steps; return when to run again (None = on change).

    An object being deleted runs ``delete_steps`` while it still carries ``finalizer`` (our cleanup is
    pending) and nothing once it does not (someone else's finalizer holds it; not our business).
    """
    namespace, name = key
    obj = await ctx.kube.get(resource, name, namespace or None)
    if obj is None:
        return None
    logger = object_logger(resource.kind, namespace, name)
    if is_deleting(obj):
        if finalizer is None or not has_finalizer(obj, finalizer):
            return None
        chosen = delete_steps
    else:
        chosen = steps
    state = make_state(ctx, resource, obj, logger)
    result = await run_steps(chosen, state, logger)
    return result.requeue_after
