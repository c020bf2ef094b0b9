"""Wire names shared by the operator, its manifests and its tests.

Responsible for: the API groups, versions, plurals, kinds, finalizers, labels, annotations and condition
type names that must match upstream Nstance's Cluster API provider exactly (reference §5.4), plus the
shard-group naming rule.

Must not: import kopf, kubernetes_asyncio, grpc or nstance.rpc, or hold any behaviour beyond pure naming.
"""

from __future__ import annotations

from typing import Final

# --- Nstance infrastructure provider API -------------------------------------------------------------

GROUP: Final = "infrastructure.cluster.x-k8s.io"
VERSION: Final = "v1beta1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
CATEGORY: Final = "cluster-api"

NSTANCE_CLUSTERS: Final = "nstanceclusters"
NSTANCE_MACHINE_POOLS: Final = "nstancemachinepools"
NSTANCE_SHARD_GROUPS: Final = "nstanceshardgroups"
NSTANCE_MACHINES: Final = "nstancemachines"
NSTANCE_MACHINE_TEMPLATES: Final = "nstancemachinetemplates"

KIND_CLUSTER: Final = "NstanceCluster"
KIND_MACHINE_POOL: Final = "NstanceMachinePool"
KIND_SHARD_GROUP: Final = "NstanceShardGroup"
KIND_MACHINE: Final = "NstanceMachine"
KIND_MACHINE_TEMPLATE: Final = "NstanceMachineTemplate"

# --- Cluster API core (the objects the operator reads and creates) ------------------------------------

CAPI_GROUP: Final = "cluster.x-k8s.io"
CAPI_VERSION: Final = "v1beta2"
CAPI_API_VERSION: Final = f"{CAPI_GROUP}/{CAPI_VERSION}"

CLUSTERS: Final = "clusters"
MACHINE_POOLS: Final = "machinepools"
MACHINES: Final = "machines"

CAPI_KIND_CLUSTER: Final = "Cluster"
CAPI_KIND_MACHINE_POOL: Final = "MachinePool"
CAPI_KIND_MACHINE: Final = "Machine"

# --- Finalizers ----------------------------------------------------------------------------------------

MACHINE_POOL_FINALIZER: Final = "nstancemachinepool.infrastructure.cluster.x-k8s.io/finalizer"
SHARD_GROUP_FINALIZER: Final = "nstanceshardgroup.infrastructure.cluster.x-k8s.io/finalizer"
MACHINE_FINALIZER: Final = "nstancemachine.infrastructure.cluster.x-k8s.io/finalizer"
ONDEMAND_POD_FINALIZER: Final = "ondemandpod.infrastructure.cluster.x-k8s.io/finalizer"

# --- Labels and annotations ----------------------------------------------------------------------------

GROUP_LABEL: Final = "nstance.dev/group"
SHARD_LABEL: Final = "nstance.dev/shard"
MANAGED_BY_ANNOTATION: Final = "nstance.dev/managed-by"
MANAGED_BY_VALUE: Final = "nstance-operator"

# --- Condition types -----------------------------------------------------------------------------------

READY: Final = "Ready"
SHARD_REACHABLE: Final = "ShardReachable"
CONFIG_VALID: Final = "ConfigValid"
SERVER_DELETED: Final = "ServerDeleted"
DRAINING: Final = "Draining"

CONDITION_TYPES: Final = (READY, SHARD_REACHABLE, CONFIG_VALID, SERVER_DELETED, DRAINING)

# --- Operator deployment (the names the manifests, the Helm chart and the operator agree on) ----------

OPERATOR_NAME: Final = "nstance-operator"
DEFAULT_NAMESPACE: Final = "nstance-system"
CONFIG_CONFIGMAP: Final = "nstance-operator-config"
CONFIG_KEY: Final = "config.yaml"
CONFIG_MOUNT_DIR: Final = "/etc/nstance/operator"
CA_CONFIGMAP: Final = "nstance-cluster-ca"
CA_KEY: Final = "ca.crt"
NONCE_SECRET: Final = "nstance-operator-nonce"
NONCE_KEY: Final = "nonce.jwt"
CERT_SECRET: Final = "nstance-operator-cert"
KEY_SECRET: Final = "nstance-operator-key"
LEADER_ELECTION_LEASE: Final = "nstance-operator-leader-election"
#: Label the replica holding the Lease puts on its own pod (and removes when it stops leading): the
#: webhook Service selects it, because only the leading replica runs kopf and its webhook server.
LEADER_POD_LABEL: Final = "nstance.dev/operator-leader"
HEALTH_PORT: Final = 8081
HEALTH_PATH: Final = "/healthz"
READY_PATH: Final = "/readyz"

WEBHOOK_CONFIGURATION: Final = "nstance-operator"
WEBHOOK_NAME: Final = "nstancemachinepool.validate.nstance.dev"
WEBHOOK_PATH: Final = "/validate-nstancemachinepool"
WEBHOOK_SERVICE: Final = "nstance-operator-webhook"
WEBHOOK_PORT: Final = 9443
WEBHOOK_CERT_DIR: Final = "/etc/nstance/webhook"

# --- Cluster API's access to the workload cluster (Secret ``<cluster>-kubeconfig``) ----------------------

#: ServiceAccount whose short-lived tokens the operator puts in the kubeconfig Secret (upstream's default
#: of ``NSTANCE_CAPI_SERVICEACCOUNT``); its ClusterRole lets Cluster API read Nodes, get pods and ``GET /``.
CAPI_WORKLOAD_SERVICE_ACCOUNT: Final = "nstance-capi-workload"
#: Label Cluster API finds a cluster's Secrets by (value: the Cluster's name).
CAPI_CLUSTER_NAME_LABEL: Final = "cluster.x-k8s.io/cluster-name"
KUBECONFIG_SECRET_SUFFIX: Final = "-kubeconfig"
KUBECONFIG_SECRET_KEY: Final = "value"
#: When the token in the operator-written kubeconfig expires (RFC 3339); also marks the Secret as the
#: operator's (upstream's Go operator writes the same annotation).
TOKEN_EXPIRY_ANNOTATION: Final = "nstance.dev/token-expiry"

# --- Naming rules --------------------------------------------------------------------------------------

SHARD_GROUP_SEPARATOR: Final = "--"


def shard_group_name(group: str, shard: str) -> str:
    """Name of the NstanceShardGroup carrying `group` on `shard`: ``{group}--{shard}``."""
    return f"{group}{SHARD_GROUP_SEPARATOR}{shard}"
