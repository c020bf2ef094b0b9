"""Cluster API's kubeconfig Secret: the settings, when the operator writes it, and what it writes.

Upstream's operator (internal/operator/leader/manager.go) keeps Secret ``<cluster>-kubeconfig`` (key
``value``, label ``cluster.x-k8s.io/cluster-name``) with a one-hour token of ``nstance-capi-workload``
for ``https://kubernetes.default.svc:443``, records the expiry in ``nstance.dev/token-expiry`` and renews
when ten minutes or less remain; with ``NSTANCE_CAPI_ENDPOINT`` set it writes nothing. This operator
also leaves alone a Secret it did not write (no annotation of its own), where upstream overwrote it.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from nstance.operator.controllers.kubeconfig import read_cluster_ca
from nstance.operator.controllers.kubeconfig_secret import (
    IN_CLUSTER_SERVER,
    Action,
    WorkloadAccess,
    decide,
    issued_token,
    kubeconfig_text,
    new_secret,
    parse_expiry,
    renewed_secret,
    secret_name,
)
from nstance.operator.crds import names
from nstance.operator.runtime import default_components
from nstance.operator.settings import SettingsError

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def secret(annotations: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "test--default-kubeconfig", "namespace": "ns", "resourceVersion": "7"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, **extra}


def expiring_in(delta: timedelta) -> dict[str, Any]:
    return secret({names.TOKEN_EXPIRY_ANNOTATION: (NOW + delta).strftime("%Y-%m-%dT%H:%M:%SZ")})


# --- settings --------------------------------------------------------------------------------------------


def test_the_environment_names_the_endpoint_and_the_service_account() -> None:
    assert WorkloadAccess.from_environ({}) == WorkloadAccess(None, "nstance-capi-workload")
    assert WorkloadAccess.from_environ({}).self_managed
    # Empty counts as unset, as with upstream's GetEnv.
    blank = {"NSTANCE_CAPI_ENDPOINT": "", "NSTANCE_CAPI_SERVICEACCOUNT": " "}
    assert WorkloadAccess.from_environ(blank) == WorkloadAccess()
    external = WorkloadAccess.from_environ(
        {"NSTANCE_CAPI_ENDPOINT": "https://workload.example.com:6443", "NSTANCE_CAPI_SERVICEACCOUNT": "capi"}
    )
    assert external == WorkloadAccess("https://workload.example.com:6443", "capi")
    assert not external.self_managed


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"NSTANCE_CAPI_ENDPOINT": "https://workload.example.com:port"}, "NSTANCE_CAPI_ENDPOINT"),
        ({"NSTANCE_CAPI_ENDPOINT": "https://:6443"}, "NSTANCE_CAPI_ENDPOINT"),
        ({"NSTANCE_CAPI_SERVICEACCOUNT": "Not_A_Name"}, "NSTANCE_CAPI_SERVICEACCOUNT"),
    ],
)
def test_a_bad_value_is_one_error_naming_the_variable(environ: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=f"^{named}=") as caught:
        WorkloadAccess.from_environ(environ)
    assert "\n" not in str(caught.value)


def test_the_kubeconfig_loop_runs_only_for_a_self_managed_cluster() -> None:
    assert [label for label, _ in default_components(WorkloadAccess())] == [
        "sync manager",
        "drain coordinator",
        "workload kubeconfig",
    ]
    external = WorkloadAccess("https://workload.example.com:6443")
    assert [label for label, _ in default_components(external)] == ["sync manager", "drain coordinator"]


# --- when to write ---------------------------------------------------------------------------------------


def test_a_missing_secret_is_created() -> None:
    assert decide(None, NOW).action is Action.CREATE


def test_a_token_with_more_than_ten_minutes_left_is_kept_and_one_with_less_renewed() -> None:
    assert decide(expiring_in(timedelta(minutes=10, seconds=1)), NOW).action is Action.KEEP
    assert decide(expiring_in(timedelta(minutes=10)), NOW).action is Action.RENEW
    assert decide(expiring_in(timedelta(minutes=3)), NOW).action is Action.RENEW
    assert decide(expiring_in(-timedelta(hours=2)), NOW).action is Action.RENEW


def test_upstreams_secret_is_recognised_and_its_time_read_with_an_offset() -> None:
    # Go formats the expiry in the process's time zone: 22:30+10:00 is 12:30 UTC, 30 minutes away.
    upstream = secret({names.TOKEN_EXPIRY_ANNOTATION: "2026-03-01T22:30:00+10:00"})
    decision = decide(upstream, NOW)
    assert decision.action is Action.KEEP
    assert decision.expiry == NOW + timedelta(minutes=30)
    fractional = secret({names.TOKEN_EXPIRY_ANNOTATION: "2026-03-01T12:30:00.123456789Z"})
    assert decide(fractional, NOW).action is Action.KEEP


def test_an_unreadable_expiry_on_the_operators_secret_is_renewed() -> None:
    for text in ("soon", "2026-03-01", "2026-03-01T13:00:00", ""):
        ours = secret({names.TOKEN_EXPIRY_ANNOTATION: text})
        assert decide(ours, NOW).action is Action.RENEW, text
    managed = secret({names.MANAGED_BY_ANNOTATION: names.MANAGED_BY_VALUE})
    assert decide(managed, NOW).action is Action.RENEW


def test_a_secret_the_operator_did_not_write_is_left_alone() -> None:
    for foreign in (secret(), secret({"note": "admin"}), secret({names.MANAGED_BY_ANNOTATION: "someone"})):
        decision = decide(foreign, NOW)
        assert decision.action is Action.FOREIGN
        assert names.TOKEN_EXPIRY_ANNOTATION in decision.reason


def test_parse_expiry_takes_rfc3339_only() -> None:
    assert parse_expiry("2026-03-01T12:00:00Z") == NOW
    assert parse_expiry("2026-03-01T13:00:00+01:00") == NOW
    assert parse_expiry(None) is None
    assert parse_expiry(12) is None
    assert parse_expiry("2026-03-01 12:00:00Z") is None


# --- what is written -------------------------------------------------------------------------------------


def test_the_token_and_expiry_come_from_the_token_request_answer() -> None:
    answer = {"status": {"token": "abc.def.ghi", "expirationTimestamp": "2026-03-01T13:00:00Z"}}
    token = issued_token(answer)
    assert (token.token, token.expiry) == ("abc.def.ghi", NOW + timedelta(hours=1))
    for broken in (
        {},
        {"status": {"token": "t"}},
        {"status": {"expirationTimestamp": "2026-03-01T13:00:00Z"}},
    ):
        with pytest.raises(ValueError, match="TokenRequest"):
            issued_token(broken)


def test_the_kubeconfig_points_at_the_in_cluster_api_server_with_the_token() -> None:
    config = yaml.safe_load(kubeconfig_text("test--default", "tok", CA))
    assert config["apiVersion"] == "v1"
    assert config["kind"] == "Config"
    assert config["current-context"] == "test--default"
    (cluster,) = config["clusters"]
    assert cluster["name"] == "test--default"
    assert cluster["cluster"]["server"] == IN_CLUSTER_SERVER == "https://kubernetes.default.svc:443"
    assert base64.b64decode(cluster["cluster"]["certificate-authority-data"]) == CA
    assert config["users"] == [{"name": "test--default", "user": {"token": "tok"}}]
    assert config["contexts"] == [
        {"name": "test--default", "context": {"cluster": "test--default", "user": "test--default"}}
    ]
    without_ca = yaml.safe_load(kubeconfig_text("test--default", "tok", None))
    assert "certificate-authority-data" not in without_ca["clusters"][0]["cluster"]


def test_a_new_secret_carries_the_label_the_annotations_and_the_kubeconfig() -> None:
    body = new_secret("test--default", "ns", "KUBECONFIG", NOW + timedelta(hours=1))
    assert body["metadata"]["name"] == secret_name("test--default") == "test--default-kubeconfig"
    assert body["metadata"]["namespace"] == "ns"
    assert body["metadata"]["labels"] == {"cluster.x-k8s.io/cluster-name": "test--default"}
    assert body["metadata"]["annotations"] == {
        "nstance.dev/token-expiry": "2026-03-01T13:00:00Z",
        "nstance.dev/managed-by": "nstance-operator",
    }
    assert body["type"] == "Opaque"
    assert base64.b64decode(body["data"]["value"]) == b"KUBECONFIG"
    assert decide(body, NOW).action is Action.KEEP


def test_a_renewal_replaces_the_kubeconfig_and_keeps_everything_else() -> None:
    current = secret(
        {names.TOKEN_EXPIRY_ANNOTATION: "2026-03-01T12:05:00Z", "team": "infra"},
        data={"value": "b2xk", "extra": "eA=="},
        type="Opaque",
    )
    current["metadata"]["labels"] = {"owner": "me"}
    body = renewed_secret(current, "test--default", "NEW", NOW + timedelta(hours=1))
    assert body["metadata"]["resourceVersion"] == "7"  # a concurrent change makes the replace fail
    assert body["metadata"]["labels"] == {"owner": "me", "cluster.x-k8s.io/cluster-name": "test--default"}
    assert body["metadata"]["annotations"]["team"] == "infra"
    assert body["metadata"]["annotations"][names.TOKEN_EXPIRY_ANNOTATION] == "2026-03-01T13:00:00Z"
    assert body["data"] == {"value": base64.b64encode(b"NEW").decode()}  # as upstream: only `value`
    assert current["data"]["value"] == "b2xk"  # the input is not changed


def test_the_ca_is_the_operators_own_else_the_pods(tmp_path: Any) -> None:
    own, pod = tmp_path / "own.crt", tmp_path / "pod.crt"
    own.write_bytes(b"OWN")
    pod.write_bytes(b"POD")
    assert read_cluster_ca(str(own), pod) == b"OWN"
    assert read_cluster_ca(None, pod) == b"POD"
    assert read_cluster_ca(str(tmp_path / "missing"), pod) == b"POD"
    assert read_cluster_ca(None, tmp_path / "missing") is None
