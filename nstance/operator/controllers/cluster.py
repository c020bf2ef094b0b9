"""NstanceCluster controller and ``ensure_cluster``: the Cluster API ownership root, kept trivially ready.

Cluster API needs a ``Cluster`` (with an infrastructure cluster) before it accepts MachinePools and
Machines. Nstance manages infrastructure per pool and machine, so the NstanceCluster is a stub:
``ensure_cluster(ctx)`` (run once by the runtime before kopf starts) creates the NstanceCluster named
``{cluster_id}--{tenant}`` in the operator's namespace with ``spec.controlPlaneEndpoint`` taken from the
API server URL the operator talks to (or the endpoint given: ``NSTANCE_CAPI_ENDPOINT``), marks it
provisioned and Ready, and creates the CAPI ``Cluster`` of the same name referencing it. Every step is
idempotent; an existing NstanceCluster's endpoint is not changed. The kopf handler on NstanceClusters
runs ``STEPS`` (mark provisioned + Ready) for any NstanceCluster, so one created by hand works too.
Cluster API's kubeconfig Secret for the cluster is ``controllers.kubeconfig``'s job.

Must not: delete anything, or call shards.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from nstance.core.steps import Step, run_steps
from nstance.operator.conditions import is_true
from nstance.operator.context import OperatorContext
from nstance.operator.controllers.common import (
    ObjectState,
    object_logger,
    reconcile_object,
    status,
)
from nstance.operator.controllers.resources import CAPI_CLUSTERS, NSTANCE_CLUSTERS, infrastructure_ref
from nstance.operator.crds.names import KIND_CLUSTER, READY
from nstance.operator.kube import KubeError, Object, Resource
from nstance.operator.objectlog import ObjectLogger

log = logging.getLogger(__name__)

PROVISIONED_REASON: Final = "Provisioned"


def control_plane_endpoint(url: str) -> dict[str, Any]:
    """``{host, port}`` of an API server URL (port 443 for https and 80 for http when not given)."""
    parts = urlsplit(url if "://" in url else f"https://{url}")
    if not parts.hostname:
        raise ValueError(f"cannot read a host from the API server address {url!r}")
    port = parts.port or (80 if parts.scheme == "http" else 443)
    return {"host": parts.hostname, "port": port}


@dataclass
class ClusterState(ObjectState):
    """The NstanceCluster run needs nothing beyond the common state."""


def make_state(ctx: OperatorContext, resource: Resource, obj: Object, logger: ObjectLogger) -> ClusterState:
    return ClusterState(ctx=ctx, resource=resource, obj=obj, logger=logger)


@dataclass(frozen=True)
class MarkProvisioned:
    """status.initialization.provisioned = true and Ready=True (no write when already so)."""

    name: str = "mark_provisioned"

    async def __call__(self, state: ObjectState) -> None:
        current = status(state.obj)
        initialization = current.get("initialization") or {}
        if initialization.get("provisioned") is True and is_true(current.get("conditions"), READY):
            return
        state.status_updates["initialization"] = {"provisioned": True}
        state.set_condition(
            READY, True, PROVISIONED_REASON, "Nstance manages infrastructure per pool and machine"
        )
        await state.write_status()


@dataclass(frozen=True)
class EnsureCapiCluster:
    """The CAPI Cluster of the same name, referencing the NstanceCluster (created when missing)."""

    name: str = "ensure_capi_cluster"

    async def __call__(self, state: ObjectState) -> None:
        kube = state.ctx.kube
        if await kube.get(CAPI_CLUSTERS, state.name, state.namespace) is not None:
            return
        body = {
            "metadata": {"name": state.name, "namespace": state.namespace},
            "spec": {"infrastructureRef": infrastructure_ref(KIND_CLUSTER, state.name)},
        }
        try:
            await kube.create(CAPI_CLUSTERS, body, state.namespace)
        except KubeError as exc:
            if exc.status != 409:
                raise
            return
        state.logger.info("created CAPI Cluster %s/%s", state.namespace, state.name)


STEPS: Final[tuple[Step[ClusterState], ...]] = (MarkProvisioned(),)
"""What the kopf handler runs for every NstanceCluster."""

ENSURE_STEPS: Final[tuple[Step[ClusterState], ...]] = (MarkProvisioned(), EnsureCapiCluster())
"""What ``ensure_cluster`` runs after making sure the NstanceCluster exists."""


async def ensure_cluster(ctx: OperatorContext, endpoint: str | None = None) -> None:
    """Create (if missing) and mark ready the NstanceCluster and CAPI Cluster ``ctx.capi_cluster_name``.

    ``endpoint`` (``https://host:port``) overrides the API server address the operator uses (upstream's
    ``NSTANCE_CAPI_ENDPOINT``). Raises ``KubeError`` when the API refuses; the caller retries.
    """
    name, namespace = ctx.capi_cluster_name, ctx.namespace
    address = endpoint or str(ctx.kube.configuration.host or "")
    obj = await ctx.kube.get(NSTANCE_CLUSTERS, name, namespace)
    if obj is None:
        body = {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"controlPlaneEndpoint": control_plane_endpoint(address)},
        }
        try:
            obj = await ctx.kube.create(NSTANCE_CLUSTERS, body, namespace)
            log.info("created NstanceCluster %s/%s (control plane %s)", namespace, name, address)
        except KubeError as exc:
            if exc.status != 409:
                raise
            obj = await ctx.kube.get(NSTANCE_CLUSTERS, name, namespace)
            if obj is None:
                raise
    logger = object_logger(KIND_CLUSTER, namespace, name)
    await run_steps(ENSURE_STEPS, make_state(ctx, NSTANCE_CLUSTERS, obj, logger), logger)


async def reconcile(ctx: OperatorContext, key: tuple[str, str]) -> float | None:
    """The kopf-triggered run for one NstanceCluster."""
    return await reconcile_object(
        ctx,
        NSTANCE_CLUSTERS,
        key,
        finalizer=None,
        make_state=make_state,
        steps=STEPS,
        delete_steps=(),
    )
