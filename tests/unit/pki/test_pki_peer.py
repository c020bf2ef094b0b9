"""Client-certificate verification: who the caller is, and every way a certificate is refused."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nstance.core.clock import ManualClock
from nstance.core.errors import PermissionDenied, Unauthenticated
from nstance.pki import ca as ca_mod
from nstance.pki import certs, keys, peer
from nstance.pki.serial import random_serial

START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture(params=["ecdsa-p256", "ed25519"])
def authority(request: pytest.FixtureRequest, clock: ManualClock) -> ca_mod.CertificateAuthority:
    return ca_mod.create_ca(key_type=request.param, cluster_id="prod", clock=clock)


def _issue(
    authority: ca_mod.CertificateAuthority, clock: ManualClock, role: str = "agent"
) -> certs.IssuedCertificate:
    return certs.issue_client_certificate(
        authority,
        keys.generate_private_key().public_key(),
        client_id="knc06bgm7733st2576nx5jht4ecjw",
        tenant="acme",
        role=role,
        clock=clock,
    )


def _custom(
    authority: ca_mod.CertificateAuthority,
    *,
    subject: list[tuple[x509.ObjectIdentifier, str]] | None = None,
    eku: list[x509.ObjectIdentifier] | None = None,
    role_value: bytes | None = b"\x13\x05agent",
    is_ca: bool = False,
    edit: Callable[[x509.CertificateBuilder], x509.CertificateBuilder] | None = None,
) -> x509.Certificate:
    """A leaf signed by ``authority`` with exactly the features a test needs."""
    attrs = (
        subject if subject is not None else [(NameOID.COMMON_NAME, "c1"), (NameOID.ORGANIZATION_NAME, "t")]
    )
    key = keys.generate_private_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(o, v) for o, v in attrs]))
        .public_key(key.public_key())
        .serial_number(random_serial())
        .not_valid_before(START - timedelta(minutes=5))
        .not_valid_after(START + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if eku is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(eku), critical=False)
    if role_value is not None:
        builder = builder.add_extension(
            x509.UnrecognizedExtension(certs.ROLE_OID, role_value), critical=False
        )
    if edit is not None:
        builder = edit(builder)
    return authority.sign(builder)


@pytest.mark.parametrize("role", ["agent", "operator"])
def test_issued_certificate_verifies_to_its_identity(
    authority: ca_mod.CertificateAuthority, clock: ManualClock, role: str
) -> None:
    issued = _issue(authority, clock, role)
    identity = peer.verify_client_certificate(issued.cert_pem, authority, clock=clock)
    assert identity.client_id == "knc06bgm7733st2576nx5jht4ecjw"
    assert identity.tenant == "acme"
    assert identity.role == role
    assert identity.serial == issued.serial_hex
    assert identity.not_after == issued.not_after
    assert identity.certificate == issued.certificate


def test_der_input_and_bare_ca_certificate_work(
    authority: ca_mod.CertificateAuthority, clock: ManualClock
) -> None:
    issued = _issue(authority, clock)
    der = issued.certificate.public_bytes(serialization.Encoding.DER)
    identity = peer.verify_client_certificate(der, authority.certificate, clock=clock)
    assert identity.tenant == "acme"


def test_validity_window_edges(authority: ca_mod.CertificateAuthority, clock: ManualClock) -> None:
    issued = _issue(authority, clock)
    clock.advance(timedelta(hours=8760))  # exactly not_after: still valid
    assert peer.verify_client_certificate(issued.cert_pem, authority, clock=clock).role == "agent"
    clock.advance(1)
    with pytest.raises(Unauthenticated, match=r"client certificate expired at 2027-03-01T12:00:00\+00:00"):
        peer.verify_client_certificate(issued.cert_pem, authority, clock=clock)


def test_certificate_not_yet_valid(authority: ca_mod.CertificateAuthority, clock: ManualClock) -> None:
    later = ManualClock(START + timedelta(hours=1))
    issued = _issue(authority, later)  # starts at START + 55 min
    with pytest.raises(Unauthenticated, match="client certificate is not valid until 2026-03-01T12:55:00"):
        peer.verify_client_certificate(issued.cert_pem, authority, clock=clock)


def test_certificate_from_another_ca_is_refused(clock: ManualClock) -> None:
    ours = ca_mod.create_ca(clock=clock)
    theirs = ca_mod.create_ca(clock=clock)  # same subject, different key
    issued = _issue(theirs, clock)
    with pytest.raises(Unauthenticated, match="not issued by this cluster's CA"):
        peer.verify_client_certificate(issued.cert_pem, ours, clock=clock)


def test_certificate_with_tampered_signature_is_refused(
    authority: ca_mod.CertificateAuthority, clock: ManualClock
) -> None:
    der = bytearray(_issue(authority, clock).certificate.public_bytes(serialization.Encoding.DER))
    der[-3] ^= 0x01  # inside the signature
    with pytest.raises(Unauthenticated, match="not issued by this cluster's CA"):
        peer.verify_client_certificate(bytes(der), authority, clock=clock)


def test_expired_ca_is_refused(clock: ManualClock) -> None:
    authority = ca_mod.create_ca(ttl=timedelta(days=1), clock=clock)
    issued = _issue(authority, clock)  # clamped to the CA's expiry
    clock.advance(timedelta(days=1, seconds=1))
    with pytest.raises(Unauthenticated, match="expired at"):
        peer.verify_client_certificate(issued.cert_pem, authority, clock=clock)


def test_server_certificate_is_not_a_client_identity(
    authority: ca_mod.CertificateAuthority, clock: ManualClock
) -> None:
    server = certs.issue_server_certificate(authority, clock=clock)
    with pytest.raises(Unauthenticated, match=r"not valid for client authentication \(EKU clientAuth\)"):
        peer.verify_client_certificate(server.cert_pem, authority, clock=clock)


def test_the_ca_certificate_itself_is_refused(
    authority: ca_mod.CertificateAuthority, clock: ManualClock
) -> None:
    with pytest.raises(Unauthenticated, match="is a CA certificate"):
        peer.verify_client_certificate(authority.cert_pem, authority, clock=clock)


@pytest.mark.parametrize(
    ("features", "message"),
    [
        ({"eku": None}, "has no Extended Key Usage"),
        ({"eku": [ExtendedKeyUsageOID.SERVER_AUTH]}, "EKU clientAuth"),
        ({"is_ca": True}, "is a CA certificate"),
        ({"subject": [(NameOID.COMMON_NAME, "c1")]}, r"has 0 organization \(O, the tenant\) values"),
        (
            {
                "subject": [
                    (NameOID.COMMON_NAME, "c1"),
                    (NameOID.ORGANIZATION_NAME, "a"),
                    (NameOID.ORGANIZATION_NAME, "b"),
                ]
            },
            r"has 2 organization \(O, the tenant\) values in its subject; exactly one is required",
        ),
        ({"subject": [(NameOID.ORGANIZATION_NAME, "t")]}, r"has 0 common name \(CN\) values"),
        ({"role_value": None}, r"has no role extension \(1\.3\.6\.1\.4\.1\.999999\.1\)"),
        ({"role_value": b"\x13\x05admin"}, "unknown role 'admin'; known roles: agent, operator"),
        ({"role_value": b""}, "unknown role ''"),
    ],
)
def test_malformed_identities_are_refused(
    authority: ca_mod.CertificateAuthority, clock: ManualClock, features: dict[str, object], message: str
) -> None:
    options = dict(features)  # parameters are shared between the CA key types: do not mutate them
    eku = options.pop("eku", [ExtendedKeyUsageOID.CLIENT_AUTH])
    cert = _custom(authority, eku=eku, **options)  # type: ignore[arg-type]
    with pytest.raises(Unauthenticated, match=message):
        peer.verify_client_certificate(cert, authority, clock=clock)


@pytest.mark.parametrize("role_value", [b"\x0c\x05agent", b"\x16\x05agent", b"agent"])
def test_other_role_encodings_from_upstream_tools_are_read(
    authority: ca_mod.CertificateAuthority, clock: ManualClock, role_value: bytes
) -> None:
    cert = _custom(authority, eku=[ExtendedKeyUsageOID.CLIENT_AUTH], role_value=role_value)
    assert peer.verify_client_certificate(cert, authority, clock=clock).role == "agent"


@pytest.mark.parametrize(
    "data", [b"", b"garbage", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"]
)
def test_unreadable_certificates_are_unauthenticated(
    authority: ca_mod.CertificateAuthority, data: bytes
) -> None:
    with pytest.raises(Unauthenticated, match=r"client certificate is not a readable X\.509 certificate"):
        peer.verify_client_certificate(data, authority)


def test_require_role(authority: ca_mod.CertificateAuthority, clock: ManualClock) -> None:
    identity = peer.verify_client_certificate(
        _issue(authority, clock, "agent").cert_pem, authority, clock=clock
    )
    peer.require_role(identity, "agent")
    with pytest.raises(PermissionDenied, match="agent 'knc06bgm7733st2576nx5jht4ecjw' may not call"):
        peer.require_role(identity, "operator")


def test_a_certificate_verified_once_is_then_checked_for_time_only(
    authority: ca_mod.CertificateAuthority, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    verified = peer.VerifiedCertificates()
    issued = _issue(authority, clock)
    first = peer.verify_client_certificate(issued.cert_pem, authority, clock=clock, verified=verified)
    assert len(verified) == 1

    def no_full_check(*_: object) -> peer.PeerIdentity:
        raise AssertionError("verified again")

    monkeypatch.setattr(peer, "_verify", no_full_check)
    again = peer.verify_client_certificate(issued.cert_pem, authority, clock=clock, verified=verified)
    assert again == first
    clock.advance(timedelta(hours=8760, seconds=1))  # past not_after: time is checked on every call
    with pytest.raises(Unauthenticated, match="client certificate expired at"):
        peer.verify_client_certificate(issued.cert_pem, authority, clock=clock, verified=verified)


def test_a_kept_certificate_is_not_taken_for_verified_by_another_ca(clock: ManualClock) -> None:
    ours = ca_mod.create_ca(clock=clock)
    theirs = ca_mod.create_ca(clock=clock)
    verified = peer.VerifiedCertificates()
    issued = _issue(theirs, clock)
    peer.verify_client_certificate(issued.cert_pem, theirs, clock=clock, verified=verified)
    with pytest.raises(Unauthenticated, match="not issued by this cluster's CA"):
        peer.verify_client_certificate(issued.cert_pem, ours, clock=clock, verified=verified)
    assert len(verified) == 1  # the refusal is not kept


def test_verified_certificates_keep_at_most_their_size_dropping_the_oldest(
    authority: ca_mod.CertificateAuthority, clock: ManualClock
) -> None:
    verified = peer.VerifiedCertificates(size=2)
    pems = [_issue(authority, clock).cert_pem for _ in range(3)]
    for pem in pems:
        peer.verify_client_certificate(pem, authority, clock=clock, verified=verified)
    assert len(verified) == 2
    key = (pems[0].encode() if isinstance(pems[0], str) else pems[0], authority.certificate)
    assert verified.get(key) is None  # the oldest went first
