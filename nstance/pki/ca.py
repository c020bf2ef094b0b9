"""The cluster certificate authority: create a new one, load an existing one, sign with it.

A new CA is a self-signed certificate with BasicConstraints CA (path length 1, critical), KeyUsage
digitalSignature | keyCertSign | cRLSign (critical), and Subject/Authority Key Identifiers. Its key is
ECDSA P-256 by default; Ed25519 is accepted so a CA created by upstream Nstance keeps working (an
Ed25519 CA may sign ECDSA P-256 leaves, which grpcio accepts). Subject: CN ``Nstance CA``,
O ``Nstance Cluster <cluster id>``, C ``US`` (upstream's defaults; all overridable).

Unlike upstream (serial 1) the CA gets a random 128-bit serial like every other certificate, and its
validity starts a few minutes in the past so peers with a slightly slow clock accept it at once.

This module never reads or writes storage or secrets: the caller persists ``cert_pem`` (cluster storage,
``ca.crt``) and ``key_pem`` (secret ``ca.key``) and passes them back to ``load_ca``. Time comes from
an injected Clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from nstance.core.clock import Clock, SystemClock
from nstance.core.errors import InvalidArgument
from nstance.pki.keys import (
    KEY_TYPES,
    PrivateKey,
    PublicKey,
    generate_private_key,
    key_type_name,
    load_private_key_pem,
    private_key_to_pem,
    public_keys_equal,
    require_private_key,
    require_public_key,
)
from nstance.pki.serial import random_serial

DEFAULT_CA_TTL = timedelta(days=3650)
DEFAULT_CA_COMMON_NAME = "Nstance CA"
DEFAULT_CA_COUNTRY = "US"
# Every certificate we issue starts this far in the past, so a peer whose clock runs a little slow
# does not reject a certificate issued a moment ago as "not yet valid".
BACKDATE = timedelta(minutes=5)


def default_ca_organization(cluster_id: str | None) -> str:
    """``Nstance Cluster <cluster_id>``; ``Nstance Cluster Unknown`` without a cluster id (upstream)."""
    return f"Nstance Cluster {cluster_id or 'Unknown'}"


def signature_hash(key: PrivateKey) -> hashes.SHA256 | None:
    """The hash to pass to ``sign``: SHA-256 for ECDSA, none for Ed25519 (it hashes internally)."""
    return hashes.SHA256() if isinstance(key, ec.EllipticCurvePrivateKey) else None


def certificate_to_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def parse_certificate(data: bytes | str | x509.Certificate, *, what: str = "certificate") -> x509.Certificate:
    """Read one certificate given as a parsed object, PEM (bytes or text) or DER bytes.

    Raise InvalidArgument saying what is wrong. Only the first PEM block is read.
    """
    if isinstance(data, x509.Certificate):
        return data
    raw = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data)
    try:
        if raw.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_certificate(raw.strip())
        return x509.load_der_x509_certificate(raw)
    except ValueError as exc:
        raise InvalidArgument(f"{what} is not a readable X.509 certificate (PEM or DER): {exc}") from exc


def _ski(key: PublicKey) -> x509.SubjectKeyIdentifier:
    return x509.SubjectKeyIdentifier.from_public_key(key)


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    """A CA certificate together with its private key."""

    certificate: x509.Certificate
    private_key: PrivateKey

    @property
    def cert_pem(self) -> bytes:
        return certificate_to_pem(self.certificate)

    @property
    def key_pem(self) -> bytes:
        return private_key_to_pem(self.private_key)

    @property
    def key_type(self) -> str:
        return key_type_name(self.private_key)

    @property
    def public_key(self) -> PublicKey:
        return self.private_key.public_key()

    @property
    def subject(self) -> x509.Name:
        return self.certificate.subject

    @property
    def not_after(self) -> datetime:
        return self.certificate.not_valid_after_utc

    def authority_key_identifier(self) -> x509.AuthorityKeyIdentifier:
        """The AKI for certificates this CA signs: its own SKI when present, else derived from its key."""
        try:
            ski = self.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        except x509.ExtensionNotFound:
            return x509.AuthorityKeyIdentifier.from_issuer_public_key(self.public_key)
        return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)

    def sign(self, builder: x509.CertificateBuilder) -> x509.Certificate:
        """Sign a prepared builder (issuer name and AKI are set here) with the CA key."""
        builder = builder.issuer_name(self.certificate.subject).add_extension(
            self.authority_key_identifier(), critical=False
        )
        return builder.sign(private_key=self.private_key, algorithm=signature_hash(self.private_key))


def create_ca(
    *,
    key_type: str = "ecdsa-p256",
    common_name: str = DEFAULT_CA_COMMON_NAME,
    organization: str | None = None,
    cluster_id: str | None = None,
    country: str | None = DEFAULT_CA_COUNTRY,
    ttl: timedelta = DEFAULT_CA_TTL,
    clock: Clock | None = None,
    private_key: PrivateKey | None = None,
) -> CertificateAuthority:
    """Create a self-signed CA. ``private_key`` may be supplied (its type wins over ``key_type``).

    ``organization`` defaults to ``Nstance Cluster <cluster_id>``.
    """
    if ttl <= timedelta(0):
        raise InvalidArgument(f"CA lifetime must be positive, got {ttl}")
    if not common_name:
        raise InvalidArgument("CA common name must not be empty")
    key = (
        require_private_key(private_key, KEY_TYPES, what="CA key")
        if private_key is not None
        else generate_private_key(key_type)
    )
    now = (clock or SystemClock()).now().replace(microsecond=0)
    org = organization if organization is not None else default_ca_organization(cluster_id)
    pairs = [
        (NameOID.COMMON_NAME, common_name),
        (NameOID.ORGANIZATION_NAME, org),
        (NameOID.COUNTRY_NAME, country),
    ]
    try:
        name = x509.Name([x509.NameAttribute(oid, value) for oid, value in pairs if value])
    except ValueError as exc:
        raise InvalidArgument(f"invalid CA subject: {exc}") from exc
    public = key.public_key()
    ski = _ski(public)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(random_serial())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + ttl)
        .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
    )
    cert = builder.sign(private_key=key, algorithm=signature_hash(key))
    return CertificateAuthority(certificate=cert, private_key=key)


def load_ca(cert_pem: bytes | str, key_pem: bytes | str) -> CertificateAuthority:
    """Load a CA from its certificate and key PEM; check that they belong together and can sign.

    Raise InvalidArgument naming the problem: unreadable input, unsupported key type, a key that is
    not the certificate's, a certificate that is not a CA, or one without the keyCertSign usage.
    """
    cert = parse_certificate(cert_pem, what="CA certificate")
    key = load_private_key_pem(key_pem, KEY_TYPES, what="CA key")
    cert_key = require_public_key(cert.public_key(), KEY_TYPES, what="CA certificate key")
    if not public_keys_equal(cert_key, key):
        raise InvalidArgument("CA key does not match the CA certificate (different public keys)")
    try:
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    if bc is None or not bc.ca:
        raise InvalidArgument("CA certificate is not a CA (BasicConstraints CA:TRUE missing)")
    try:
        ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        ku = None
    if ku is None or not ku.key_cert_sign:
        raise InvalidArgument("CA certificate may not sign certificates (KeyUsage keyCertSign missing)")
    return CertificateAuthority(certificate=cert, private_key=key)
