"""The Kubernetes resources the controllers read and write, as ``kube.Resource`` values.

The kinds every part of the operator uses are defined once in ``nstance.operator.sync_kinds`` (outside
this package, so the read cache and the sync manager need not import the controllers) and named here
again for the controllers; the CAPI Cluster, the cluster-name label and infrastructure references are
the controllers' own. Must not: hold behaviour.
"""

from __future__ import annotations

from typing import Final

from nstance.operator.crds import names
from nstance.operator.kube import Resource
from nstance.operator.sync_kinds import (
    CAPI_MACHINE_POOLS,
    CAPI_MACHINES,
    NSTANCE_CLUSTERS,
    NSTANCE_MACHINE_POOLS,
    NSTANCE_MACHINES,
    NSTANCE_SHARD_GROUPS,
)

__all__ = [
    "CAPI_CLUSTERS",
    "CAPI_CLUSTER_NAME_LABEL",
    "CAPI_MACHINES",
    "CAPI_MACHINE_POOLS",
    "NSTANCE_CLUSTERS",
    "NSTANCE_MACHINES",
    "NSTANCE_MACHINE_POOLS",
    "NSTANCE_SHARD_GROUPS",
    "infrastructure_ref",
]

CAPI_CLUSTERS: Final = Resource(names.CAPI_GROUP, names.CAPI_VERSION, names.CLUSTERS, names.CAPI_KIND_CLUSTER)

CAPI_CLUSTER_NAME_LABEL: Final = "cluster.x-k8s.io/cluster-name"
"""Label Cluster API puts on every object of a cluster (value at most 63 characters)."""


def infrastructure_ref(kind: str, name: str) -> dict[str, str]:
    """A Cluster API v1beta2 contract reference to one of our objects: ``{apiGroup, kind, name}``."""
    return {"apiGroup": names.GROUP, "kind": kind, "name": name}
