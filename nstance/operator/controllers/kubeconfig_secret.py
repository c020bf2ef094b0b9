"""What the operator writes so Cluster API can reach the workload cluster, and when (pure decisions).

Cluster API's MachinePool controller matches a pool's provider IDs to Nodes through the kubeconfig in
Secret ``<cluster>-kubeconfig`` (key ``value``, label ``cluster.x-k8s.io/cluster-name``) in the Cluster's
namespace. Nstance provisions no control plane: by default the workload cluster is the cluster the
operator runs in, and the leader keeps that Secret itself, with a one-hour token of the ServiceAccount
``NSTANCE_CAPI_SERVICEACCOUNT`` (default ``nstance-capi-workload``) for the in-cluster API server
``https://kubernetes.default.svc:443``. When ``NSTANCE_CAPI_ENDPOINT`` names another API server, that
URL becomes the NstanceCluster's ``controlPlaneEndpoint`` and the admin provides the Secret.

Here:

* ``WorkloadAccess.from_environ``: the two environment variables, checked (``SettingsError`` names one);
* ``decide``: create the Secret, renew its token (less than ``RENEW_BEFORE`` left, or no readable expiry),
  keep it, or leave it alone because the operator did not write it (see ``is_operator_secret``);
* ``issued_token``: the token and its expiry from a TokenRequest answer;
* ``kubeconfig_text``, ``new_secret``, ``renewed_secret``: what is written.

Must not: talk to Kubernetes, read files or the clock.
"""

from __future__ import annotations

import base64
import copy
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import yaml

from nstance.operator.conditions import timestamp
from nstance.operator.controllers.cluster import control_plane_endpoint
from nstance.operator.crds import names
from nstance.operator.settings import SettingsError

ENV_CAPI_ENDPOINT: Final = "NSTANCE_CAPI_ENDPOINT"
ENV_CAPI_SERVICEACCOUNT: Final = "NSTANCE_CAPI_SERVICEACCOUNT"
IN_CLUSTER_SERVER: Final = "https://kubernetes.default.svc:443"
"""The API server address in the kubeconfig: Cluster API's controllers run as pods of this cluster."""
TOKEN_SECONDS: Final = 3600
"""Lifetime asked for each token (the API server may shorten it)."""
RENEW_BEFORE: Final = timedelta(minutes=10)
"""A token with less than this left is replaced."""
CHECK_INTERVAL: Final = 300.0
"""Seconds between checks of the Secret while leading."""

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


@dataclass(frozen=True)
class WorkloadAccess:
    """How Cluster API reaches the workload cluster: ``endpoint`` None means this cluster (self-managed)."""

    endpoint: str | None = None
    service_account: str = names.CAPI_WORKLOAD_SERVICE_ACCOUNT

    @property
    def self_managed(self) -> bool:
        """Whether the operator writes and renews the kubeconfig Secret."""
        return self.endpoint is None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> WorkloadAccess:
        """``NSTANCE_CAPI_ENDPOINT`` and ``NSTANCE_CAPI_SERVICEACCOUNT`` (empty counts as unset)."""
        endpoint = environ.get(ENV_CAPI_ENDPOINT, "").strip() or None
        if endpoint is not None:
            try:
                control_plane_endpoint(endpoint)
            except ValueError as exc:
                raise SettingsError(
                    f"{ENV_CAPI_ENDPOINT}={endpoint!r}: expected the workload cluster's API server as "
                    f"https://host:port ({exc})"
                ) from None
        account = environ.get(ENV_CAPI_SERVICEACCOUNT, "").strip() or names.CAPI_WORKLOAD_SERVICE_ACCOUNT
        if len(account) > 253 or not _NAME.match(account):
            raise SettingsError(
                f"{ENV_CAPI_SERVICEACCOUNT}={account!r}: expected a ServiceAccount name (lowercase letters, "
                "digits, '-' and '.', at most 253 characters)"
            )
        return cls(endpoint=endpoint, service_account=account)


def secret_name(cluster: str) -> str:
    """``<cluster>-kubeconfig``: the name Cluster API looks for."""
    return f"{cluster}{names.KUBECONFIG_SECRET_SUFFIX}"


def parse_expiry(text: object) -> datetime | None:
    """An RFC 3339 time (``Z`` or an offset, optional fraction) as aware UTC; None when it is not one."""
    if not isinstance(text, str) or not _RFC3339.match(text.strip()):
        return None
    try:
        return datetime.fromisoformat(text.strip()).astimezone(UTC)
    except ValueError:
        return None


def _annotations(secret: Mapping[str, Any]) -> Mapping[str, Any]:
    return (secret.get("metadata") or {}).get("annotations") or {}


def is_operator_secret(secret: Mapping[str, Any]) -> bool:
    """Whether the operator wrote this Secret: it carries the token-expiry annotation (written by this
    operator and by upstream's) or this operator's managed-by annotation. Any other Secret of that name
    is the admin's and is never changed."""
    annotations = _annotations(secret)
    return (
        names.TOKEN_EXPIRY_ANNOTATION in annotations
        or annotations.get(names.MANAGED_BY_ANNOTATION) == names.MANAGED_BY_VALUE
    )


class Action(enum.Enum):
    CREATE = "create"
    RENEW = "renew"
    KEEP = "keep"
    FOREIGN = "foreign"


@dataclass(frozen=True)
class Decision:
    """What to do with the Secret, and why (for the log)."""

    action: Action
    reason: str
    expiry: datetime | None = None


def decide(secret: Mapping[str, Any] | None, now: datetime) -> Decision:
    """Create when missing; leave another writer's Secret alone; renew when the token has less than
    ``RENEW_BEFORE`` left or its expiry is missing or unreadable; otherwise keep it."""
    if secret is None:
        return Decision(Action.CREATE, "the Secret does not exist")
    if not is_operator_secret(secret):
        return Decision(
            Action.FOREIGN,
            f"the Secret has no {names.TOKEN_EXPIRY_ANNOTATION} annotation, so the operator did not write it",
        )
    raw = _annotations(secret).get(names.TOKEN_EXPIRY_ANNOTATION)
    expiry = parse_expiry(raw)
    if expiry is None:
        return Decision(Action.RENEW, f"its token expiry {raw!r} is missing or not an RFC 3339 time")
    if expiry - now > RENEW_BEFORE:
        return Decision(Action.KEEP, f"its token is valid until {timestamp(expiry)}", expiry)
    return Decision(Action.RENEW, f"its token expires at {timestamp(expiry)}", expiry)


@dataclass(frozen=True)
class IssuedToken:
    token: str
    expiry: datetime


def issued_token(answer: Mapping[str, Any]) -> IssuedToken:
    """The token and expiry of a TokenRequest answer; ValueError when either is missing."""
    status = answer.get("status") or {}
    token = status.get("token")
    expiry = parse_expiry(status.get("expirationTimestamp"))
    if not isinstance(token, str) or not token or expiry is None:
        raise ValueError("the TokenRequest answer lacks status.token or a valid status.expirationTimestamp")
    return IssuedToken(token, expiry)


def kubeconfig_text(cluster: str, token: str, ca_pem: bytes | None, server: str = IN_CLUSTER_SERVER) -> str:
    """A kubeconfig with one cluster, user and context, all named ``cluster``, using ``token``; the CA is
    embedded when known (else the system's trust store applies)."""
    entry: dict[str, Any] = {"server": server}
    if ca_pem:
        entry["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": entry}],
        "users": [{"name": cluster, "user": {"token": token}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": cluster}}],
        "current-context": cluster,
        "preferences": {},
    }
    return str(yaml.safe_dump(config, sort_keys=True, default_flow_style=False))


def _written(cluster: str, kubeconfig: str, expiry: datetime) -> dict[str, Any]:
    """The fields the operator owns on the Secret."""
    return {
        "labels": {names.CAPI_CLUSTER_NAME_LABEL: cluster},
        "annotations": {
            names.TOKEN_EXPIRY_ANNOTATION: timestamp(expiry.astimezone(UTC)),
            names.MANAGED_BY_ANNOTATION: names.MANAGED_BY_VALUE,
        },
        "data": {names.KUBECONFIG_SECRET_KEY: base64.b64encode(kubeconfig.encode()).decode()},
    }


def new_secret(cluster: str, namespace: str, kubeconfig: str, expiry: datetime) -> dict[str, Any]:
    """The Secret to create."""
    written = _written(cluster, kubeconfig, expiry)
    return {
        "metadata": {
            "name": secret_name(cluster),
            "namespace": namespace,
            "labels": written["labels"],
            "annotations": written["annotations"],
        },
        "type": "Opaque",
        "data": written["data"],
    }


def renewed_secret(
    current: Mapping[str, Any], cluster: str, kubeconfig: str, expiry: datetime
) -> dict[str, Any]:
    """``current`` with the new kubeconfig, expiry and label; every other field (its resourceVersion
    included, so a concurrent change makes the write fail rather than be lost) is kept."""
    written = _written(cluster, kubeconfig, expiry)
    secret = copy.deepcopy(dict(current))
    meta = secret.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **written["labels"]}
    meta["annotations"] = {**(meta.get("annotations") or {}), **written["annotations"]}
    secret["data"] = written["data"]
    return secret
