"""Every Kubernetes manifest of the operator, built as plain Python dicts.

Responsible for: the five Nstance CustomResourceDefinitions (schemas from ``models.py`` through
``schema.py``, printer columns, status subresources, Cluster API contract labels), the minimal Cluster API
CRDs our Kubernetes API emulator and e2e tests install, the operator's RBAC (ClusterRole, ServiceAccount,
ClusterRoleBinding), the ``nstance-capi-workload`` ServiceAccount whose tokens the operator puts in Cluster
API's kubeconfig Secret (with its ClusterRole and binding), and the operator's
ValidatingWebhookConfiguration, plus the Helm-specific variants (CRDs that Helm keeps on uninstall, the
ClusterRole rules the chart loads). ``scripts/gen_manifests.py`` writes them
as YAML; tests and the emulator can use the dicts directly.

Must not: import kopf, kubernetes_asyncio, grpc or nstance.rpc, serialise YAML, or touch files.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from nstance.operator.crds import models
from nstance.operator.crds.names import (
    CAPI_GROUP,
    CAPI_KIND_CLUSTER,
    CAPI_KIND_MACHINE,
    CAPI_KIND_MACHINE_POOL,
    CAPI_VERSION,
    CAPI_WORKLOAD_SERVICE_ACCOUNT,
    CATEGORY,
    CLUSTERS,
    DEFAULT_NAMESPACE,
    GROUP,
    MACHINE_POOLS,
    MACHINES,
    NSTANCE_CLUSTERS,
    NSTANCE_MACHINE_POOLS,
    NSTANCE_MACHINE_TEMPLATES,
    NSTANCE_MACHINES,
    NSTANCE_SHARD_GROUPS,
    OPERATOR_NAME,
    VERSION,
    WEBHOOK_CONFIGURATION,
    WEBHOOK_NAME,
    WEBHOOK_PATH,
    WEBHOOK_SERVICE,
)
from nstance.operator.crds.schema import structural_schema

Manifest = dict[str, Any]

# Cluster API finds the provider version to use for a contract through these CRD labels
# (`cluster.x-k8s.io/<contract version>: <provider versions>`).
CAPI_CONTRACT_LABELS: dict[str, str] = {
    "cluster.x-k8s.io/v1beta1": VERSION,
    "cluster.x-k8s.io/v1beta2": VERSION,
}
HELM_KEEP_ANNOTATION: dict[str, str] = {"helm.sh/resource-policy": "keep"}
WEBHOOK_CERTIFICATE = WEBHOOK_SERVICE
"""cert-manager Certificate (in the operator's namespace) whose CA is injected into the webhook config."""

_API_VERSION_DESCRIPTION = (
    "APIVersion defines the versioned schema of this representation of an object. Servers should convert "
    "recognized schemas to the latest internal value, and may reject unrecognized values."
)
_KIND_DESCRIPTION = (
    "Kind is a string value representing the REST resource this object represents. Servers may infer "
    "this from the endpoint the client submits requests to. In CamelCase."
)


@dataclass(frozen=True)
class PrinterColumn:
    """One ``kubectl get`` column (a CRD ``additionalPrinterColumns`` entry)."""

    name: str
    type: str
    json_path: str
    description: str = ""
    priority: int = 0

    def manifest(self) -> Manifest:
        out: Manifest = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            out["description"] = self.description
        if self.priority:
            out["priority"] = self.priority
        return out


AGE = PrinterColumn("Age", "date", ".metadata.creationTimestamp")


@dataclass(frozen=True)
class NstanceKind:
    """Everything needed to build one Nstance CRD."""

    model: type[models.Resource]
    plural: str
    spec_model: type[BaseModel]
    status_model: type[BaseModel] | None
    printer_columns: tuple[PrinterColumn, ...] = field(default=())
    spec_required: bool = True

    @property
    def kind(self) -> str:
        return self.model.KIND

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


NSTANCE_KINDS: tuple[NstanceKind, ...] = (
    NstanceKind(
        model=models.NstanceCluster,
        plural=NSTANCE_CLUSTERS,
        spec_model=models.NstanceClusterSpec,
        status_model=models.NstanceClusterStatus,
        printer_columns=(
            PrinterColumn(
                "Provisioned",
                "boolean",
                ".status.initialization.provisioned",
                "Infrastructure provisioned (always true once reconciled)",
            ),
            PrinterColumn("Endpoint", "string", ".spec.controlPlaneEndpoint.host", "API server host"),
            AGE,
        ),
        spec_required=False,
    ),
    NstanceKind(
        model=models.NstanceMachinePool,
        plural=NSTANCE_MACHINE_POOLS,
        spec_model=models.NstanceMachinePoolSpec,
        status_model=models.NstanceMachinePoolStatus,
        printer_columns=(
            PrinterColumn("Group", "string", ".spec.group", "Nstance group"),
            PrinterColumn("Shards", "string", ".spec.shards", "Shards the group is spread across"),
            PrinterColumn("Replicas", "integer", ".status.replicas", "Instances across all shards"),
            PrinterColumn("Ready", "boolean", ".status.ready", "Every shard group is Ready"),
            PrinterColumn("Static", "boolean", ".status.isStatic", "Backed by static server config"),
            AGE,
        ),
    ),
    NstanceKind(
        model=models.NstanceShardGroup,
        plural=NSTANCE_SHARD_GROUPS,
        spec_model=models.NstanceShardGroupSpec,
        status_model=models.NstanceShardGroupStatus,
        printer_columns=(
            PrinterColumn("Group", "string", ".spec.group", "Nstance group"),
            PrinterColumn("Shard", "string", ".spec.shard", "Shard"),
            PrinterColumn("Size", "integer", ".spec.size", "Desired instances on this shard"),
            PrinterColumn("Replicas", "integer", ".status.replicas", "Instances the shard reports"),
            PrinterColumn(
                "Ready", "string", '.status.conditions[?(@.type=="Ready")].status', "Ready condition"
            ),
            PrinterColumn("Static", "boolean", ".status.isStatic", "Backed by static server config"),
            AGE,
        ),
    ),
    NstanceKind(
        model=models.NstanceMachine,
        plural=NSTANCE_MACHINES,
        spec_model=models.NstanceMachineSpec,
        status_model=models.NstanceMachineStatus,
        printer_columns=(
            PrinterColumn("Group", "string", ".spec.group", "Nstance group"),
            PrinterColumn("Shard", "string", ".status.shard", "Shard that owns the instance"),
            PrinterColumn("Instance", "string", ".status.instanceID", "Nstance instance ID"),
            PrinterColumn("ProviderID", "string", ".status.providerID", "Cloud provider ID"),
            PrinterColumn("Ready", "boolean", ".status.ready", "Instance is running"),
            AGE,
        ),
    ),
    NstanceKind(
        model=models.NstanceMachineTemplate,
        plural=NSTANCE_MACHINE_TEMPLATES,
        spec_model=models.NstanceMachineTemplateSpec,
        status_model=None,
        printer_columns=(
            PrinterColumn("Group", "string", ".spec.template.spec.group", "Nstance group"),
            AGE,
        ),
    ),
)
"""The Nstance kinds, in the order their CRDs are written."""


def _doc(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").split())


def _root_schema(description: str, properties: dict[str, Any], required: list[str]) -> Manifest:
    schema: Manifest = {
        "description": description,
        "type": "object",
        "properties": {
            "apiVersion": {"description": _API_VERSION_DESCRIPTION, "type": "string"},
            "kind": {"description": _KIND_DESCRIPTION, "type": "string"},
            "metadata": {"type": "object"},
            **properties,
        },
    }
    if required:
        schema["required"] = required
    return schema


def nstance_crd(kind: NstanceKind) -> Manifest:
    """The CustomResourceDefinition of one Nstance kind."""
    properties: dict[str, Any] = {"spec": structural_schema(kind.spec_model)}
    if kind.status_model is not None:
        properties["status"] = structural_schema(kind.status_model)
    version: Manifest = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": _root_schema(
                _doc(kind.model), properties, ["spec"] if kind.spec_required else []
            )
        },
    }
    if kind.status_model is not None:
        version["subresources"] = {"status": {}}
    if kind.printer_columns:
        version["additionalPrinterColumns"] = [column.manifest() for column in kind.printer_columns]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.crd_name, "labels": dict(CAPI_CONTRACT_LABELS)},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "categories": [CATEGORY],
            },
            "scope": "Namespaced",
            "versions": [version],
        },
    }


def nstance_crds() -> list[Manifest]:
    """The five Nstance CRDs."""
    return [nstance_crd(kind) for kind in NSTANCE_KINDS]


def helm_crd(crd: Manifest) -> Manifest:
    """A copy of ``crd`` for the Helm chart's ``crds/``: annotated so Helm never deletes it."""
    out = copy.deepcopy(crd)
    annotations = out["metadata"].setdefault("annotations", {})
    annotations.update(HELM_KEEP_ANNOTATION)
    return out


# --- Minimal Cluster API CRDs ----------------------------------------------------------------------------


def _string(description: str) -> Manifest:
    return {"description": description, "type": "string"}


def _open_object(
    description: str, properties: dict[str, Any] | None = None, required: list[str] | None = None
) -> Manifest:
    """An object with the typed ``properties`` we use that keeps every other field (real CAPI has more)."""
    out: Manifest = {
        "description": description,
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    if properties:
        out["properties"] = properties
    if required:
        out["required"] = sorted(required)
    return out


def _contract_reference(description: str) -> Manifest:
    return {
        "description": description,
        "type": "object",
        "properties": {
            "apiGroup": _string("API group of the referenced object."),
            "kind": _string("Kind of the referenced object."),
            "name": _string("Name of the referenced object (same namespace)."),
        },
        "required": ["apiGroup", "kind", "name"],
    }


def _bootstrap() -> Manifest:
    return _open_object(
        "Bootstrap configuration.",
        {"dataSecretName": _string("Secret holding the bootstrap data (may be empty).")},
    )


def _capi_crd(
    kind: str,
    plural: str,
    short_names: list[str],
    description: str,
    spec: Manifest,
    status: Manifest,
    printer_columns: tuple[PrinterColumn, ...],
    subresources: Manifest,
) -> Manifest:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{CAPI_GROUP}"},
        "spec": {
            "group": CAPI_GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": [CATEGORY],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": CAPI_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": _root_schema(description, {"spec": spec, "status": status}, [])
                    },
                    "subresources": subresources,
                    "additionalPrinterColumns": [column.manifest() for column in printer_columns],
                }
            ],
        },
    }


def capi_cluster_crd() -> Manifest:
    """Minimal Cluster API ``Cluster`` CRD: spec.infrastructureRef typed, everything else preserved."""
    return _capi_crd(
        CAPI_KIND_CLUSTER,
        CLUSTERS,
        ["cl"],
        "Minimal Cluster API Cluster for tests and the Kubernetes API emulator.",
        _open_object(
            "Desired state of the cluster.",
            {"infrastructureRef": _contract_reference("The infrastructure cluster (an NstanceCluster).")},
        ),
        _open_object("Observed state of the cluster."),
        (PrinterColumn("Phase", "string", ".status.phase", "Cluster phase"), AGE),
        {"status": {}},
    )


def capi_machine_pool_crd() -> Manifest:
    """Minimal Cluster API ``MachinePool`` CRD with the scale subresource the autoscaler uses."""
    template_spec = _open_object(
        "Spec of the machines in the pool.",
        {
            "clusterName": _string("Name of the owning Cluster."),
            "bootstrap": _bootstrap(),
            "infrastructureRef": _contract_reference("The infrastructure pool (an NstanceMachinePool)."),
        },
    )
    return _capi_crd(
        CAPI_KIND_MACHINE_POOL,
        MACHINE_POOLS,
        ["mp"],
        "Minimal Cluster API MachinePool for tests and the Kubernetes API emulator.",
        _open_object(
            "Desired state of the pool.",
            {
                "clusterName": _string("Name of the owning Cluster."),
                "replicas": {
                    "description": "Desired number of machines (the autoscaler changes this).",
                    "type": "integer",
                    "format": "int32",
                    "minimum": 0,
                },
                "template": _open_object("Template of the pool's machines.", {"spec": template_spec}),
            },
            ["clusterName"],
        ),
        _open_object(
            "Observed state of the pool.",
            {
                "replicas": {
                    "description": "Machines in the pool.",
                    "type": "integer",
                    "format": "int32",
                },
                "selector": _string("Label selector of the pool's machines, for the scale subresource."),
            },
        ),
        (
            PrinterColumn("Cluster", "string", ".spec.clusterName", "Owning cluster"),
            PrinterColumn("Desired", "integer", ".spec.replicas", "Desired machines"),
            PrinterColumn("Replicas", "integer", ".status.replicas", "Machines"),
            AGE,
        ),
        {
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        },
    )


def capi_machine_crd() -> Manifest:
    """Minimal Cluster API ``Machine`` CRD: the spec fields we set and status.nodeRef."""
    return _capi_crd(
        CAPI_KIND_MACHINE,
        MACHINES,
        ["ma"],
        "Minimal Cluster API Machine for tests and the Kubernetes API emulator.",
        _open_object(
            "Desired state of the machine.",
            {
                "clusterName": _string("Name of the owning Cluster."),
                "bootstrap": _bootstrap(),
                "infrastructureRef": _contract_reference("The infrastructure machine (an NstanceMachine)."),
                "failureDomain": _string("Failure domain (for Nstance: the shard) to place the machine in."),
                "providerID": _string("Provider ID of the machine, copied from the infrastructure machine."),
            },
            ["clusterName", "infrastructureRef"],
        ),
        _open_object(
            "Observed state of the machine.",
            {
                "nodeRef": _open_object(
                    "The Kubernetes Node backed by this machine.",
                    {"name": _string("Name of the Node.")},
                )
            },
        ),
        (
            PrinterColumn("Cluster", "string", ".spec.clusterName", "Owning cluster"),
            PrinterColumn("NodeName", "string", ".status.nodeRef.name", "Node backed by this machine"),
            PrinterColumn("ProviderID", "string", ".spec.providerID", "Cloud provider ID"),
            AGE,
        ),
        {"status": {}},
    )


def capi_crds() -> list[Manifest]:
    """The minimal Cluster API CRDs (Cluster, MachinePool, Machine)."""
    return [capi_cluster_crd(), capi_machine_pool_crd(), capi_machine_crd()]


# --- RBAC ------------------------------------------------------------------------------------------------

_ALL_VERBS = ["get", "list", "watch", "create", "update", "patch", "delete"]
_STATUS_VERBS = ["get", "update", "patch"]


def rbac_rules() -> list[Manifest]:
    """The operator's ClusterRole rules (also loaded by the Helm chart from files/rbac-rules.yaml)."""
    with_status = [kind.plural for kind in NSTANCE_KINDS if kind.status_model is not None]
    return [
        {
            "apiGroups": [GROUP],
            "resources": [kind.plural for kind in NSTANCE_KINDS],
            "verbs": list(_ALL_VERBS),
        },
        {
            "apiGroups": [GROUP],
            "resources": [f"{plural}/status" for plural in with_status],
            "verbs": list(_STATUS_VERBS),
        },
        {
            "apiGroups": [GROUP],
            "resources": [f"{kind.plural}/finalizers" for kind in NSTANCE_KINDS],
            "verbs": ["update"],
        },
        {
            "apiGroups": [CAPI_GROUP],
            "resources": [CLUSTERS, MACHINE_POOLS, MACHINES],
            "verbs": list(_ALL_VERBS),
        },
        {
            "apiGroups": [CAPI_GROUP],
            "resources": [f"{CLUSTERS}/status", f"{MACHINE_POOLS}/status", f"{MACHINES}/status"],
            "verbs": list(_STATUS_VERBS),
        },
        # Owner references with blockOwnerDeletion (on-demand Machines owned by their Pod,
        # NstanceMachines owned by their Machine) need update on the owner's finalizers where the
        # OwnerReferencesPermissionEnforcement admission plugin is on.
        {"apiGroups": [CAPI_GROUP], "resources": [f"{MACHINES}/finalizers"], "verbs": ["update"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch", "update"]},
        {"apiGroups": [""], "resources": ["pods/finalizers"], "verbs": ["update"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        },
        # Tokens of the workload ServiceAccount for Cluster API's kubeconfig Secret (TokenRequest).
        {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list", "watch"],
        },
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "verbs": ["get", "list", "watch", "create", "patch"],
        },
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "list", "watch", "create", "update", "patch"],
        },
    ]


def cluster_role() -> Manifest:
    """ClusterRole ``nstance-operator``."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": OPERATOR_NAME},
        "rules": rbac_rules(),
    }


def service_account(namespace: str = DEFAULT_NAMESPACE) -> Manifest:
    """ServiceAccount the operator runs as."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": OPERATOR_NAME, "namespace": namespace},
    }


def cluster_role_binding(namespace: str = DEFAULT_NAMESPACE) -> Manifest:
    """Binds the ClusterRole to the operator's ServiceAccount."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": OPERATOR_NAME},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": OPERATOR_NAME},
        "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_NAME, "namespace": namespace}],
    }


def capi_workload_rules() -> list[Manifest]:
    """What Cluster API may do with the kubeconfig the operator writes (the ``nstance-capi-workload``
    ClusterRole; also loaded by the Helm chart from files/capi-workload-rules.yaml)."""
    return [
        # Its ClusterCache matches MachinePool provider IDs to Nodes.
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        # It GETs its own pod through the kubeconfig to tell whether it runs in the workload cluster; any
        # answer but 200 or 404 (a 403) keeps it from connecting.
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        # Its health probe is a GET of "/", which the system:discovery role does not cover.
        {"nonResourceURLs": ["/"], "verbs": ["get"]},
    ]


def capi_workload_manifests(namespace: str = DEFAULT_NAMESPACE) -> list[Manifest]:
    """ServiceAccount, ClusterRole and ClusterRoleBinding ``nstance-capi-workload``."""
    name = CAPI_WORKLOAD_SERVICE_ACCOUNT
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": capi_workload_rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]


# --- Webhook ---------------------------------------------------------------------------------------------


def webhook_rules() -> list[Manifest]:
    """What the static-group webhook intercepts: UPDATE of NstanceMachinePools."""
    return [
        {
            "apiGroups": [GROUP],
            "apiVersions": [VERSION],
            "operations": ["UPDATE"],
            "resources": [NSTANCE_MACHINE_POOLS],
            "scope": "Namespaced",
        }
    ]


def webhook_configuration(namespace: str = DEFAULT_NAMESPACE) -> Manifest:
    """ValidatingWebhookConfiguration for the static-group rule (cert-manager injects the CA bundle)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": WEBHOOK_CONFIGURATION,
            "annotations": {"cert-manager.io/inject-ca-from": f"{namespace}/{WEBHOOK_CERTIFICATE}"},
        },
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "clientConfig": {
                    "service": {
                        "name": WEBHOOK_SERVICE,
                        "namespace": namespace,
                        "path": WEBHOOK_PATH,
                        "port": 443,
                    }
                },
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "rules": webhook_rules(),
                "sideEffects": "None",
                "timeoutSeconds": 10,
            }
        ],
    }


# --- Output layout ---------------------------------------------------------------------------------------

HELM_CHART_DIR = "deploy/helm/nstance-operator"


def helm_rbac_rules_path() -> str:
    """Where the chart's ClusterRole rules are generated (the template loads them with ``.Files.Get``)."""
    return f"{HELM_CHART_DIR}/files/rbac-rules.yaml"


def helm_capi_workload_rules_path() -> str:
    """Where the chart's ``nstance-capi-workload`` ClusterRole rules are generated."""
    return f"{HELM_CHART_DIR}/files/capi-workload-rules.yaml"


def generated_documents() -> dict[str, list[Any]]:
    """Every generated file (path relative to the repository root) and the YAML documents it holds.

    Most files hold manifests; the chart's ``files/rbac-rules.yaml`` and ``files/capi-workload-rules.yaml``
    each hold one document that is a list of ClusterRole rules.
    """
    out: dict[str, list[Any]] = {}
    for kind, crd in zip(NSTANCE_KINDS, nstance_crds(), strict=True):
        filename = f"{GROUP}_{kind.plural}.yaml"
        out[f"config/crd/bases/{filename}"] = [crd]
        out[f"{HELM_CHART_DIR}/crds/{filename}"] = [helm_crd(crd)]
    for crd in capi_crds():
        out[f"config/crd/capi/{CAPI_GROUP}_{crd['spec']['names']['plural']}.yaml"] = [crd]
    out["config/rbac/role.yaml"] = [cluster_role()]
    out["config/rbac/service_account.yaml"] = [service_account()]
    out["config/rbac/role_binding.yaml"] = [cluster_role_binding()]
    out["config/rbac/capi_workload.yaml"] = capi_workload_manifests()
    out["config/webhook/manifests.yaml"] = [webhook_configuration()]
    out[helm_rbac_rules_path()] = [rbac_rules()]
    out[helm_capi_workload_rules_path()] = [capi_workload_rules()]
    return out
