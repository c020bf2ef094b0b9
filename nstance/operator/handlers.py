"""Every kopf registration of the operator: thin handlers that hand work to the controllers.

``register(registry)`` adds to a kopf ``OperatorRegistry``:

* a startup handler that builds ``Controllers(memo.ctx)`` (one work queue per controller), starts its
  workers and keeps it in the memo; a cleanup handler that stops them;
* watch-event handlers (``@kopf.on.event``) for NstanceClusters, NstanceMachinePools, CAPI
  MachinePools, NstanceShardGroups, NstanceMachines, CAPI Machines and on-demand Pods. Each one only
  routes the event to the right work queue keys (``Controllers.on_*``); the reconcile runs in the
  queue's workers, which retry with backoff and honour ``Requeue`` delays;
* the validating admission webhook ``validate-nstancemachinepool`` (UPDATE of NstanceMachinePools),
  refusing changes of a static group's template, subnet pool and shards with HTTP 422 (left out with
  ``webhook=False``; kopf then needs no ``settings.admission.server``).

kopf's change handlers (``on.create``/``on.update`` with ``TemporaryError`` retries) are not used: kopf
supports one finalizer name per operator, while every Nstance kind has its own, wire-compatible with
upstream. The runtime must run kopf cluster-wide (``clusterwide=True``) for on-demand pods in users'
namespaces to be seen; the controllers work the same when kopf is restricted to namespaces.

Every handler is ``async``: kopf runs plain functions in a thread pool, and the work queues are
asyncio objects that must only be touched from the event loop.

Must not: call shards or the Kubernetes API from a handler (the controllers do), or hold state beyond
the memo.
"""

from __future__ import annotations

from typing import Any, Final

import kopf

from nstance.operator.context import OperatorContext
from nstance.operator.controllers import Controllers
from nstance.operator.controllers.ondemand.names import is_on_demand_pod
from nstance.operator.crds import names
from nstance.operator.webhook import static_pool_change_problem

CONTROLLERS_MEMO_KEY: Final = "nstance_controllers"
VALIDATE_POOL_ID: Final = names.WEBHOOK_PATH.lstrip("/")
"""kopf serves a webhook handler at ``/{id}``: the id is the path the webhook manifests point at."""
DEFAULT_WORKERS: Final = 4


def controllers_of(memo: Any) -> Controllers:
    """The running controllers kept in kopf's memo (created by the startup handler)."""
    controllers = memo.get(CONTROLLERS_MEMO_KEY) if isinstance(memo, dict) else None
    if not isinstance(controllers, Controllers):
        raise RuntimeError(
            "the operator's controllers are not running: register() must be used on the registry kopf runs "
            "with, and memo.ctx must hold the OperatorContext"
        )
    return controllers


def _on_demand_filter(body: kopf.Body, **_: Any) -> bool:
    return is_on_demand_pod(body)


def register(
    registry: kopf.OperatorRegistry, *, webhook: bool = True, workers: int = DEFAULT_WORKERS
) -> None:
    """Add every handler of the operator to ``registry`` (see the module docstring).

    ``webhook=False`` leaves the admission handler out: kopf refuses to run with admission handlers
    but no ``settings.admission.server``, so an operator started with webhooks disabled must say so.
    ``workers`` is the number of concurrent reconciles per controller.
    """
    nstance = (names.GROUP, names.VERSION)
    capi = (names.CAPI_GROUP, names.CAPI_VERSION)

    @kopf.on.startup(registry=registry)
    async def start_controllers(memo: kopf.Memo, **_: Any) -> None:
        ctx = memo.get("ctx")
        if not isinstance(ctx, OperatorContext):
            raise kopf.PermanentError(
                "kopf memo has no 'ctx' (OperatorContext); pass memo=kopf.Memo(ctx=ctx)"
            )
        controllers = Controllers(ctx, workers=workers)
        controllers.start()
        memo[CONTROLLERS_MEMO_KEY] = controllers

    @kopf.on.cleanup(registry=registry)
    async def stop_controllers(memo: kopf.Memo, **_: Any) -> None:
        controllers = memo.pop(CONTROLLERS_MEMO_KEY, None)
        if isinstance(controllers, Controllers):
            await controllers.stop()

    @kopf.on.event(*nstance, names.NSTANCE_CLUSTERS, registry=registry)
    async def nstance_cluster_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        controllers_of(memo).on_cluster(type, body)

    @kopf.on.event(*nstance, names.NSTANCE_MACHINE_POOLS, registry=registry)
    async def machine_pool_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        controllers_of(memo).on_pool(type, body)

    @kopf.on.event(*capi, names.MACHINE_POOLS, registry=registry)
    async def capi_machine_pool_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        controllers_of(memo).on_machine_pool(type, body)

    @kopf.on.event(*nstance, names.NSTANCE_SHARD_GROUPS, registry=registry)
    async def shard_group_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        controllers_of(memo).on_shard_group(type, body)

    @kopf.on.event(*nstance, names.NSTANCE_MACHINES, registry=registry)
    async def machine_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        controllers_of(memo).on_machine(type, body)

    @kopf.on.event(*capi, names.MACHINES, registry=registry)
    async def capi_machine_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        controllers_of(memo).on_capi_machine(type, body)

    @kopf.on.event("v1", "pods", when=_on_demand_filter, registry=registry)
    async def on_demand_pod_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        controllers_of(memo).on_pod(type, body)

    if not webhook:
        return

    @kopf.on.validate(
        *nstance, names.NSTANCE_MACHINE_POOLS, id=VALIDATE_POOL_ID, operations=["UPDATE"], registry=registry
    )
    async def validate_machine_pool(body: kopf.Body, old: kopf.Body | None = None, **_: Any) -> None:
        problem = static_pool_change_problem(old or {}, body)
        if problem is not None:
            raise kopf.AdmissionError(problem, code=422)
