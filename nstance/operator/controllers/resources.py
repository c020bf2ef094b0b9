"""The Kubernetes resources the controllers read and write, as ``kube.Resource`` values.

Built from the wire names in ``nstance.operator.crds.names`` so there is one spelling of every group,
version and plural. Must not: hold behaviour.
"""

from __future__ import annotations

from typing import Final

from nstance.operator.crds import names
from nstance.operator.kube import Resource

NSTANCE_CLUSTERS: Final = Resource(names.GROUP, names.VERSION, names.NSTANCE_CLUSTERS, names.KIND_CLUSTER)
NSTANCE_MACHINE_POOLS: Final = Resource(
    names.GROUP, names.VERSION, names.NSTANCE_MACHINE_POOLS, names.KIND_MACHINE_POOL
)
NSTANCE_SHARD_GROUPS: Final = Resource(
    names.GROUP, names.VERSION, names.NSTANCE_SHARD_GROUPS, names.KIND_SHARD_GROUP
)
NSTANCE_MACHINES: Final = Resource(names.GROUP, names.VERSION, names.NSTANCE_MACHINES, names.KIND_MACHINE)

CAPI_CLUSTERS: Final = Resource(names.CAPI_GROUP, names.CAPI_VERSION, names.CLUSTERS, names.CAPI_KIND_CLUSTER)
CAPI_MACHINE_POOLS: Final = Resource(
    names.CAPI_GROUP, names.CAPI_VERSION, names.MACHINE_POOLS, names.CAPI_KIND_MACHINE_POOL
)
CAPI_MACHINES: Final = Resource(names.CAPI_GROUP, names.CAPI_VERSION, names.MACHINES, names.CAPI_KIND_MACHINE)

CAPI_CLUSTER_NAME_LABEL: Final = "cluster.x-k8s.io/cluster-name"
"""Label Cluster API puts on every object of a cluster (value at most 63 characters)."""


def infrastructure_ref(kind: str, name: str) -> dict[str, str]:
    """A Cluster API v1beta2 contract reference to one of our objects: ``{apiGroup, kind, name}``."""
    return {"apiGroup": names.GROUP, "kind": kind, "name": name}
