"""The agent's identity on disk: bootstrap files, the identity key and the client certificate.

The identity key is Ed25519 when the cluster CA is Ed25519 (an upstream cluster, whose servers accept
only Ed25519 identities) and ECDSA P-256 otherwise; a stored key of either type is kept.

Responsible for reading ``identity/ca.crt`` and ``identity/nonce.jwt``, creating or reusing
``identity/identity.key`` with ``identity/identity.pub`` (mode 0600), deciding whether a stored
``identity.crt`` can be used, and the runtime config hash (``identity/config.hash``, or the nonce's
``config_hash`` claim as a hint). It does not talk to the server (register.py, renewal.py) and never
verifies the nonce: that is the server's job.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ed25519

from nstance.core.atomicfile import write_atomic
from nstance.core.errors import FailedPrecondition, InvalidArgument, Unauthenticated
from nstance.pki.ca import parse_certificate
from nstance.pki.keys import (
    PrivateKey,
    generate_private_key,
    load_private_key_pem,
    private_key_to_pem,
    public_key_to_pem,
    public_keys_equal,
    require_public_key,
)
from nstance.pki.peer import verify_client_certificate

#: A stored certificate with less than this much validity left is not reused at start.
MIN_REMAINING = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """What the provider put on the machine for registration."""

    ca_pem: bytes
    nonce: str


def read_bootstrap(identity_dir: Path, *, nonce_required: bool = True) -> Bootstrap:
    """Read ``ca.crt`` and ``nonce.jwt``; FailedPrecondition naming the missing or unreadable file.

    Without ``nonce_required`` a missing ``nonce.jwt`` reads as an empty nonce: an agent that holds a
    usable certificate needs none, and upstream's agent deletes it once registered, so a machine whose
    Go agent is replaced by this one has none.
    """
    ca_path = identity_dir / "ca.crt"
    nonce_path = identity_dir / "nonce.jwt"
    if not ca_path.is_file():
        raise _missing(ca_path)
    ca_pem = _read_ca(ca_path)
    if not nonce_path.exists() and not nonce_required:
        return Bootstrap(ca_pem=ca_pem, nonce="")
    if not nonce_path.is_file():
        raise _missing(nonce_path)
    nonce = nonce_path.read_text(encoding="utf-8", errors="replace").strip()
    if not nonce:
        raise FailedPrecondition(f"{nonce_path} is empty")
    return Bootstrap(ca_pem=ca_pem, nonce=nonce)


def _missing(path: Path) -> FailedPrecondition:
    return FailedPrecondition(f"{path} is missing (the provider writes it from the instance userdata)")


def _read_ca(ca_path: Path) -> bytes:
    ca_pem = ca_path.read_bytes()
    try:
        parse_certificate(ca_pem, what=str(ca_path))
    except InvalidArgument as exc:
        raise FailedPrecondition(str(exc)) from exc
    return ca_pem


def identity_key_type(ca_pem: bytes) -> str:
    """``ed25519`` under an Ed25519 cluster CA (upstream servers accept only Ed25519), else ``ecdsa-p256``."""
    ca_key = parse_certificate(ca_pem, what="ca.crt").public_key()
    return "ed25519" if isinstance(ca_key, ed25519.Ed25519PublicKey) else "ecdsa-p256"


def ensure_identity_key(path: Path, *, mode: int = 0o600, key_type: str = "ecdsa-p256") -> PrivateKey:
    """Load the identity key at ``path`` (ECDSA P-256 or Ed25519), or create one of ``key_type``.

    The public key is kept beside it (``identity.pub``, same mode), as upstream's agent keeps its pair:
    an identity directory stays usable by the Go agent after a rollback (an Ed25519 key, an upstream
    cluster), which refuses a private key without its public key. A missing ``identity.pub`` is
    written from the private key (a directory from an earlier version of this agent, or a crash
    between the two writes). A public key without its private key is a broken pair, refused as
    upstream refuses it: a new key would not match the certificate the old one was issued.
    """
    public_path = path.with_suffix(".pub")
    if path.exists():
        key = load_private_key_pem(path.read_bytes(), what=f"identity key {path}")
        if not public_path.exists():
            write_atomic(public_path, public_key_to_pem(key), mode=mode, dir_mode=0o700)
        return key
    if public_path.exists():
        raise FailedPrecondition(
            f"incomplete identity keypair: {public_path} exists but {path} does not; a new key would not "
            "match the identity it belongs to (restore the key, or remove both to register afresh)"
        )
    key = generate_private_key(key_type)
    write_atomic(path, private_key_to_pem(key), mode=mode, dir_mode=0o700)
    write_atomic(public_path, public_key_to_pem(key), mode=mode, dir_mode=0o700)
    return key


def certificate_problem(
    cert_pem: bytes,
    *,
    ca_pem: bytes,
    key: PrivateKey,
    instance_id: str,
    now: datetime,
) -> str | None:
    """Why a stored identity certificate cannot be reused at start, or None when it can.

    It must chain to the CA, be an agent certificate for ``instance_id``, match ``key`` and have at
    least MIN_REMAINING left. Renewal (not re-registration) handles certificates that are merely ageing.
    """
    try:
        ca = parse_certificate(ca_pem, what="ca.crt")
        cert = parse_certificate(cert_pem, what="identity.crt")
    except InvalidArgument as exc:
        return str(exc)

    class _At:
        def now(self) -> datetime:
            return now

        def monotonic(self) -> float:  # pragma: no cover - not used by verify
            return 0.0

    try:
        peer = verify_client_certificate(cert, ca, clock=_At())
    except Unauthenticated as exc:
        return str(exc)
    if peer.role != "agent":
        return f"identity.crt has role {peer.role!r}, not 'agent'"
    if peer.client_id != instance_id:
        return f"identity.crt is for {peer.client_id!r}, not this instance {instance_id!r}"
    try:
        cert_key = require_public_key(cert.public_key(), what="the key in identity.crt")
    except InvalidArgument as exc:
        return str(exc)
    if not public_keys_equal(cert_key, key):
        return "identity.crt does not match identity.key"
    if cert.not_valid_after_utc - now < MIN_REMAINING:
        return f"identity.crt expires at {cert.not_valid_after_utc.isoformat()}"
    return None


def store_certificate(path: Path, cert_pem: bytes, *, mode: int = 0o600) -> None:
    """Write the identity certificate atomically."""
    write_atomic(path, cert_pem, mode=mode, dir_mode=0o700)


def nonce_config_hash(nonce: str) -> str:
    """The ``config_hash`` claim of a nonce JWT, decoded without verification ("" if absent/unreadable)."""
    parts = nonce.strip().split(".")
    if len(parts) != 3:
        return ""
    segment = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        payload = json.loads(base64.urlsafe_b64decode(segment.encode("ascii")))
    except (ValueError, binascii.Error, UnicodeError):
        return ""
    value = payload.get("config_hash") if isinstance(payload, dict) else None
    return value if isinstance(value, str) else ""


def read_config_hash(path: Path, nonce: str = "") -> str:
    """The applied runtime config hash: ``config.hash`` when present, else the nonce's hint."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        text = ""
    return text or nonce_config_hash(nonce)
