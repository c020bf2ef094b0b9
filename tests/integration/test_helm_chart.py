"""The nstance-operator Helm chart, rendered and linted by the real Helm engine.

Helm's Go SDK runs in-process through helm-python-sdk (libhelm_c), so these are the manifests
`helm install nstance-operator deploy/helm/nstance-operator -n nstance-system ...` would apply: with the
default values and with a realistic production override (two shards, CA, registration nonce, webhook with
cert-manager). The checks are what an installer notices: which objects appear, that the operator config
parses into the shape the operator reads, that the Deployment runs non-root with probes, that the
chart's RBAC rules and CRDs are exactly the generated ones in config/, and that an API server (our
Kubernetes API emulator) accepts the CRDs and every rendered object of a kind it serves.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import helm_python as helm
import pytest
import yaml

from nstance.operator import crds
from nstance.operator.crds import manifests
from nstance.testing.kubeapi import KubeAPIServer

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "deploy" / "helm" / "nstance-operator"
RELEASE = "nstance-operator"
NAMESPACE = "nstance-system"

CA_PEM = """-----BEGIN CERTIFICATE-----
MIIBfzCCASWgAwIBAgIUQm9ndXNDQUNlcnRGb3JIZWxtVGVzdDAKBggqhkjOPQQDAjAV
MRMwEQYDVQQDDApuc3RhbmNlLWNhMB4XDTI1MDEwMTAwMDAwMFoXDTM1MDEwMTAwMDAw
-----END CERTIFICATE-----
"""
NONCE = "eyJhbGciOiJFZERTQSIsInR5cCI6IkpXVCJ9.eyJraW5kIjoib3BlcmF0b3IifQ.c2lnbmF0dXJl"

PRODUCTION_VALUES: dict[str, Any] = {
    "image": {"repository": "registry.example.com/nstance", "tag": "1.2.3", "pullPolicy": "Always"},
    "clusterId": "prod",
    "tenant": "acme",
    "shards": {
        "us-west-2a": {"registrationAddr": "[2600:1f18::a]:8990", "operatorAddr": "[2600:1f18::a]:8993"},
        "us-west-2b": {"registrationAddr": "10.0.2.10:8990", "operatorAddr": "10.0.2.10:8993"},
    },
    "caCert": CA_PEM,
    "registrationNonce": NONCE,
    "webhook": {"enabled": True, "certManager": True},
    "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
    "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


def _render(chart: helm.Chart, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    documents: list[dict[str, Any]] = []
    for path in sorted(rendered):
        if not path.endswith(".yaml"):
            continue  # NOTES.txt
        for document in yaml.safe_load_all(rendered[path]):
            if document is not None:
                assert isinstance(document, dict), path
                documents.append(document)
    return documents


def _by_kind(documents: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for document in documents:
        key = (document["kind"], document["metadata"]["name"])
        assert key not in out, f"duplicate {key}"
        out[key] = document
    return out


def _generated(relative: str) -> Any:
    return yaml.safe_load((REPO_ROOT / relative).read_text())


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


# --- Rendering -----------------------------------------------------------------------------------------


def test_default_values_render_the_operator_with_a_cert_manager_webhook(chart: helm.Chart) -> None:
    objects = _by_kind(_render(chart))
    assert set(objects) == {
        ("ServiceAccount", "nstance-operator"),
        ("ClusterRole", "nstance-operator"),
        ("ClusterRoleBinding", "nstance-operator"),
        ("ServiceAccount", crds.CAPI_WORKLOAD_SERVICE_ACCOUNT),
        ("ClusterRole", "nstance-operator-capi-workload"),
        ("ClusterRoleBinding", "nstance-operator-capi-workload"),
        ("ConfigMap", crds.CONFIG_CONFIGMAP),
        ("Deployment", "nstance-operator"),
        ("Service", crds.WEBHOOK_SERVICE),
        ("Service", "nstance-operator-metrics"),
        ("ValidatingWebhookConfiguration", crds.WEBHOOK_CONFIGURATION),
        ("Issuer", "nstance-operator-selfsigned"),
        ("Certificate", "nstance-operator-webhook"),
    }
    for (kind, name), document in objects.items():
        if kind not in ("ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration"):
            assert document["metadata"]["namespace"] == NAMESPACE, (kind, name)
        assert document["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    config = yaml.safe_load(objects[("ConfigMap", crds.CONFIG_CONFIGMAP)]["data"][crds.CONFIG_KEY])
    assert config == {"cluster_id": "", "tenant": "", "shards": {}}
    deployment = objects[("Deployment", "nstance-operator")]
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/nstance/nstance:0.1.0"  # the tag defaults to appVersion


def test_production_values_render_config_ca_nonce_and_webhook(chart: helm.Chart) -> None:
    objects = _by_kind(_render(chart, PRODUCTION_VALUES))
    assert ("Secret", crds.NONCE_SECRET) in objects
    assert ("ConfigMap", crds.CA_CONFIGMAP) in objects

    config = yaml.safe_load(objects[("ConfigMap", crds.CONFIG_CONFIGMAP)]["data"][crds.CONFIG_KEY])
    assert config == {
        "cluster_id": "prod",
        "tenant": "acme",
        "shards": {
            "us-west-2a": {
                "registration_addr": "[2600:1f18::a]:8990",
                "operator_addr": "[2600:1f18::a]:8993",
            },
            "us-west-2b": {"registration_addr": "10.0.2.10:8990", "operator_addr": "10.0.2.10:8993"},
        },
    }
    ca = objects[("ConfigMap", crds.CA_CONFIGMAP)]["data"][crds.CA_KEY]
    assert ca.strip() == CA_PEM.strip()
    secret = objects[("Secret", crds.NONCE_SECRET)]
    assert base64.b64decode(secret["data"][crds.NONCE_KEY]).decode() == NONCE

    certificate = objects[("Certificate", "nstance-operator-webhook")]
    assert certificate["spec"]["dnsNames"] == [
        f"{crds.WEBHOOK_SERVICE}.{NAMESPACE}.svc",
        f"{crds.WEBHOOK_SERVICE}.{NAMESPACE}.svc.cluster.local",
    ]
    deployment = objects[("Deployment", "nstance-operator")]
    pod = deployment["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["webhook-tls"]["secret"]["secretName"] == certificate["spec"]["secretName"]
    assert pod["nodeSelector"] == PRODUCTION_VALUES["nodeSelector"]
    assert pod["tolerations"] == PRODUCTION_VALUES["tolerations"]


def test_deployment_runs_the_operator_non_root_with_probes_and_config(chart: helm.Chart) -> None:
    objects = _by_kind(_render(chart, PRODUCTION_VALUES))
    deployment = objects[("Deployment", "nstance-operator")]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "nstance-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/nstance:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert container["command"] == ["nstance-operator"]
    assert container["args"] == ["--config", f"{crds.CONFIG_MOUNT_DIR}/{crds.CONFIG_KEY}"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = _env(container)
    assert env["NSTANCE_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # leader-election identity
    assert env["NSTANCE_WEBHOOK_PORT"] == str(crds.WEBHOOK_PORT)
    assert env["NSTANCE_WEBHOOK_CERT_DIR"] == crds.WEBHOOK_CERT_DIR
    # Self-managed by default: the operator writes Cluster API's kubeconfig with this account's tokens.
    assert env["NSTANCE_CAPI_SERVICEACCOUNT"] == crds.CAPI_WORKLOAD_SERVICE_ACCOUNT
    assert "NSTANCE_CAPI_ENDPOINT" not in env
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"health": crds.HEALTH_PORT, "webhook": crds.WEBHOOK_PORT}
    assert container["livenessProbe"]["httpGet"] == {"path": crds.HEALTH_PATH, "port": "health"}
    # Readiness: a standby following the Lease, or a leader with its identity and a shard reachable.
    assert container["readinessProbe"]["httpGet"] == {"path": crds.READY_PATH, "port": "health"}
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert mounts["config"] == crds.CONFIG_MOUNT_DIR
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == crds.CONFIG_CONFIGMAP
    # A changed operator config does not restart the pods: the operator follows config.yaml itself.
    default_pod = _by_kind(_render(chart))[("Deployment", "nstance-operator")]["spec"]["template"]
    assert default_pod["metadata"] == deployment["spec"]["template"]["metadata"]


def test_metrics_service_and_service_monitor(chart: helm.Chart) -> None:
    objects = _by_kind(_render(chart))
    assert ("ServiceMonitor", "nstance-operator") not in objects  # opt-in: it needs the CRD
    service = objects[("Service", "nstance-operator-metrics")]
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8081, "targetPort": "health", "protocol": "TCP"}
    ]
    deployment = objects[("Deployment", "nstance-operator")]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "health", "containerPort": 8081, "protocol": "TCP"} in container["ports"]

    values = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}}}}
    objects = _by_kind(_render(chart, values))
    monitor = objects[("ServiceMonitor", "nstance-operator")]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}

    objects = _by_kind(_render(chart, {"metrics": {"enabled": False}}))
    assert ("Service", "nstance-operator-metrics") not in objects


def test_webhook_disabled_renders_no_webhook_objects(chart: helm.Chart) -> None:
    objects = _by_kind(_render(chart, {"webhook": {"enabled": False}}))
    kinds = {kind for kind, _ in objects}
    assert kinds.isdisjoint({"ValidatingWebhookConfiguration", "Issuer", "Certificate"})
    assert [name for kind, name in objects if kind == "Service"] == ["nstance-operator-metrics"]
    (container,) = objects[("Deployment", "nstance-operator")]["spec"]["template"]["spec"]["containers"]
    assert [port["name"] for port in container["ports"]] == ["health"]
    assert _env(container)["NSTANCE_WEBHOOK_ENABLED"] == "false"


def test_webhook_without_cert_manager_uses_the_given_secret_and_ca_bundle(chart: helm.Chart) -> None:
    values = {
        "webhook": {"certManager": False, "tlsSecretName": "my-webhook-tls", "caBundle": "Q0FCVU5ETEU="}
    }
    objects = _by_kind(_render(chart, values))
    assert {kind for kind, _ in objects}.isdisjoint({"Issuer", "Certificate"})
    webhook = objects[("ValidatingWebhookConfiguration", crds.WEBHOOK_CONFIGURATION)]
    assert "annotations" not in webhook["metadata"]
    assert webhook["webhooks"][0]["clientConfig"]["caBundle"] == "Q0FCVU5ETEU="
    pod = objects[("Deployment", "nstance-operator")]["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["webhook-tls"]["secret"]["secretName"] == "my-webhook-tls"
    # Only the replica holding the Lease serves the webhook, so the Service selects the leader's pod.
    service = objects[("Service", crds.WEBHOOK_SERVICE)]
    assert service["spec"]["selector"][crds.LEADER_POD_LABEL] == "true"


def test_missing_values_fail_the_render_naming_the_value(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"webhook\.tlsSecretName is required"):
        chart.render({"webhook": {"certManager": False}}, name=RELEASE, namespace=NAMESPACE)
    with pytest.raises(helm.HelmRenderError, match=r"shards\.us-west-2a\.operatorAddr is required"):
        chart.render(
            {"shards": {"us-west-2a": {"registrationAddr": "10.0.1.10:8990"}}},
            name=RELEASE,
            namespace=NAMESPACE,
        )


def test_install_notes_warn_about_missing_settings(chart: helm.Chart) -> None:
    notes_path = "nstance-operator/templates/NOTES.txt"
    default_notes = chart.render(None, name=RELEASE, namespace=NAMESPACE, is_install=True)[notes_path]
    assert "clusterId is empty" in default_notes
    assert "no shards are configured" in default_notes
    production = chart.render(PRODUCTION_VALUES, name=RELEASE, namespace=NAMESPACE, is_install=True)
    assert "WARNING" not in production[notes_path]
    assert "kubectl -n nstance-system logs deploy/nstance-operator" in production[notes_path]


def test_lint_strict_passes() -> None:
    report = helm.lint(CHART_DIR, PRODUCTION_VALUES, strict=True, namespace=NAMESPACE)
    problems = [message for message in report["messages"] if message["severity"] >= 2]
    assert report["errors"] == []
    assert problems == []


# --- The chart agrees with the generated manifests -----------------------------------------------------


def test_cluster_role_rules_equal_config_rbac(chart: helm.Chart) -> None:
    objects = _by_kind(_render(chart))
    assert (
        objects[("ClusterRole", "nstance-operator")]["rules"] == _generated("config/rbac/role.yaml")["rules"]
    )
    assert objects[("ClusterRole", "nstance-operator")]["rules"] == manifests.rbac_rules()
    binding = objects[("ClusterRoleBinding", "nstance-operator")]
    generated_binding = _generated("config/rbac/role_binding.yaml")
    assert binding["roleRef"] == generated_binding["roleRef"]
    assert binding["subjects"] == generated_binding["subjects"]


def test_capi_workload_account_and_rules_equal_config_rbac(chart: helm.Chart) -> None:
    objects = _by_kind(_render(chart))
    generated = list(yaml.safe_load_all((REPO_ROOT / "config/rbac/capi_workload.yaml").read_text()))
    generated_role = next(doc for doc in generated if doc["kind"] == "ClusterRole")
    role = objects[("ClusterRole", "nstance-operator-capi-workload")]
    assert role["rules"] == generated_role["rules"] == manifests.capi_workload_rules()
    binding = objects[("ClusterRoleBinding", "nstance-operator-capi-workload")]
    assert binding["roleRef"]["name"] == "nstance-operator-capi-workload"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": crds.CAPI_WORKLOAD_SERVICE_ACCOUNT, "namespace": NAMESPACE}
    ]


def test_capi_values_name_the_account_or_an_external_workload_cluster(chart: helm.Chart) -> None:
    renamed = _by_kind(_render(chart, {"capi": {"serviceAccount": {"name": "capi-reader"}}}))
    assert ("ServiceAccount", "capi-reader") in renamed
    binding = renamed[("ClusterRoleBinding", "nstance-operator-capi-workload")]
    assert binding["subjects"][0]["name"] == "capi-reader"
    (container,) = renamed[("Deployment", "nstance-operator")]["spec"]["template"]["spec"]["containers"]
    assert _env(container)["NSTANCE_CAPI_SERVICEACCOUNT"] == "capi-reader"

    values = {
        **PRODUCTION_VALUES,
        "capi": {"endpoint": "https://workload.example.com:6443", "serviceAccount": {"enabled": False}},
    }
    external = _by_kind(_render(chart, values))
    assert not {name for _, name in external} & {
        crds.CAPI_WORKLOAD_SERVICE_ACCOUNT,
        "nstance-operator-capi-workload",
    }
    (container,) = external[("Deployment", "nstance-operator")]["spec"]["template"]["spec"]["containers"]
    assert _env(container)["NSTANCE_CAPI_ENDPOINT"] == "https://workload.example.com:6443"
    notes = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    assert (
        "Create Secret prod--acme-kubeconfig in namespace nstance-system"
        in notes["nstance-operator/templates/NOTES.txt"]
    )


def test_webhook_configuration_equals_config_webhook(chart: helm.Chart) -> None:
    objects = _by_kind(_render(chart))
    rendered = objects[("ValidatingWebhookConfiguration", crds.WEBHOOK_CONFIGURATION)]
    generated = _generated("config/webhook/manifests.yaml")
    assert rendered["webhooks"] == generated["webhooks"]
    assert rendered["metadata"]["annotations"] == generated["metadata"]["annotations"]


def test_chart_crds_equal_config_crd_bases_and_are_kept_on_uninstall(chart: helm.Chart) -> None:
    chart_crds = {Path(item["name"]).name: yaml.safe_load(item["data"]) for item in chart.crds}
    bases = {
        path.name: yaml.safe_load(path.read_text())
        for path in (REPO_ROOT / "config/crd/bases").glob("*.yaml")
    }
    assert set(chart_crds) == set(bases)
    assert len(bases) == 5
    for name, crd in chart_crds.items():
        assert crd["metadata"]["annotations"].pop("helm.sh/resource-policy") == "keep"
        if not crd["metadata"]["annotations"]:
            del crd["metadata"]["annotations"]
        assert crd == bases[name], name


# --- A server accepts the chart ------------------------------------------------------------------------

# Kinds the Kubernetes API emulator serves (it has no apps, rbac or cert-manager APIs).
_EMULATED = {
    "Namespace",
    "ServiceAccount",
    "ConfigMap",
    "Secret",
    "Service",
    "ValidatingWebhookConfiguration",
}


async def test_rendered_chart_and_crds_are_accepted_by_an_api_server(chart: helm.Chart) -> None:
    documents = _render(chart, PRODUCTION_VALUES)
    chart_crds = [yaml.safe_load(item["data"]) for item in chart.crds]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    served = [document for document in documents if document["kind"] in _EMULATED]
    assert {document["kind"] for document in documents} - _EMULATED == {
        "Deployment",
        "ClusterRole",
        "ClusterRoleBinding",
        "Issuer",
        "Certificate",
    }
    async with KubeAPIServer(crds=[REPO_ROOT / "config/crd/capi"]) as server:
        server.apply_objects([*chart_crds, namespace, *served])
        pools = f"{server.url}/apis/{crds.API_VERSION}/namespaces/{NAMESPACE}/{crds.NSTANCE_MACHINE_POOLS}"
        async with aiohttp.ClientSession() as session:
            for document in served:
                url = _object_url(server.url, document)
                async with session.get(url) as response:
                    assert response.status == 200, url
                    stored = await response.json()
                for field in ("data", "webhooks"):
                    if field in document:
                        assert stored[field] == document[field], (document["kind"], field)
            pool = {
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                "kind": "NstanceMachinePool",
                "metadata": {"name": "workers"},
                "spec": {"group": "workers", "shards": ["us-west-2a", "us-west-2b"], "vars": {"a": "b"}},
            }
            async with session.post(pools, json=pool) as response:
                assert response.status == 201, await response.text()
            bad = {**pool, "metadata": {"name": "bad"}, "spec": {"shards": ["us-west-2a"]}}
            async with session.post(pools, json=bad) as response:
                assert response.status == 422
                assert "spec.group" in (await response.json())["message"]


def _object_url(base: str, document: dict[str, Any]) -> str:
    api_version = document["apiVersion"]
    prefix = f"{base}/api/v1" if api_version == "v1" else f"{base}/apis/{api_version}"
    plural = {
        "Namespace": "namespaces",
        "ServiceAccount": "serviceaccounts",
        "ConfigMap": "configmaps",
        "Secret": "secrets",
        "Service": "services",
        "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
    }[document["kind"]]
    namespace = document["metadata"].get("namespace")
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{prefix}{scope}/{plural}/{document['metadata']['name']}"
