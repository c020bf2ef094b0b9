"""The operator registration record kept in cluster storage at ``operator/{tenant}.{cluster_id}.json``.

Written by ``nstance-admin cluster register-operator``, by the server's RegisterOperator and by its
RenewCertificate, all with the same fields: the union of the two shapes upstream writes at that key
(its registration: client_id, tenant, public_key_pem, cert_serial, registered_at, expires_at; its
renewal: cluster_id, tenant, public_key, cert_serial, expires_at, renewed_at, type), plus
operator_id, so a Go server reads the record whichever code path it uses. Pure: builds the key and
the bytes, stores nothing.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from nstance.pki.certs import IssuedCertificate


def operator_record_key(tenant: str, cluster_id: str) -> str:
    """Where the record lives in the cluster scope."""
    return f"operator/{tenant}.{cluster_id}.json"


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def operator_record(
    *,
    cluster_id: str,
    tenant: str,
    operator_id: str,
    public_key_pem: str,
    issued: IssuedCertificate,
    now: datetime,
) -> bytes:
    """The record's JSON document for a certificate just issued to an operator."""
    record = {
        "cluster_id": cluster_id,
        "client_id": cluster_id,
        "tenant": tenant,
        "operator_id": operator_id,
        "public_key": public_key_pem,
        "public_key_pem": public_key_pem,
        "cert_serial": issued.serial_hex,
        "expires_at": _rfc3339(issued.not_after),
        "registered_at": _rfc3339(now),
        "renewed_at": _rfc3339(now),
        "type": "operator",
    }
    return (json.dumps(record, indent=2) + "\n").encode("utf-8")
