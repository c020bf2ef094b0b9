"""clusterctl provider artifacts: Nstance as a Cluster API infrastructure provider (``deploy/clusterctl/``).

Built from the same models as the CRDs, RBAC and webhook of ``manifests``:

* ``metadata.yaml``: the release series and the Cluster API contract (v1beta2) they implement;
* ``infrastructure-components.yaml``: the Nstance CRDs (labelled with the contract version they serve),
  the operator's ServiceAccount, ClusterRole and binding, the ``nstance-capi-workload`` ServiceAccount
  (with its ClusterRole and binding) whose tokens go into Cluster API's kubeconfig Secret, its Deployment,
  the webhook Service, a cert-manager Issuer and Certificate and the ValidatingWebhookConfiguration. The
  namespace is ``${NSTANCE_NAMESPACE:=nstance-system}`` and the image ``${NSTANCE_OPERATOR_IMAGE:=...}``;
  clusterctl substitutes both. The operator's own ConfigMap (cluster id, tenant, shards), the cluster CA
  ConfigMap and the nonce Secret are not part of it: ``nstance-admin`` makes them for an existing Nstance
  cluster;
* ``cluster-template.yaml``: a Cluster, its NstanceCluster, and a MachinePool with its
  NstanceMachinePool, for ``clusterctl generate cluster NAME --from cluster-template.yaml``.

Pure data: nothing here writes files (``scripts/gen_manifests.py`` does).
"""

from __future__ import annotations

from typing import Any

from nstance.operator.crds.manifests import (
    WEBHOOK_CERTIFICATE,
    capi_workload_manifests,
    cluster_role,
    cluster_role_binding,
    nstance_crds,
    service_account,
    webhook_configuration,
)
from nstance.operator.crds.names import (
    API_VERSION,
    CAPI_API_VERSION,
    CAPI_VERSION,
    GROUP,
    KIND_CLUSTER,
    KIND_MACHINE_POOL,
    OPERATOR_NAME,
    VERSION,
    WEBHOOK_SERVICE,
)

Manifest = dict[str, Any]
DIR = "deploy/clusterctl"
NAMESPACE = "${NSTANCE_NAMESPACE:=nstance-system}"
IMAGE = "${NSTANCE_OPERATOR_IMAGE:=ghcr.io/nstance/nstance:0.1.0}"
RELEASE_SERIES = [{"major": 0, "minor": 1, "contract": CAPI_VERSION}]
PROVIDER_LABEL = {"cluster.x-k8s.io/provider": "infrastructure-nstance"}
WEBHOOK_PORT = 9443


def metadata() -> Manifest:
    return {
        "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
        "kind": "Metadata",
        "releaseSeries": RELEASE_SERIES,
    }


def _labelled(doc: Manifest, extra: dict[str, str] | None = None) -> Manifest:
    meta = doc.setdefault("metadata", {})
    meta["labels"] = {**meta.get("labels", {}), **PROVIDER_LABEL, **(extra or {})}
    return doc


def deployment() -> Manifest:
    labels = {"app.kubernetes.io/name": OPERATOR_NAME}
    env = [
        {"name": "NSTANCE_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NSTANCE_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "NSTANCE_CA_CONFIGMAP", "value": "nstance-cluster-ca"},
        {"name": "NSTANCE_NONCE_SECRET", "value": "nstance-operator-nonce"},
        {"name": "NSTANCE_WEBHOOK_ENABLED", "value": "true"},
        {"name": "NSTANCE_WEBHOOK_PORT", "value": str(WEBHOOK_PORT)},
        {"name": "NSTANCE_WEBHOOK_CERT_DIR", "value": "/etc/nstance/webhook"},
    ]
    container = {
        "name": "operator",
        "image": IMAGE,
        "command": ["nstance-operator"],
        "args": ["--config", "/etc/nstance/operator/config.yaml"],
        "env": env,
        "ports": [
            {"name": "health", "containerPort": 8081, "protocol": "TCP"},
            {"name": "webhook", "containerPort": WEBHOOK_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 20},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "health"}, "periodSeconds": 10},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/nstance/operator", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "webhook-tls", "mountPath": "/etc/nstance/webhook", "readOnly": True},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": OPERATOR_NAME, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": OPERATOR_NAME,
                    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": "nstance-operator-config"}},
                        {"name": "tmp", "emptyDir": {}},
                        {"name": "webhook-tls", "secret": {"secretName": f"{WEBHOOK_SERVICE}-tls"}},
                    ],
                },
            },
        },
    }


def webhook_service() -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": WEBHOOK_SERVICE, "namespace": NAMESPACE},
        "spec": {
            "selector": {"app.kubernetes.io/name": OPERATOR_NAME},
            "ports": [{"port": 443, "targetPort": "webhook", "protocol": "TCP"}],
        },
    }


def certificates() -> list[Manifest]:
    issuer = f"{OPERATOR_NAME}-selfsigned"
    return [
        {
            "apiVersion": "cert-manager.io/v1",
            "kind": "Issuer",
            "metadata": {"name": issuer, "namespace": NAMESPACE},
            "spec": {"selfSigned": {}},
        },
        {
            "apiVersion": "cert-manager.io/v1",
            "kind": "Certificate",
            "metadata": {"name": WEBHOOK_CERTIFICATE, "namespace": NAMESPACE},
            "spec": {
                "dnsNames": [
                    f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc",
                    f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc.cluster.local",
                ],
                "issuerRef": {"kind": "Issuer", "name": issuer},
                "secretName": f"{WEBHOOK_SERVICE}-tls",
            },
        },
    ]


def infrastructure_components() -> list[Manifest]:
    contract = {f"cluster.x-k8s.io/{CAPI_VERSION}": VERSION}
    documents: list[Manifest] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        *(_labelled(crd, contract) for crd in nstance_crds()),
        service_account(NAMESPACE),
        cluster_role(),
        cluster_role_binding(NAMESPACE),
        *capi_workload_manifests(NAMESPACE),
        deployment(),
        webhook_service(),
        *certificates(),
        webhook_configuration(NAMESPACE),
    ]
    return [_labelled(doc) for doc in documents]


def cluster_template() -> list[Manifest]:
    name = "${CLUSTER_NAME}"
    pool = "${CLUSTER_NAME}-workers"
    infra = {"apiGroup": GROUP}
    return [
        {
            "apiVersion": CAPI_API_VERSION,
            "kind": "Cluster",
            "metadata": {"name": name, "namespace": "${NAMESPACE}"},
            "spec": {"infrastructureRef": {**infra, "kind": KIND_CLUSTER, "name": name}},
        },
        {
            "apiVersion": API_VERSION,
            "kind": KIND_CLUSTER,
            "metadata": {"name": name, "namespace": "${NAMESPACE}"},
            "spec": {"controlPlaneEndpoint": {"host": "${CONTROL_PLANE_ENDPOINT_HOST}", "port": 6443}},
        },
        {
            "apiVersion": CAPI_API_VERSION,
            "kind": "MachinePool",
            "metadata": {"name": pool, "namespace": "${NAMESPACE}"},
            "spec": {
                "clusterName": name,
                "replicas": "${WORKER_MACHINE_COUNT:=1}",
                "template": {
                    "spec": {
                        "clusterName": name,
                        "bootstrap": {"dataSecretName": ""},
                        "infrastructureRef": {**infra, "kind": KIND_MACHINE_POOL, "name": pool},
                    }
                },
            },
        },
        {
            "apiVersion": API_VERSION,
            "kind": KIND_MACHINE_POOL,
            "metadata": {"name": pool, "namespace": "${NAMESPACE}"},
            "spec": {
                "group": "${NSTANCE_GROUP:=workers}",
                "shards": "${NSTANCE_SHARDS}",
                "template": "${NSTANCE_TEMPLATE:=app}",
            },
        },
    ]


def clusterctl_documents() -> dict[str, list[Any]]:
    """Every clusterctl artifact (path relative to the repository root) and its YAML documents."""
    return {
        f"{DIR}/metadata.yaml": [metadata()],
        f"{DIR}/infrastructure-components.yaml": infrastructure_components(),
        f"{DIR}/cluster-template.yaml": cluster_template(),
    }
