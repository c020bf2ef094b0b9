"""The ``serviceaccounts/token`` subresource: TokenRequest answers shaped like kube-apiserver's.

``POST /api/v1/namespaces/{ns}/serviceaccounts/{name}/token`` takes an ``authentication.k8s.io/v1``
TokenRequest. As on a real server: a name or namespace in the body must match the URL (422), the
ServiceAccount must exist (404), ``spec.expirationSeconds`` defaults to 3600 and must lie between ten
minutes and 2^32 seconds (422), and the audiences default to the server's. The answer (201) is the request
with the ServiceAccount's name, namespace and uid, ``creationTimestamp`` now, and ``status.token`` and
``status.expirationTimestamp`` (now plus ``expirationSeconds``).

The token is JWT-shaped (header, claims, signature; claims ``iss``, ``sub``
``system:serviceaccount:<ns>:<name>``, ``aud``, ``exp``, ``iat``, ``nbf``, ``jti`` and ``kubernetes.io``) but
not signed: the emulator authenticates nobody, so nothing checks it. Pods, Secrets and Nodes named in
``spec.boundObjectRef`` are not looked up. Pure: no I/O.
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from datetime import datetime, timedelta
from typing import Any, Final

from nstance.testing.kubeapi import errors

JSON = dict[str, Any]
GROUP: Final = "authentication.k8s.io"
API_VERSION: Final = f"{GROUP}/v1"
KIND: Final = "TokenRequest"
DEFAULT_SECONDS: Final = 3600
MIN_SECONDS: Final = 10 * 60
MAX_SECONDS: Final = 1 << 32
ISSUER: Final = "https://kubernetes.default.svc.cluster.local"
"""The emulator's service-account issuer, which is also its default token audience (kubeadm's value)."""


def _time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _segment(data: JSON) -> str:
    raw = json.dumps(data, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _token(account: JSON, audiences: list[Any], now: datetime, seconds: int) -> str:
    meta = account["metadata"]
    issued = int(now.timestamp())
    claims = {
        "aud": audiences,
        "exp": issued + seconds,
        "iat": issued,
        "iss": ISSUER,
        "jti": str(uuid.uuid4()),
        "kubernetes.io": {
            "namespace": meta["namespace"],
            "serviceaccount": {"name": meta["name"], "uid": meta.get("uid", "")},
        },
        "nbf": issued,
        "sub": f"system:serviceaccount:{meta['namespace']}:{meta['name']}",
    }
    signature = base64.urlsafe_b64encode(b"emulator: not signed").rstrip(b"=").decode()
    return f"{_segment({'alg': 'none', 'typ': 'JWT'})}.{_segment(claims)}.{signature}"


def check_request(body: Any, namespace: str, name: str) -> JSON:
    """The request with its defaults, after the checks a real server makes before it looks up the
    ServiceAccount (the body's name and namespace); raises ``APIError``."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise errors.bad_request("the request body must be a TokenRequest object")
    kind = body.get("kind")
    if kind not in (None, "", KIND):
        raise errors.bad_request(f"expected a {KIND}, got kind {kind!r}")
    request = copy.deepcopy(body)
    meta = request.setdefault("metadata", {}) or {}
    request["metadata"] = meta
    if meta.get("name") and meta["name"] != name:
        raise errors.invalid_object(
            GROUP,
            KIND,
            name,
            [
                errors.invalid(
                    "metadata.name", meta["name"], "must match the service account name if specified"
                )
            ],
        )
    if meta.get("namespace") and meta["namespace"] != namespace:
        raise errors.invalid_object(
            GROUP,
            KIND,
            name,
            [
                errors.invalid(
                    "metadata.namespace",
                    meta["namespace"],
                    "must match the service account namespace if specified",
                )
            ],
        )
    spec = request.setdefault("spec", {}) or {}
    request["spec"] = spec
    spec.setdefault("expirationSeconds", DEFAULT_SECONDS)
    return request


def validated(request: JSON, account: JSON) -> JSON:
    """``request`` for the existing ServiceAccount ``account``: default audiences, the account's name,
    namespace and uid filled in, the expiry checked (422 out of range); a new dict."""
    request = copy.deepcopy(request)
    spec = request["spec"]
    if not spec.get("audiences"):
        spec["audiences"] = [ISSUER]
    seconds = spec["expirationSeconds"]
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        raise errors.bad_request(f"spec.expirationSeconds: expected an integer, got {seconds!r}")
    problems = []
    if seconds < MIN_SECONDS:
        problems.append(
            errors.invalid(
                "spec.expirationSeconds", seconds, "may not specify a duration less than 10 minutes"
            )
        )
    if seconds > MAX_SECONDS:
        problems.append(
            errors.invalid(
                "spec.expirationSeconds", seconds, "may not specify a duration larger than 2^32 seconds"
            )
        )
    if problems:
        raise errors.invalid_object(GROUP, KIND, "", problems)
    account_meta = account["metadata"]
    request["apiVersion"] = API_VERSION
    request["kind"] = KIND
    meta = request["metadata"]
    meta["name"] = account_meta["name"]
    meta["namespace"] = account_meta["namespace"]
    meta.setdefault("uid", account_meta.get("uid", ""))
    return request


def issue(request: JSON, account: JSON, now: datetime) -> JSON:
    """The answer to a ``validated`` request: ``creationTimestamp`` now, the token and its expiry."""
    answer = copy.deepcopy(request)
    seconds = int(answer["spec"]["expirationSeconds"])
    answer["metadata"]["creationTimestamp"] = _time(now)
    answer["status"] = {
        "token": _token(account, answer["spec"]["audiences"], now, seconds),
        "expirationTimestamp": _time(now + timedelta(seconds=seconds)),
    }
    return answer
