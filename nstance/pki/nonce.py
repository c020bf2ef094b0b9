"""Registration nonce JWTs: sign them (EdDSA) and verify them with the algorithm pinned.

Wire format (upstream compatible, see ``pkg/nonce``): a compact JWS with header
``{"alg": "EdDSA", "typ": "JWT"}`` signed by the cluster's Ed25519 registration key, and claims
``iss`` ("nstance-server"), ``sub`` (instance id for agents, cluster id for operators), ``exp``,
``nbf``, ``iat`` (integer seconds), ``kind`` ("agent" | "operator"), ``config_hash``, ``cluster_id``,
``shard``, ``group``, ``on_demand`` (bool) and ``tenant``. Every custom claim is always written, as
upstream does (an operator nonce carries ``shard: ""``).

Verification follows RFC 8725: before any cryptography the header is parsed by us and its ``alg``
must be exactly ``EdDSA`` (so ``none``, HS256 keyed with the public key, RS256/ES256 and friends are
refused by name); headers that would let a token choose its own key (``jwk``, ``jku``, ``x5u``,
``x5c``) or change processing (``crit``, ``b64``) are refused; then the Ed25519 signature over
``header.payload`` is checked with the verification key directly (the key type, not the token, decides
the algorithm). Claims are checked by this module, against
the injected clock: required ``sub``/``exp``/``nbf``/``iat``/``iss``/``kind``/``cluster_id``/
``tenant``, the issuer, the time window (with a small leeway for clock skew), the expected kind, the
cluster, the shard (when the caller gives one — operator nonces carry none) and, for operators,
``sub == cluster_id``.

Signing writes the compact form itself, byte for byte what PyJWT's ``jwt.encode`` writes (header keys
sorted, compact JSON, ASCII escapes; ``tests/unit/pki/test_pki_nonce.py`` compares the two): every VM
created signs one, on the way from a decision to the provider call, and PyJWT's general encoder took
longer there than the signature itself (``docs/benchmarks.md``).

Every failure raises ``core.errors.Unauthenticated`` with a message saying what is wrong; nothing else
escapes for any input string. Single use (nonce consumed once) is NOT checked here: it needs storage,
and the registration service does it after this check succeeds.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, get_args

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from nstance.core.clock import Clock, SystemClock
from nstance.core.errors import InvalidArgument, Unauthenticated
from nstance.pki.keys import require_private_key, require_public_key

NonceKind = Literal["agent", "operator"]
NONCE_KINDS: tuple[NonceKind, ...] = get_args(NonceKind)
ALGORITHM = "EdDSA"
ISSUER = "nstance-server"
DEFAULT_AGENT_NONCE_TTL = timedelta(minutes=5)
DEFAULT_OPERATOR_NONCE_TTL = timedelta(hours=3)
DEFAULT_LEEWAY = timedelta(seconds=60)
MAX_TOKEN_LENGTH = 8192

_SEGMENT = re.compile(r"[A-Za-z0-9_-]*")
_FORBIDDEN_HEADERS = ("crit", "b64", "jwk", "jku", "x5u", "x5c")
_REQUIRED = ("iss", "sub", "exp", "nbf", "iat", "kind", "cluster_id", "tenant")
_STRING_CLAIMS = ("iss", "sub", "kind", "cluster_id", "tenant", "config_hash", "shard", "group")
_TIME_CLAIMS = ("exp", "nbf", "iat")
_MALFORMED = "registration nonce is not a well-formed JWT"


@dataclass(frozen=True, slots=True)
class NonceClaims:
    """The claims of a registration nonce. Times are timezone-aware UTC, whole seconds when signed."""

    sub: str
    kind: str
    cluster_id: str
    tenant: str
    exp: datetime
    nbf: datetime
    iat: datetime
    iss: str = ISSUER
    config_hash: str = ""
    shard: str = ""
    group: str = ""
    on_demand: bool = False

    def to_payload(self) -> dict[str, Any]:
        """The JSON payload, in upstream's field order; times as integer seconds."""
        return {
            "iss": self.iss,
            "sub": self.sub,
            "exp": int(self.exp.timestamp()),
            "nbf": int(self.nbf.timestamp()),
            "iat": int(self.iat.timestamp()),
            "kind": self.kind,
            "config_hash": self.config_hash,
            "cluster_id": self.cluster_id,
            "shard": self.shard,
            "group": self.group,
            "on_demand": self.on_demand,
            "tenant": self.tenant,
        }


def _whole_seconds(clock: Clock | None) -> datetime:
    return (clock or SystemClock()).now().astimezone(UTC).replace(microsecond=0)


def agent_nonce_claims(
    *,
    instance_id: str,
    cluster_id: str,
    shard: str,
    group: str,
    tenant: str,
    config_hash: str = "",
    on_demand: bool = False,
    ttl: timedelta = DEFAULT_AGENT_NONCE_TTL,
    clock: Clock | None = None,
) -> NonceClaims:
    """Claims for the nonce an agent receives in its userdata (``sub`` = instance id)."""
    now = _whole_seconds(clock)
    return NonceClaims(
        sub=instance_id,
        kind="agent",
        cluster_id=cluster_id,
        tenant=tenant,
        exp=now + ttl,
        nbf=now,
        iat=now,
        config_hash=config_hash,
        shard=shard,
        group=group,
        on_demand=on_demand,
    )


def operator_nonce_claims(
    *,
    cluster_id: str,
    tenant: str,
    ttl: timedelta = DEFAULT_OPERATOR_NONCE_TTL,
    clock: Clock | None = None,
) -> NonceClaims:
    """Claims for an operator registration nonce (``sub`` = cluster id, no shard)."""
    now = _whole_seconds(clock)
    return NonceClaims(
        sub=cluster_id, kind="operator", cluster_id=cluster_id, tenant=tenant, exp=now + ttl, nbf=now, iat=now
    )


def sign_nonce(key: Ed25519PrivateKey, claims: NonceClaims, *, kid: str | None = None) -> str:
    """Sign ``claims`` with the Ed25519 registration key; return the compact JWT."""
    checked = require_private_key(key, ("ed25519",), what="registration nonce signing key")
    if not isinstance(checked, Ed25519PrivateKey):  # pragma: no cover - require_private_key ensures it
        raise InvalidArgument("registration nonce signing key must be Ed25519")
    if claims.kind not in NONCE_KINDS:
        raise InvalidArgument(f"unknown nonce kind {claims.kind!r}; use one of: {', '.join(NONCE_KINDS)}")
    for name in ("sub", "cluster_id", "tenant"):
        if not getattr(claims, name):
            raise InvalidArgument(f"registration nonce claim {name!r} must not be empty")
    if claims.exp <= claims.nbf:
        raise InvalidArgument("registration nonce must expire after it becomes valid")
    header = _HEADER if not kid else _b64url(_compact_json({"alg": ALGORITHM, "kid": kid, "typ": "JWT"}))
    signing_input = header + b"." + _b64url(_compact_json(claims.to_payload()))
    return (signing_input + b"." + _b64url(checked.sign(signing_input))).decode("ascii")


def _compact_json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("ascii")


def _b64url(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


_HEADER = _b64url(_compact_json({"alg": ALGORITHM, "typ": "JWT"}))


# --- verification --------------------------------------------------------------------------------


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _b64url_json(segment: str, what: str) -> dict[str, Any]:
    try:
        raw = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
        value = json.loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicates)
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise Unauthenticated(f"{_MALFORMED} ({what} is not base64url-encoded JSON)") from exc
    if not isinstance(value, dict):
        raise Unauthenticated(f"{_MALFORMED} ({what} is not a JSON object)")
    return value


def _split(token: object) -> tuple[str, str, str]:
    """Return ``(header, payload, signature)``, the base64url segments, after checking the compact form."""
    if isinstance(token, bytes):
        try:
            token = token.decode("ascii")
        except UnicodeDecodeError as exc:
            raise Unauthenticated(_MALFORMED) from exc
    if not isinstance(token, str) or not token:
        raise Unauthenticated(f"{_MALFORMED} (empty)")
    if len(token) > MAX_TOKEN_LENGTH:
        raise Unauthenticated(f"registration nonce is too long ({len(token)} characters)")
    parts = token.split(".")
    if len(parts) != 3:
        raise Unauthenticated(f"{_MALFORMED} (expected 3 dot-separated segments, got {len(parts)})")
    header, payload, signature = parts
    if not header or not payload:
        raise Unauthenticated(f"{_MALFORMED} (empty header or payload)")
    for seg in parts:
        if not _SEGMENT.fullmatch(seg):
            raise Unauthenticated(f"{_MALFORMED} (segments must be unpadded base64url)")
    return header, payload, signature


def _time_claim(payload: dict[str, Any], name: str) -> datetime:
    value = payload[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Unauthenticated(f"registration nonce claim {name!r} must be a number of seconds")
    if isinstance(value, float) and not math.isfinite(value):
        raise Unauthenticated(f"registration nonce claim {name!r} is not a finite number")
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise Unauthenticated(f"registration nonce claim {name!r} is not a valid time") from exc


def _claims_from_payload(payload: dict[str, Any]) -> NonceClaims:
    missing = [name for name in _REQUIRED if name not in payload]
    if missing:
        raise Unauthenticated(f"registration nonce is missing required claim(s): {', '.join(missing)}")
    for name in _STRING_CLAIMS:
        if name in payload and not isinstance(payload[name], str):
            raise Unauthenticated(f"registration nonce claim {name!r} must be a string")
    for name in ("sub", "kind", "cluster_id", "tenant"):
        if not payload[name]:
            raise Unauthenticated(f"registration nonce claim {name!r} is empty")
    on_demand = payload.get("on_demand", False)
    if not isinstance(on_demand, bool):
        raise Unauthenticated("registration nonce claim 'on_demand' must be a boolean")
    exp, nbf, iat = (_time_claim(payload, name) for name in _TIME_CLAIMS)
    return NonceClaims(
        sub=payload["sub"],
        kind=payload["kind"],
        cluster_id=payload["cluster_id"],
        tenant=payload["tenant"],
        exp=exp,
        nbf=nbf,
        iat=iat,
        iss=payload["iss"],
        config_hash=payload.get("config_hash", ""),
        shard=payload.get("shard", ""),
        group=payload.get("group", ""),
        on_demand=on_demand,
    )


def verify_nonce(
    token: str | bytes,
    public_key: Ed25519PublicKey,
    *,
    expected_kind: str,
    cluster_id: str,
    shard: str | None = None,
    clock: Clock | None = None,
    leeway: timedelta = DEFAULT_LEEWAY,
    kid: str | None = None,
) -> NonceClaims:
    """Verify a registration nonce and return its claims; raise Unauthenticated on any problem.

    ``shard`` is compared when given (agent registration); ``kid``, when given, must equal the
    token's ``kid`` header (tokens without one are refused then). ``leeway`` absorbs clock skew.
    """
    checked = require_public_key(public_key, ("ed25519",), what="registration nonce verification key")
    if expected_kind not in NONCE_KINDS:
        raise InvalidArgument(f"unknown nonce kind {expected_kind!r}; use one of: {', '.join(NONCE_KINDS)}")

    header_b64, payload_b64, signature_b64 = _split(token)
    header = _b64url_json(header_b64, "header")
    alg = header.get("alg")
    if alg != ALGORITHM:
        raise Unauthenticated(f"registration nonce uses algorithm {alg!r}; only {ALGORITHM} is accepted")
    typ = header.get("typ")
    if typ is not None and (not isinstance(typ, str) or typ.upper() != "JWT"):
        raise Unauthenticated(f"registration nonce has type {typ!r}; expected 'JWT'")
    for name in _FORBIDDEN_HEADERS:
        if name in header:
            raise Unauthenticated(f"registration nonce header carries {name!r}, which is not accepted")
    if kid is not None and header.get("kid") != kid:
        raise Unauthenticated(
            f"registration nonce was signed with key id {header.get('kid')!r}, expected {kid!r}"
        )

    if not isinstance(checked, Ed25519PublicKey):  # pragma: no cover - require_public_key ensures it
        raise InvalidArgument("registration nonce verification key must be Ed25519")
    try:
        signature = base64.urlsafe_b64decode(signature_b64 + "=" * (-len(signature_b64) % 4))
        # Only the canonical spelling: the last character of a segment carries bits the decoder
        # drops, and an altered token must not verify just because it decodes to the same bytes.
        if _b64url(signature) != signature_b64.encode("ascii"):
            raise ValueError("not the canonical base64url spelling of its bytes")
        checked.verify(signature, f"{header_b64}.{payload_b64}".encode("ascii"))
    except (binascii.Error, ValueError, InvalidSignature) as exc:
        raise Unauthenticated("registration nonce signature is invalid (wrong key or altered token)") from exc
    payload = _b64url_json(payload_b64, "payload")

    claims = _claims_from_payload(payload)
    if claims.iss != ISSUER:
        raise Unauthenticated(f"registration nonce issuer is {claims.iss!r}, expected {ISSUER!r}")

    now = (clock or SystemClock()).now()
    # Leeway goes on ``now``, never on a claim: ``exp + leeway`` overflows for a time near year 9999.
    if now - leeway >= claims.exp:
        raise Unauthenticated(f"registration nonce expired at {claims.exp.isoformat()}")
    if now + leeway < claims.nbf:
        raise Unauthenticated(f"registration nonce is not valid before {claims.nbf.isoformat()}")
    if now + leeway < claims.iat:
        raise Unauthenticated(
            f"registration nonce was issued in the future ({claims.iat.isoformat()}); check clocks"
        )

    if claims.kind != expected_kind:
        raise Unauthenticated(f"registration nonce is for kind {claims.kind!r}, expected {expected_kind!r}")
    if claims.cluster_id != cluster_id:
        raise Unauthenticated(
            f"registration nonce was signed for cluster {claims.cluster_id!r}, this cluster is {cluster_id!r}"
        )
    if shard is not None and claims.shard != shard:
        raise Unauthenticated(
            f"registration nonce was signed for shard {claims.shard!r}, this shard is {shard!r}"
        )
    if claims.kind == "operator" and claims.sub != claims.cluster_id:
        raise Unauthenticated(
            f"operator registration nonce subject {claims.sub!r} is not the cluster id {claims.cluster_id!r}"
        )
    return claims
