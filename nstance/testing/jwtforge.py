"""Hand-made compact JWS tokens, for tests that attack registration-nonce verification.

Attackers do not use a well-behaved JWT library: they write headers the verifier must refuse
(``alg: none``, HS256, embedded keys), sign with keys the verifier must not trust, or sign payloads
no issuer would produce (missing or duplicated claims). These helpers build such tokens byte by byte
(``craft``), sign arbitrary header and payload with an Ed25519 key (``ed_sign``), with an HMAC secret
such as the verifier's own public key (``hmac_sign``), or with any other PyJWT algorithm and key
(``sign_as``), and change one segment of a genuine token (``replace_segment``).

Used by the PKI unit tests and the security suite; nothing in the product imports this module.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

#: The segments of a compact JWS, in order.
SEGMENTS = ("header", "payload", "signature")


def b64url(data: bytes) -> str:
    """Unpadded base64url, as JWS segments are written."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(segment: str) -> bytes:
    """The bytes of an unpadded base64url segment."""
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def b64json(value: Any) -> str:
    """``value`` as compact JSON, base64url-encoded (a header or payload segment)."""
    return b64url(json.dumps(value, separators=(",", ":")).encode("utf-8"))


def craft(header: dict[str, Any], payload: dict[str, Any], signature: bytes = b"") -> str:
    """A token with exactly these segments; ``signature`` is not checked against anything."""
    return f"{b64json(header)}.{b64json(payload)}.{b64url(signature)}"


def _signed(signing_input: str, signature: bytes) -> str:
    return f"{signing_input}.{b64url(signature)}"


def ed_sign(header: dict[str, Any], payload: dict[str, Any] | bytes, key: Ed25519PrivateKey) -> str:
    """Sign ``header`` and ``payload`` (a dict, or raw payload bytes such as duplicate-key JSON)."""
    body = b64url(payload) if isinstance(payload, bytes) else b64json(payload)
    signing_input = f"{b64json(header)}.{body}"
    return _signed(signing_input, key.sign(signing_input.encode("ascii")))


def hmac_sign(payload: dict[str, Any], secret: bytes, alg: str = "HS256", **header: Any) -> str:
    """An HMAC-signed token (HS256/384/512) keyed with ``secret``, e.g. the verifier's public key.

    PyJWT refuses PEM-looking HMAC secrets, so the MAC is computed here.
    """
    digest = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}[alg]
    signing_input = f"{b64json({'alg': alg, 'typ': 'JWT', **header})}.{b64json(payload)}"
    return _signed(signing_input, hmac.new(secret, signing_input.encode("ascii"), digest).digest())


def sign_as(payload: dict[str, Any], key: Any, alg: str, **header: Any) -> str:
    """A token signed by PyJWT with ``alg`` and ``key`` (RS256, ES256, another EdDSA key, ...)."""
    return jwt.encode(payload, key, algorithm=alg, headers=header or None)


def split(token: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Header and payload of a well-formed token (decoded, unverified) and its signature segment."""
    header, payload, signature = token.split(".")
    return _decode(header), _decode(payload), signature


def _decode(segment: str) -> dict[str, Any]:
    value = json.loads(b64url_decode(segment))
    if not isinstance(value, dict):
        raise ValueError("segment is not a JSON object")
    return value


def replace_segment(token: str, which: str, value: str) -> str:
    """``token`` with its ``header``, ``payload`` or ``signature`` segment replaced by ``value``."""
    parts = token.split(".")
    parts[SEGMENTS.index(which)] = value
    return ".".join(parts)
