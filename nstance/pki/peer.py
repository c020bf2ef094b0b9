"""Peer identity: check a client certificate presented over mTLS and say who the caller is.

``verify_client_certificate`` applies the same rules as upstream's auth interceptor, and a few more:

* the certificate was signed by the cluster CA (the signature is verified with the CA public key;
  ECDSA and Ed25519 CA keys both work) and names the CA as its issuer;
* it is not itself a CA certificate;
* it is within its validity period at ``clock.now()`` (and the CA is too);
* its Extended Key Usage includes clientAuth (a certificate without EKU is refused);
* its subject has exactly one non-empty CN (the client id) and exactly one O (the tenant);
* the role extension (OID 1.3.6.1.4.1.999999.1) is present and names a known role.

Any failure raises ``core.errors.Unauthenticated`` with a message saying what is wrong. Whether the
role may call a given endpoint is a separate question: ``require_role`` raises PermissionDenied.
Revocation (deny-list by serial) is the interceptor's job; the identity carries the serial for it.

Pure: no I/O; time comes from an injected Clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nstance.core.clock import Clock, SystemClock
from nstance.core.errors import InvalidArgument, PermissionDenied, Unauthenticated
from nstance.pki.ca import CertificateAuthority, parse_certificate
from nstance.pki.certs import ROLE_OID, ROLES, decode_role
from nstance.pki.serial import serial_hex


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    """Who a verified client certificate says the caller is."""

    client_id: str
    tenant: str
    role: str
    serial: str  # canonical lowercase hex, as in certificate records
    not_after: datetime
    certificate: x509.Certificate = field(repr=False, compare=False)


def _ca_certificate(ca: CertificateAuthority | x509.Certificate) -> x509.Certificate:
    return ca.certificate if isinstance(ca, CertificateAuthority) else ca


def _single_attribute(name: x509.Name, oid: x509.ObjectIdentifier, label: str) -> str:
    values = [a.value for a in name.get_attributes_for_oid(oid)]
    if len(values) != 1:
        raise Unauthenticated(
            f"client certificate has {len(values)} {label} values in its subject; exactly one is required"
        )
    value = values[0]
    text = value if isinstance(value, str) else value.decode("utf-8", "replace")
    if not text:
        raise Unauthenticated(f"client certificate has an empty {label}")
    return text


def _check_times(leaf: x509.Certificate, ca_cert: x509.Certificate, now: datetime) -> None:
    """Refuse a leaf or a CA outside its validity period at ``now``."""
    if now < leaf.not_valid_before_utc:
        raise Unauthenticated(
            f"client certificate is not valid until {leaf.not_valid_before_utc.isoformat()} "
            f"(now {now.isoformat()}; check clocks)"
        )
    if now > leaf.not_valid_after_utc:
        raise Unauthenticated(f"client certificate expired at {leaf.not_valid_after_utc.isoformat()}")
    if now > ca_cert.not_valid_after_utc:
        raise Unauthenticated(f"the cluster CA expired at {ca_cert.not_valid_after_utc.isoformat()}")
    if now < ca_cert.not_valid_before_utc:
        raise Unauthenticated(f"the cluster CA is not valid until {ca_cert.not_valid_before_utc.isoformat()}")


class VerifiedCertificates:
    """Client certificates already verified against a CA, so a caller's next RPC skips the work.

    What ``verify_client_certificate`` checks of a certificate besides time (the CA's signature, no CA
    flag, the EKU, the subject, the role) depends only on its bytes and the CA certificate: the
    identity is kept for that pair (at most ``size`` of them; the oldest is dropped first). The
    validity periods are checked again on every call, and revocation stays the caller's check. A
    certificate that failed is not kept: it fails again the full way.
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._known: dict[tuple[bytes, x509.Certificate], PeerIdentity] = {}

    def get(self, key: tuple[bytes, x509.Certificate]) -> PeerIdentity | None:
        return self._known.get(key)

    def put(self, key: tuple[bytes, x509.Certificate], identity: PeerIdentity) -> None:
        if len(self._known) >= self._size:
            del self._known[next(iter(self._known))]
        self._known[key] = identity

    def __len__(self) -> int:
        return len(self._known)


def verify_client_certificate(
    cert: bytes | str | x509.Certificate,
    ca: CertificateAuthority | x509.Certificate,
    *,
    clock: Clock | None = None,
    verified: VerifiedCertificates | None = None,
) -> PeerIdentity:
    """Verify ``cert`` (PEM, DER or parsed) against the CA and return the caller's identity.

    With ``verified``, a certificate (bytes or text) that passed before with the same CA is only
    checked for time.
    """
    if verified is None or isinstance(cert, x509.Certificate):
        return _verify(cert, ca, clock)
    ca_cert = _ca_certificate(ca)
    key = (cert.encode() if isinstance(cert, str) else bytes(cert), ca_cert)
    known = verified.get(key)
    if known is not None:
        _check_times(known.certificate, ca_cert, (clock or SystemClock()).now())
        return known
    identity = _verify(cert, ca, clock)
    verified.put(key, identity)
    return identity


def _verify(
    cert: bytes | str | x509.Certificate, ca: CertificateAuthority | x509.Certificate, clock: Clock | None
) -> PeerIdentity:
    try:
        leaf = parse_certificate(cert, what="client certificate")
    except InvalidArgument as exc:
        raise Unauthenticated(str(exc)) from exc
    ca_cert = _ca_certificate(ca)

    try:
        leaf.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise Unauthenticated("client certificate was not issued by this cluster's CA") from exc

    try:
        bc = leaf.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    if bc is not None and bc.ca:
        raise Unauthenticated("client certificate is a CA certificate, not a client identity")

    _check_times(leaf, ca_cert, (clock or SystemClock()).now())

    try:
        eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound as exc:
        raise Unauthenticated("client certificate has no Extended Key Usage (clientAuth required)") from exc
    if ExtendedKeyUsageOID.CLIENT_AUTH not in eku and ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE not in eku:
        raise Unauthenticated("client certificate is not valid for client authentication (EKU clientAuth)")

    client_id = _single_attribute(leaf.subject, NameOID.COMMON_NAME, "common name (CN)")
    tenant = _single_attribute(leaf.subject, NameOID.ORGANIZATION_NAME, "organization (O, the tenant)")

    try:
        ext = leaf.extensions.get_extension_for_oid(ROLE_OID).value
    except x509.ExtensionNotFound as exc:
        raise Unauthenticated(f"client certificate has no role extension ({ROLE_OID.dotted_string})") from exc
    raw = ext.value if isinstance(ext, x509.UnrecognizedExtension) else b""
    role = decode_role(raw)
    if role not in ROLES:
        raise Unauthenticated(
            f"client certificate has unknown role {role!r}; known roles: {', '.join(ROLES)}"
        )

    if leaf.serial_number <= 0:
        raise Unauthenticated("client certificate has a non-positive serial number")
    return PeerIdentity(
        client_id=client_id,
        tenant=tenant,
        role=role,
        serial=serial_hex(leaf.serial_number),
        not_after=leaf.not_valid_after_utc,
        certificate=leaf,
    )


def require_role(identity: PeerIdentity, role: str) -> None:
    """Raise PermissionDenied unless ``identity`` has ``role`` (the endpoint's required role)."""
    if identity.role != role:
        raise PermissionDenied(
            f"{identity.role} {identity.client_id!r} may not call this endpoint (role {role!r} required)"
        )
