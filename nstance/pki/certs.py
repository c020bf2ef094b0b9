"""Issue leaf certificates from the cluster CA: client identities, server TLS, workload certificates.

Client certificates (agents and operators), compatible with upstream's auth interceptor:

* the client's public key is ECDSA P-256 or Ed25519 (what upstream's agents, operators and admins
  send). The server's mTLS ports terminate TLS with OpenSSL (``nstance.server.net.tlsfront``) because
  grpcio's own TLS cannot verify Ed25519 client certificates;
* subject CN = client id (instance id or cluster id), O = [tenant] (exactly one O);
* EKU clientAuth; KeyUsage digitalSignature; BasicConstraints CA:FALSE;
* the role extension, OID ``1.3.6.1.4.1.999999.1``, non-critical, whose value is the DER encoding of
  an ASN.1 PrintableString holding ``agent`` or ``operator``. That is byte-for-byte what upstream
  writes (Go's ``asn1.Marshal`` of a printable string produces a PrintableString). The reader
  (``decode_role``) accepts PrintableString, UTF8String and IA5String and, like upstream, falls back
  to the raw bytes when the value is not a DER string.

Server certificates get a fresh key (ECDSA P-256 unless asked for Ed25519, as upstream's servers
use), CN ``nstance-server``, O ``Nstance Server``, EKU
serverAuth and SANs: the given DNS names and IP addresses plus DNS ``nstance-server`` and
``localhost`` and IPs ``127.0.0.1`` and ``::1`` (clients verify with server name ``nstance-server``).

Workload certificates are issued for public keys agents submit (Ed25519 or ECDSA P-256), with EKU
clientAuth or serverAuth by kind, and the subject and SANs given as already-rendered strings. Their IP
SANs are read as Go's ``net.ParseIP`` reads them (``san_ip_address``), so a server rendering a
template can drop what a Go server drops; ``subject_value_problem`` says which subject values cannot
be encoded at all.

Every certificate gets a random 128-bit serial (see ``serial``), starts ``BACKDATE`` (5 min) before
now for clock skew, and never outlives the CA (its expiry is clamped to the CA's). The returned
``IssuedCertificate`` carries the serial and validity read back from the signed certificate, so a
certificate log written from it always matches the certificate.

Client certificates are assembled from DER pieces their CA encodes once (``certtemplate``), the same
bytes ``cryptography``'s builder writes at a fraction of its cost (a registration signs one); the
other kinds go through the builder.

Pure functions: no I/O; time comes from an injected Clock.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, TypeVar, get_args
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nstance.core.clock import Clock, SystemClock
from nstance.core.errors import FailedPrecondition, InvalidArgument
from nstance.pki.ca import BACKDATE, CertificateAuthority, certificate_to_pem
from nstance.pki.certtemplate import ClientTemplate, der, der_extension, der_header
from nstance.pki.keys import (
    PrivateKey,
    PublicKey,
    describe_key_types,
    generate_private_key,
    key_type_name,
    load_any_public_key_pem,
    private_key_to_pem,
)
from nstance.pki.serial import random_serial, serial_hex

Role = Literal["agent", "operator"]
ROLES: tuple[Role, ...] = get_args(Role)
WorkloadKind = Literal["client", "server"]
WORKLOAD_KINDS: tuple[WorkloadKind, ...] = get_args(WorkloadKind)

ROLE_OID = x509.ObjectIdentifier("1.3.6.1.4.1.999999.1")
CLIENT_KEY_TYPES = ("ecdsa-p256", "ed25519")
WORKLOAD_KEY_TYPES = ("ecdsa-p256", "ed25519")

DEFAULT_CLIENT_TTL = timedelta(hours=8760)
DEFAULT_SERVER_TTL = timedelta(days=365)
DEFAULT_WORKLOAD_TTL = timedelta(hours=8760)

SERVER_COMMON_NAME = "nstance-server"
SERVER_ORGANIZATION = "Nstance Server"
SERVER_DEFAULT_DNS = ("nstance-server", "localhost")
SERVER_DEFAULT_IPS = ("127.0.0.1", "::1")

_TAG_UTF8 = 0x0C
_TAG_PRINTABLE = 0x13
_TAG_IA5 = 0x16
_PRINTABLE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 '()+,-./:=?")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_T = TypeVar("_T")


# --- role extension ------------------------------------------------------------------------------


def encode_role(role: str) -> bytes:
    """DER PrintableString of ``role`` (must be a known role): the role extension's value."""
    if role not in ROLES:
        raise InvalidArgument(f"unknown role {role!r}; known roles: {', '.join(ROLES)}")
    return der(_TAG_PRINTABLE, role.encode("ascii"))


def _decode_der_string(value: bytes) -> str | None:
    if len(value) < 2 or value[0] not in (_TAG_UTF8, _TAG_PRINTABLE, _TAG_IA5):
        return None
    try:
        length, offset = der_header(value, 0)
    except ValueError:
        return None
    if offset + length != len(value):
        return None
    body = value[offset:]
    try:
        text = body.decode("utf-8") if value[0] == _TAG_UTF8 else body.decode("ascii")
    except UnicodeDecodeError:
        return None
    if value[0] == _TAG_PRINTABLE and not set(text) <= _PRINTABLE:
        return None
    return text


def decode_role(value: bytes) -> str:
    """Read the role extension's value: a DER string, or (upstream's fallback) the raw bytes as text.

    Returns the text as found; whether it is a known role is the caller's check.
    """
    text = _decode_der_string(value)
    if text is not None:
        return text
    return value.decode("utf-8", "replace")


def role_extension(role: str) -> x509.UnrecognizedExtension:
    return x509.UnrecognizedExtension(ROLE_OID, encode_role(role))


# --- results ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IssuedCertificate:
    """A freshly signed certificate and the facts a certificate log records about it.

    ``serial``, ``serial_hex``, ``not_before`` and ``not_after`` are read back from ``certificate``.
    ``private_key`` is set only when this module generated the key (server certificates).
    """

    certificate: x509.Certificate
    serial: int
    serial_hex: str
    not_before: datetime
    not_after: datetime
    private_key: PrivateKey | None = None

    @property
    def cert_pem(self) -> bytes:
        return certificate_to_pem(self.certificate)

    @property
    def key_pem(self) -> bytes | None:
        return None if self.private_key is None else private_key_to_pem(self.private_key)

    @property
    def expires_at(self) -> datetime:
        return self.not_after

    @classmethod
    def from_certificate(
        cls, cert: x509.Certificate, private_key: PrivateKey | None = None
    ) -> IssuedCertificate:
        return cls(
            certificate=cert,
            serial=cert.serial_number,
            serial_hex=serial_hex(cert.serial_number),
            not_before=cert.not_valid_before_utc,
            not_after=cert.not_valid_after_utc,
            private_key=private_key,
        )


# --- helpers ---------------------------------------------------------------------------------------


def _public_key_object(key: PublicKeyTypes | bytes | str, what: str) -> PublicKeyTypes:
    if isinstance(key, bytes | str):
        return load_any_public_key_pem(key, what=what)
    return key


def _accepted_public_key(
    key: PublicKeyTypes | bytes | str, what: str, accepted: tuple[str, ...]
) -> PublicKey:
    obj = _public_key_object(key, what)
    supported = isinstance(obj, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey)
    if supported and key_type_name(obj) in accepted:
        return obj  # type: ignore[return-value]  # narrowed by ``supported``
    raise InvalidArgument(
        f"{what} is {key_type_name(obj)}; accepted key types: {describe_key_types(accepted)}"
    )


def _client_public_key(key: PublicKeyTypes | bytes | str, what: str) -> PublicKey:
    return _accepted_public_key(key, what, CLIENT_KEY_TYPES)


def _workload_public_key(key: PublicKeyTypes | bytes | str, what: str) -> PublicKey:
    return _accepted_public_key(key, what, WORKLOAD_KEY_TYPES)


def _name(attrs: Sequence[tuple[x509.ObjectIdentifier, str]], what: str) -> x509.Name:
    try:
        return x509.Name([x509.NameAttribute(oid, value) for oid, value in attrs])
    except ValueError as exc:
        raise InvalidArgument(f"invalid {what} subject: {exc}") from exc


def _parse_ip(value: str | IPAddress, what: str) -> IPAddress:
    if isinstance(value, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return value
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text)
    except ValueError as exc:
        raise InvalidArgument(f"{what}: {value!r} is not an IP address") from exc


def san_ip_address(text: str) -> IPAddress | None:
    """The address ``text`` holds as Go's ``net.ParseIP`` reads it, or None when it holds none.

    Surrounding whitespace is ignored; otherwise as Go: no brackets, no zone (``fe80::1%eth0``),
    IPv4 in dotted decimal without leading zeros. An IPv4-mapped IPv6 address (``::ffff:10.0.0.1``)
    comes back as the IPv4 address, which is how Go's x509 writes it into a certificate (4 bytes).
    """
    value = text.strip()
    if "%" in value:
        return None
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def subject_value_problem(oid: x509.ObjectIdentifier, value: str) -> str | None:
    """Why ``value`` cannot be a subject attribute of type ``oid`` (a country not of two letters),
    or None when it can."""
    try:
        x509.NameAttribute(oid, value)
    except ValueError as exc:
        return str(exc)
    return None


def _check_dns(value: str, what: str) -> str:
    name = value.strip().lower()
    if not name or any(c.isspace() for c in name) or not name.isascii() or len(name) > 253:
        raise InvalidArgument(f"{what}: {value!r} is not a DNS name")
    return name


def _unique(items: Iterable[_T]) -> list[_T]:
    seen: set[_T] = set()
    out: list[_T] = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def _key_usage_digital_signature() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def _validity(ca: CertificateAuthority, ttl: timedelta, clock: Clock | None) -> tuple[datetime, datetime]:
    """A new certificate's not-before (backdated) and not-after (``ttl`` on, at most the CA's end)."""
    if ttl <= timedelta(0):
        raise InvalidArgument(f"certificate lifetime must be positive, got {ttl}")
    now = (clock or SystemClock()).now().replace(microsecond=0)
    ca_expiry = ca.not_after
    if ca_expiry <= now:
        raise FailedPrecondition(f"the cluster CA expired at {ca_expiry.isoformat()}; it cannot issue")
    return now - BACKDATE, min(now + ttl, ca_expiry)


def _issue(
    ca: CertificateAuthority,
    public_key: PublicKey,
    subject: x509.Name,
    *,
    eku: x509.ObjectIdentifier,
    ttl: timedelta,
    clock: Clock | None,
    extra: Sequence[x509.ExtensionType] = (),
    sans: Sequence[x509.GeneralName] = (),
) -> x509.Certificate:
    not_before, not_after = _validity(ca, ttl, clock)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .public_key(public_key)
        .serial_number(random_serial())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage_digital_signature(), critical=True)
        .add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    for ext in extra:
        builder = builder.add_extension(ext, critical=False)
    return ca.sign(builder)


# --- issuing ---------------------------------------------------------------------------------------


def issue_client_certificate(
    ca: CertificateAuthority,
    public_key: PublicKeyTypes | bytes | str,
    *,
    client_id: str,
    tenant: str,
    role: str,
    ttl: timedelta = DEFAULT_CLIENT_TTL,
    clock: Clock | None = None,
) -> IssuedCertificate:
    """Issue an agent or operator identity certificate for an ECDSA P-256 or Ed25519 public key."""
    if role not in ROLES:
        raise InvalidArgument(f"unknown role {role!r}; known roles: {', '.join(ROLES)}")
    if not client_id:
        raise InvalidArgument("client id (certificate CN) must not be empty")
    if not tenant:
        raise InvalidArgument("tenant (certificate O) must not be empty")
    key = _client_public_key(public_key, f"{role} public key")
    subject = _name(
        [(NameOID.COMMON_NAME, client_id), (NameOID.ORGANIZATION_NAME, tenant)], f"{role} certificate"
    )
    not_before, not_after = _validity(ca, ttl, clock)
    template = _client_template(ca)
    tbs = template.tbs(
        serial=random_serial(),
        not_before=not_before,
        not_after=not_after,
        subject=subject,
        key=key,
        tail=(_role_extension_der(role),),
    )
    return IssuedCertificate.from_certificate(template.sign(tbs))


def _client_head_extensions() -> list[tuple[x509.ExtensionType, bool]]:
    """The extensions (value, critical) every client certificate carries before its key identifier."""
    return [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (_key_usage_digital_signature(), True),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False),
    ]


#: The template of the CA that signed last (a CA is replaced only when it is rotated).
_last_template: list[ClientTemplate] = []


def _client_template(ca: CertificateAuthority) -> ClientTemplate:
    """The client certificate template of ``ca``: the last one made, if it was made for ``ca``."""
    if _last_template and _last_template[0].ca is ca:
        return _last_template[0]
    template = ClientTemplate(ca, _client_head_extensions())
    _last_template[:] = [template]
    return template


@functools.lru_cache(maxsize=len(ROLES))
def _role_extension_der(role: str) -> bytes:
    return der_extension(role_extension(role), critical=False)


def server_subject_alternative_names(
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str | IPAddress] = (),
    hosts: Iterable[str] = (),
) -> list[x509.GeneralName]:
    """The SAN list of a server certificate (see module docstring); ``hosts`` may mix names and IPs.

    Unspecified addresses (``0.0.0.0``, ``::``, typical bind hosts) and empty hosts are skipped.
    """
    dns: list[str] = []
    ips: list[IPAddress] = []
    for host in hosts:
        text = host.strip()
        if not text:
            continue
        try:
            ips.append(_parse_ip(text, "server host"))
        except InvalidArgument:
            dns.append(_check_dns(text, "server host"))
    dns.extend(_check_dns(d, "server DNS name") for d in dns_names)
    ips.extend(_parse_ip(i, "server IP address") for i in ip_addresses)
    dns.extend(SERVER_DEFAULT_DNS)
    ips.extend(ipaddress.ip_address(i) for i in SERVER_DEFAULT_IPS)
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in _unique(dns)]
    names.extend(x509.IPAddress(i) for i in _unique(ips) if not i.is_unspecified)
    return names


def issue_server_certificate(
    ca: CertificateAuthority,
    *,
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str | IPAddress] = (),
    hosts: Iterable[str] = (),
    ttl: timedelta = DEFAULT_SERVER_TTL,
    clock: Clock | None = None,
    key_type: str = "ecdsa-p256",
) -> IssuedCertificate:
    """Generate a key (``key_type``) and a serverAuth certificate for it; the key is in the result.

    ECDSA P-256 by default: grpcio clients (this project's agents before Ed25519 support, and any
    grpcio-based tool) cannot verify an Ed25519 server certificate.
    """
    key = generate_private_key(key_type)
    subject = _name(
        [(NameOID.COMMON_NAME, SERVER_COMMON_NAME), (NameOID.ORGANIZATION_NAME, SERVER_ORGANIZATION)],
        "server certificate",
    )
    try:
        sans = server_subject_alternative_names(dns_names, ip_addresses, hosts)
        cert = _issue(
            ca,
            key.public_key(),
            subject,
            eku=ExtendedKeyUsageOID.SERVER_AUTH,
            ttl=ttl,
            clock=clock,
            sans=sans,
        )
    except ValueError as exc:  # e.g. a DNS name cryptography refuses to encode
        raise InvalidArgument(f"invalid server certificate: {exc}") from exc
    return IssuedCertificate.from_certificate(cert, private_key=key)


def issue_workload_certificate(
    ca: CertificateAuthority,
    public_key: PublicKeyTypes | bytes | str,
    *,
    kind: str,
    common_name: str,
    organization: Sequence[str] = (),
    country: Sequence[str] = (),
    province: Sequence[str] = (),
    locality: Sequence[str] = (),
    street_address: Sequence[str] = (),
    postal_code: Sequence[str] = (),
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    uris: Sequence[str] = (),
    ttl: timedelta = DEFAULT_WORKLOAD_TTL,
    clock: Clock | None = None,
) -> IssuedCertificate:
    """Issue a workload certificate (template ``files`` of kind ``certificate``) for an agent's key.

    ``kind`` picks the EKU (``client`` -> clientAuth, ``server`` -> serverAuth). All strings are used
    as given (templates were rendered by the caller); IPs are read by ``san_ip_address``. Anything
    that is not an IP, a URI without a scheme or a subject value that cannot be encoded is refused:
    callers that must drop such entries instead, as upstream does, filter them first.
    """
    if kind not in WORKLOAD_KINDS:
        raise InvalidArgument(f"unknown certificate kind {kind!r}; use one of: {', '.join(WORKLOAD_KINDS)}")
    if not common_name:
        raise InvalidArgument("workload certificate common name must not be empty")
    key = _workload_public_key(public_key, "workload public key")
    attrs: list[tuple[x509.ObjectIdentifier, str]] = [(NameOID.COMMON_NAME, common_name)]
    for oid, values in (
        (NameOID.ORGANIZATION_NAME, organization),
        (NameOID.COUNTRY_NAME, country),
        (NameOID.STATE_OR_PROVINCE_NAME, province),
        (NameOID.LOCALITY_NAME, locality),
        (NameOID.STREET_ADDRESS, street_address),
        (NameOID.POSTAL_CODE, postal_code),
    ):
        attrs.extend((oid, v) for v in values)
    subject = _name(attrs, "workload certificate")
    sans: list[x509.GeneralName] = [x509.DNSName(_check_dns(d, "workload DNS name")) for d in dns_names]
    for text in ip_addresses:
        ip = san_ip_address(text)
        if ip is None:
            raise InvalidArgument(f"workload IP address: {text!r} is not an IP address")
        sans.append(x509.IPAddress(ip))
    for uri in uris:
        if not urlsplit(uri).scheme:
            raise InvalidArgument(f"workload URI {uri!r} must be an absolute URI with a scheme")
        sans.append(x509.UniformResourceIdentifier(uri))
    eku = ExtendedKeyUsageOID.SERVER_AUTH if kind == "server" else ExtendedKeyUsageOID.CLIENT_AUTH
    try:
        cert = _issue(ca, key, subject, eku=eku, ttl=ttl, clock=clock, sans=sans)
    except ValueError as exc:
        raise InvalidArgument(f"invalid workload certificate: {exc}") from exc
    return IssuedCertificate.from_certificate(cert)
