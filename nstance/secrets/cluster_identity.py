"""The cluster's root identity: the CA (``cluster/ca.crt`` + secret ``ca.key``) and the Ed25519
registration-nonce signing key (secret ``registration-nonce.key``).

``ensure_cluster_identity`` creates what is missing and is safe to run concurrently and to re-run after
a crash at any step: secrets are created with ``set_if_absent`` and the certificate with a conditional
create, so two initialisers never end up with two CAs. A CA key without its certificate (a crash between
the two writes) is repaired by self-signing a certificate for the existing key; a certificate without
its key cannot be repaired and is reported with what to do. ``load_cluster_identity`` only reads.

Used by ``nstance-admin cluster init`` and by the cluster leader at server start. This module does no
key generation policy beyond calling ``nstance.pki`` and never overwrites an existing secret or object.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding

from nstance.core.clock import Clock
from nstance.core.errors import FailedPrecondition, InvalidArgument
from nstance.objectstore.base import ObjectNotFound, ObjectStore, PreconditionFailed
from nstance.pki.ca import CertificateAuthority, create_ca, load_ca
from nstance.pki.keys import generate_private_key, load_private_key_pem, private_key_to_pem
from nstance.secrets.base import SecretNotFound, SecretStore

CA_CERT_OBJECT = "ca.crt"
CA_KEY_SECRET = "ca.key"
NONCE_KEY_SECRET = "registration-nonce.key"


@dataclass(frozen=True, slots=True)
class ClusterIdentity:
    """The loaded CA and nonce signing key."""

    ca: CertificateAuthority
    nonce_key: Ed25519PrivateKey

    @property
    def ca_fingerprint(self) -> str:
        """SHA-256 of the CA certificate (DER), as colon-free lowercase hex."""
        return ca_fingerprint(self.ca)


@dataclass(frozen=True, slots=True)
class IdentityState:
    """Which of the three pieces exist, read without decrypting anything."""

    ca_cert: bool
    ca_key: bool
    nonce_key: bool

    @property
    def complete(self) -> bool:
        """True when all three exist."""
        return self.ca_cert and self.ca_key and self.nonce_key

    @property
    def empty(self) -> bool:
        """True when none exists."""
        return not (self.ca_cert or self.ca_key or self.nonce_key)


@dataclass(frozen=True, slots=True)
class EnsureResult:
    """What ``ensure_cluster_identity`` found and did."""

    identity: ClusterIdentity
    created_ca: bool
    repaired_ca_cert: bool
    created_nonce_key: bool

    @property
    def changed(self) -> bool:
        """True when anything was written."""
        return self.created_ca or self.repaired_ca_cert or self.created_nonce_key


def ca_fingerprint(ca: CertificateAuthority) -> str:
    """SHA-256 over the CA certificate's DER encoding."""
    return hashlib.sha256(ca.certificate.public_bytes(Encoding.DER)).hexdigest()


def identity_state(cluster: ObjectStore, secrets: SecretStore) -> IdentityState:
    """Which pieces exist (existence checks only)."""
    return IdentityState(
        ca_cert=cluster.exists(CA_CERT_OBJECT),
        ca_key=secrets.exists(CA_KEY_SECRET),
        nonce_key=secrets.exists(NONCE_KEY_SECRET),
    )


def _inconsistent_cert_without_key() -> FailedPrecondition:
    return FailedPrecondition(
        f"inconsistent CA state: cluster object {CA_CERT_OBJECT} exists but secret {CA_KEY_SECRET} does not; "
        "restore the CA key from a backup (with the same secrets provider and encryption key), or delete "
        f"{CA_CERT_OBJECT} to start a new CA (every certificate issued so far stops being trusted)"
    )


def _load_nonce_key(secrets: SecretStore) -> Ed25519PrivateKey:
    key = load_private_key_pem(secrets.get(NONCE_KEY_SECRET), ("ed25519",), what=f"secret {NONCE_KEY_SECRET}")
    if not isinstance(key, Ed25519PrivateKey):  # pragma: no cover - guaranteed by the accepted types
        raise InvalidArgument(f"secret {NONCE_KEY_SECRET} must be an Ed25519 key")
    return key


def _load_ca(cluster: ObjectStore, secrets: SecretStore) -> CertificateAuthority:
    cert_pem, _ = cluster.get(CA_CERT_OBJECT)
    key_pem = secrets.get(CA_KEY_SECRET)
    try:
        return load_ca(cert_pem, key_pem)
    except InvalidArgument as exc:
        raise FailedPrecondition(f"stored cluster CA is unusable: {exc}") from exc


def load_cluster_identity(cluster: ObjectStore, secrets: SecretStore) -> ClusterIdentity:
    """Read the CA and nonce key; raise FailedPrecondition naming what is missing or broken."""
    state = identity_state(cluster, secrets)
    if state.ca_cert and not state.ca_key:
        raise _inconsistent_cert_without_key()
    missing = [
        name
        for name, present in (
            (f"object {CA_CERT_OBJECT}", state.ca_cert),
            (f"secret {CA_KEY_SECRET}", state.ca_key),
            (f"secret {NONCE_KEY_SECRET}", state.nonce_key),
        )
        if not present
    ]
    if missing:
        raise FailedPrecondition(
            f"the cluster is not initialised ({', '.join(missing)} missing); run `nstance-admin cluster init`"
        )
    try:
        return ClusterIdentity(ca=_load_ca(cluster, secrets), nonce_key=_load_nonce_key(secrets))
    except (ObjectNotFound, SecretNotFound) as exc:  # deleted between the check and the read
        raise FailedPrecondition(f"the cluster identity changed while it was read: {exc}") from exc


def _ensure_nonce_key(secrets: SecretStore) -> bool:
    if secrets.exists(NONCE_KEY_SECRET):
        return False
    return secrets.set_if_absent(NONCE_KEY_SECRET, private_key_to_pem(generate_private_key("ed25519")))


def _ensure_ca(
    cluster: ObjectStore,
    secrets: SecretStore,
    *,
    cluster_id: str,
    key_type: str,
    clock: Clock | None,
) -> tuple[bool, bool]:
    """Return (created_ca, repaired_cert)."""
    if cluster.exists(CA_CERT_OBJECT):
        if not secrets.exists(CA_KEY_SECRET):
            raise _inconsistent_cert_without_key()
        return False, False
    created = False
    if not secrets.exists(CA_KEY_SECRET):
        fresh = create_ca(key_type=key_type, cluster_id=cluster_id, clock=clock)
        created = secrets.set_if_absent(CA_KEY_SECRET, fresh.key_pem)
        if created:
            # Another initialiser cannot have published a certificate without winning the key first;
            # should one exist anyway, the final load checks that it belongs to our key.
            with contextlib.suppress(PreconditionFailed):
                cluster.put_if_match(CA_CERT_OBJECT, fresh.cert_pem, None)
            return True, False
    # The key exists (from a crashed run or a concurrent initialiser) but the certificate may not.
    key = load_private_key_pem(secrets.get(CA_KEY_SECRET), what=f"secret {CA_KEY_SECRET}")
    if cluster.exists(CA_CERT_OBJECT):
        return created, False
    ca = create_ca(private_key=key, cluster_id=cluster_id, clock=clock)
    try:
        cluster.put_if_match(CA_CERT_OBJECT, ca.cert_pem, None)
    except PreconditionFailed:
        return created, False
    return created, True


def ensure_cluster_identity(
    cluster: ObjectStore,
    secrets: SecretStore,
    *,
    cluster_id: str,
    key_type: str = "ed25519",
    clock: Clock | None = None,
) -> EnsureResult:
    """Create whatever part of the identity is missing, never replacing an existing part; load it all."""
    created_nonce = _ensure_nonce_key(secrets)
    created_ca, repaired = _ensure_ca(cluster, secrets, cluster_id=cluster_id, key_type=key_type, clock=clock)
    identity = load_cluster_identity(cluster, secrets)
    return EnsureResult(
        identity=identity,
        created_ca=created_ca,
        repaired_ca_cert=repaired,
        created_nonce_key=created_nonce,
    )
