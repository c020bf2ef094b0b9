"""API addresses (``kube.Resource``) of the kinds the operator reads and writes: the sync manager, the
drain coordinator, the read cache and (through ``controllers.resources``) the controllers.

Responsible for naming them once, from ``crds.names``. Must not hold behaviour or talk to the API.
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
CAPI_MACHINE_POOLS: Final = Resource(
    names.CAPI_GROUP, names.CAPI_VERSION, names.MACHINE_POOLS, names.CAPI_KIND_MACHINE_POOL
)
CAPI_MACHINES: Final = Resource(names.CAPI_GROUP, names.CAPI_VERSION, names.MACHINES, names.CAPI_KIND_MACHINE)
