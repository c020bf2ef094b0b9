"""The cluster CA: what a new CA looks like, and what loading an existing one checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from nstance.core.clock import ManualClock
from nstance.core.errors import InvalidArgument
from nstance.pki import ca as ca_mod
from nstance.pki import certs, keys

START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.mark.parametrize("key_type", ["ecdsa-p256", "ed25519"])
def test_new_ca_is_a_self_signed_ca_with_the_right_extensions(key_type: str, clock: ManualClock) -> None:
    authority = ca_mod.create_ca(key_type=key_type, cluster_id="prod", clock=clock)
    cert = authority.certificate

    assert authority.key_type == key_type
    cert.verify_directly_issued_by(cert)  # self-signed
    assert cert.subject == cert.issuer
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "Nstance CA"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "Nstance Cluster prod"
    assert cert.subject.get_attributes_for_oid(NameOID.COUNTRY_NAME)[0].value == "US"

    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical
    assert bc.value.ca
    assert bc.value.path_length == 1
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert ku.critical
    assert ku.value.digital_signature
    assert ku.value.key_cert_sign
    assert ku.value.crl_sign
    assert not ku.value.key_encipherment
    ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == ski.digest

    assert cert.not_valid_before_utc == START - timedelta(minutes=5)
    assert cert.not_valid_after_utc == START + timedelta(days=3650)
    assert 0 < cert.serial_number < 2**128


def test_default_ca_key_is_ecdsa_p256_and_organization_defaults_to_unknown(clock: ManualClock) -> None:
    authority = ca_mod.create_ca(clock=clock)
    assert authority.key_type == "ecdsa-p256"
    org = authority.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value
    assert org == "Nstance Cluster Unknown"


def test_subject_and_lifetime_are_overridable(clock: ManualClock) -> None:
    authority = ca_mod.create_ca(
        common_name="Acme CA", organization="Acme", country=None, ttl=timedelta(days=30), clock=clock
    )
    subject = authority.subject
    assert subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "Acme CA"
    assert subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "Acme"
    assert subject.get_attributes_for_oid(NameOID.COUNTRY_NAME) == []
    assert authority.not_after == START + timedelta(days=30)


def test_supplied_key_is_used(clock: ManualClock) -> None:
    key = keys.generate_private_key("ed25519")
    authority = ca_mod.create_ca(private_key=key, clock=clock)
    assert keys.public_keys_equal(authority.certificate.public_key(), key)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key_type": "rsa"}, "unsupported key type 'rsa'"),
        ({"ttl": timedelta(0)}, "CA lifetime must be positive"),
        ({"common_name": ""}, "common name must not be empty"),
        ({"country": "USA"}, "invalid CA subject"),
    ],
)
def test_bad_ca_parameters_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        ca_mod.create_ca(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("key_type", ["ecdsa-p256", "ed25519"])
def test_load_ca_round_trip(key_type: str) -> None:
    authority = ca_mod.create_ca(key_type=key_type)
    loaded = ca_mod.load_ca(authority.cert_pem, authority.key_pem.decode())
    assert loaded.certificate == authority.certificate
    assert loaded.key_pem == authority.key_pem


def test_load_ca_refuses_a_key_from_another_ca() -> None:
    one, two = ca_mod.create_ca(), ca_mod.create_ca()
    with pytest.raises(InvalidArgument, match="CA key does not match the CA certificate"):
        ca_mod.load_ca(one.cert_pem, two.key_pem)


def test_load_ca_refuses_a_leaf_certificate() -> None:
    authority = ca_mod.create_ca()
    issued = certs.issue_server_certificate(authority)
    assert issued.key_pem is not None
    with pytest.raises(InvalidArgument, match=r"is not a CA \(BasicConstraints CA:TRUE missing\)"):
        ca_mod.load_ca(issued.cert_pem, issued.key_pem)


def test_load_ca_refuses_a_ca_that_may_not_sign_certificates() -> None:
    key = keys.generate_private_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "weird")])
    now = START
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(7)
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, ca_mod.signature_hash(key))
    )
    with pytest.raises(InvalidArgument, match="keyCertSign missing"):
        ca_mod.load_ca(ca_mod.certificate_to_pem(cert), keys.private_key_to_pem(key))


def test_load_ca_refuses_an_rsa_key() -> None:
    authority = ca_mod.create_ca()
    rsa_pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(InvalidArgument, match=r"CA key is rsa-2048; accepted key types: ECDSA P-256"):
        ca_mod.load_ca(authority.cert_pem, rsa_pem)


def test_load_ca_refuses_garbage() -> None:
    authority = ca_mod.create_ca()
    with pytest.raises(InvalidArgument, match=r"CA certificate is not a readable X\.509 certificate"):
        ca_mod.load_ca(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", authority.key_pem)
    with pytest.raises(InvalidArgument, match="CA key is not PEM"):
        ca_mod.load_ca(authority.cert_pem, b"nope")


def test_parse_certificate_reads_pem_der_and_objects() -> None:
    cert = ca_mod.create_ca().certificate
    der = cert.public_bytes(serialization.Encoding.DER)
    assert ca_mod.parse_certificate(der) == cert
    assert ca_mod.parse_certificate(ca_mod.certificate_to_pem(cert).decode()) == cert
    assert ca_mod.parse_certificate(cert) is cert
