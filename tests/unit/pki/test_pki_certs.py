"""Client, server and workload certificates, the role extension and serial numbers."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nstance.core.clock import ManualClock
from nstance.core.errors import FailedPrecondition, InvalidArgument
from nstance.pki import ca as ca_mod
from nstance.pki import certs, keys, serial
from nstance.pki.peer import verify_client_certificate

START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture(params=["ecdsa-p256", "ed25519"])
def authority(request: pytest.FixtureRequest, clock: ManualClock) -> ca_mod.CertificateAuthority:
    return ca_mod.create_ca(key_type=request.param, cluster_id="prod", clock=clock)


def _attr(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> list[str]:
    return [str(a.value) for a in cert.subject.get_attributes_for_oid(oid)]


# --- client certificates -------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["agent", "operator"])
def test_client_certificate_matches_upstream_layout(
    authority: ca_mod.CertificateAuthority, clock: ManualClock, role: str
) -> None:
    client_key = keys.generate_private_key("ecdsa-p256")
    issued = certs.issue_client_certificate(
        authority, keys.public_key_to_pem(client_key), client_id="knc06bgm7733st2576nx5jht4ecjw",
        tenant="acme", role=role, clock=clock,
    )  # fmt: skip
    cert = issued.certificate

    cert.verify_directly_issued_by(authority.certificate)
    assert cert.issuer == authority.subject
    assert keys.public_keys_equal(cert.public_key(), client_key)  # type: ignore[arg-type]
    assert _attr(cert, NameOID.COMMON_NAME) == ["knc06bgm7733st2576nx5jht4ecjw"]
    assert _attr(cert, NameOID.ORGANIZATION_NAME) == ["acme"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.digital_signature
    assert not ku.key_cert_sign
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca

    role_ext = cert.extensions.get_extension_for_oid(certs.ROLE_OID)
    assert not role_ext.critical
    assert isinstance(role_ext.value, x509.UnrecognizedExtension)
    # DER PrintableString (tag 0x13), exactly what Go's asn1.Marshal(role) produces upstream.
    assert role_ext.value.value == bytes([0x13, len(role)]) + role.encode()


def test_client_certificate_record_matches_the_certificate(
    authority: ca_mod.CertificateAuthority, clock: ManualClock
) -> None:
    issued = certs.issue_client_certificate(
        authority, keys.generate_private_key().public_key(), client_id="c", tenant="t", role="agent",
        clock=clock,
    )  # fmt: skip
    cert = issued.certificate
    assert issued.serial == cert.serial_number
    assert issued.serial_hex == format(cert.serial_number, "x")
    assert issued.not_before == cert.not_valid_before_utc == START - timedelta(minutes=5)
    assert issued.not_after == issued.expires_at == cert.not_valid_after_utc == START + timedelta(hours=8760)
    assert x509.load_pem_x509_certificate(issued.cert_pem) == cert
    assert issued.key_pem is None


def test_client_ttl_is_configurable_and_clamped_to_the_ca(clock: ManualClock) -> None:
    authority = ca_mod.create_ca(ttl=timedelta(days=10), clock=clock)
    key = keys.generate_private_key().public_key()
    short = certs.issue_client_certificate(
        authority, key, client_id="c", tenant="t", role="agent", ttl=timedelta(hours=1), clock=clock
    )
    assert short.not_after == START + timedelta(hours=1)
    long = certs.issue_client_certificate(
        authority, key, client_id="c", tenant="t", role="agent", clock=clock
    )
    assert long.not_after == authority.not_after == START + timedelta(days=10)


def test_an_expired_ca_cannot_issue(clock: ManualClock) -> None:
    authority = ca_mod.create_ca(ttl=timedelta(days=1), clock=clock)
    clock.advance(timedelta(days=2))
    with pytest.raises(FailedPrecondition, match="the cluster CA expired at"):
        certs.issue_client_certificate(
            authority, keys.generate_private_key().public_key(), client_id="c", tenant="t", role="agent",
            clock=clock,
        )  # fmt: skip


def test_ed25519_client_keys_are_certified_as_upstream_sends_them(
    authority: ca_mod.CertificateAuthority,
) -> None:
    private = keys.generate_private_key("ed25519")
    issued = certs.issue_client_certificate(
        authority, keys.public_key_to_pem(private), client_id="c", tenant="t", role="agent"
    )
    assert keys.public_keys_equal(issued.certificate.public_key(), private)  # type: ignore[arg-type]
    peer = verify_client_certificate(issued.cert_pem, authority)
    assert (peer.client_id, peer.tenant, peer.role) == ("c", "t", "agent")


def test_other_client_key_types_are_refused_naming_the_accepted_ones(
    authority: ca_mod.CertificateAuthority,
) -> None:
    p384 = ec.generate_private_key(ec.SECP384R1()).public_key()
    with pytest.raises(InvalidArgument) as err:
        certs.issue_client_certificate(authority, p384, client_id="c", tenant="t", role="agent")
    message = str(err.value)
    assert message.startswith("agent public key is ecdsa-p384")
    assert "ECDSA P-256 (ecdsa-p256) or Ed25519 (ed25519)" in message


@pytest.mark.parametrize(
    ("key", "name"),
    [
        (ec.generate_private_key(ec.SECP384R1()).public_key(), "ecdsa-p384"),
        (rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key(), "rsa-2048"),
    ],
)
def test_other_client_key_types_are_refused(
    authority: ca_mod.CertificateAuthority, key: object, name: str
) -> None:
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)  # type: ignore[attr-defined]
    with pytest.raises(
        InvalidArgument, match=rf"operator public key is {name}; accepted key types: ECDSA P-256"
    ):
        certs.issue_client_certificate(authority, pem, client_id="c", tenant="t", role="operator")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"role": "admin"}, "unknown role 'admin'"),
        ({"client_id": ""}, "client id"),
        ({"tenant": ""}, "tenant"),
        ({"client_id": "x" * 65}, "invalid agent certificate subject"),
        ({"ttl": timedelta(seconds=-1)}, "lifetime must be positive"),
    ],
)
def test_bad_client_certificate_requests_are_refused(
    authority: ca_mod.CertificateAuthority, kwargs: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {"client_id": "c", "tenant": "t", "role": "agent", **kwargs}
    with pytest.raises(InvalidArgument, match=message):
        certs.issue_client_certificate(authority, keys.generate_private_key().public_key(), **args)  # type: ignore[arg-type]


def test_unreadable_public_key_is_refused(authority: ca_mod.CertificateAuthority) -> None:
    with pytest.raises(InvalidArgument, match="agent public key is not PEM"):
        certs.issue_client_certificate(authority, b"junk", client_id="c", tenant="t", role="agent")


# --- serials -------------------------------------------------------------------------------------


def test_serials_are_random_positive_and_at_most_128_bits(clock: ManualClock) -> None:
    authority = ca_mod.create_ca(clock=clock)
    key = keys.generate_private_key().public_key()
    issued = [
        certs.issue_client_certificate(authority, key, client_id="c", tenant="t", role="agent", clock=clock)
        for _ in range(50)
    ]
    values = [i.serial for i in issued]
    assert len(set(values)) == len(values)  # same clock tick, still unique
    assert all(0 < v < 2**128 for v in values)
    assert max(v.bit_length() for v in values) > 120  # drawn from the full range


def test_random_serial_distribution() -> None:
    draws = [serial.random_serial() for _ in range(2000)]
    assert all(0 < d < 2**128 for d in draws)
    assert len(set(draws)) == len(draws)
    top_bit_set = sum(1 for d in draws if d >> 127)
    assert 850 < top_bit_set < 1150  # the top bit is random too: 128 bits of entropy


def test_serial_hex_round_trip() -> None:
    assert serial.serial_hex(255) == "ff"
    assert serial.parse_serial_hex("FF") == 255
    assert serial.parse_serial_hex("0x00:ff") == 255
    for bad in ["", "0", "xyz", "-1", "1_0"]:
        with pytest.raises(InvalidArgument):
            serial.parse_serial_hex(bad)
    with pytest.raises(InvalidArgument):
        serial.serial_hex(0)


# --- role extension ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"\x13\x05agent", "agent"),  # PrintableString (what we and upstream write)
        (b"\x0c\x08operator", "operator"),  # UTF8String
        (b"\x16\x05agent", "agent"),  # IA5String
        (b"\x0c\x81\x05agent", "agent"),  # long-form length
        (b"agent", "agent"),  # raw bytes: upstream's fallback
        (b"\x13\x06agent", "\x13\x06agent"),  # bad length -> raw fallback, not a known role
        (b"\x04\x05agent", "\x04\x05agent"),  # OCTET STRING is not a string type
    ],
)
def test_decode_role(value: bytes, expected: str) -> None:
    assert certs.decode_role(value) == expected


def test_encode_role_refuses_unknown_roles() -> None:
    with pytest.raises(InvalidArgument, match="unknown role 'root'"):
        certs.encode_role("root")


# --- server certificates -------------------------------------------------------------------------


def test_server_certificate(authority: ca_mod.CertificateAuthority, clock: ManualClock) -> None:
    issued = certs.issue_server_certificate(
        authority,
        dns_names=["Shard-A.example.com"],
        ip_addresses=["10.0.0.7", ipaddress.ip_address("fd00::7")],
        hosts=["0.0.0.0", "", "192.168.1.2", "[::1]", "nstance.internal", "::"],
        clock=clock,
    )
    cert = issued.certificate
    cert.verify_directly_issued_by(authority.certificate)
    assert issued.private_key is not None
    assert keys.key_type_name(issued.private_key) == "ecdsa-p256"
    assert keys.public_keys_equal(cert.public_key(), issued.private_key)  # type: ignore[arg-type]
    assert issued.key_pem is not None
    assert issued.key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert _attr(cert, NameOID.COMMON_NAME) == ["nstance-server"]
    assert _attr(cert, NameOID.ORGANIZATION_NAME) == ["Nstance Server"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [
        "nstance.internal",
        "shard-a.example.com",
        "nstance-server",
        "localhost",
    ]
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == [
        "192.168.1.2",
        "::1",
        "10.0.0.7",
        "fd00::7",
        "127.0.0.1",
    ]
    assert issued.not_after == START + timedelta(days=365)


def test_server_certificate_defaults_only() -> None:
    authority = ca_mod.create_ca()
    san = certs.issue_server_certificate(authority).certificate.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert san.value.get_values_for_type(x509.DNSName) == ["nstance-server", "localhost"]
    assert [str(i) for i in san.value.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]


@pytest.mark.parametrize(
    "kwargs", [{"dns_names": ["has space"]}, {"ip_addresses": ["10.0.0.300"]}, {"dns_names": ["ünï"]}]
)
def test_server_certificate_refuses_bad_names(kwargs: dict[str, list[str]]) -> None:
    with pytest.raises(InvalidArgument):
        certs.issue_server_certificate(ca_mod.create_ca(), **kwargs)  # type: ignore[arg-type]


# --- workload certificates -----------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "eku"), [("client", "CLIENT_AUTH"), ("server", "SERVER_AUTH")])
@pytest.mark.parametrize("key_type", ["ed25519", "ecdsa-p256"])
def test_workload_certificate(
    authority: ca_mod.CertificateAuthority, clock: ManualClock, kind: str, eku: str, key_type: str
) -> None:
    key = keys.generate_private_key(key_type)
    issued = certs.issue_workload_certificate(
        authority,
        keys.public_key_to_pem(key),
        kind=kind,
        common_name="etcd-knc06bgm",
        organization=["acme", "ops"],
        country=["AU"],
        province=["NSW"],
        locality=["Sydney"],
        street_address=["1 George St"],
        postal_code=["2000"],
        dns_names=["etcd.internal"],
        ip_addresses=["10.1.2.3"],
        uris=["spiffe://prod/etcd"],
        ttl=timedelta(days=7),
        clock=clock,
    )
    cert = issued.certificate
    cert.verify_directly_issued_by(authority.certificate)
    assert keys.public_keys_equal(cert.public_key(), key)  # type: ignore[arg-type]
    assert _attr(cert, NameOID.COMMON_NAME) == ["etcd-knc06bgm"]
    assert _attr(cert, NameOID.ORGANIZATION_NAME) == ["acme", "ops"]
    assert _attr(cert, NameOID.COUNTRY_NAME) == ["AU"]
    assert _attr(cert, NameOID.STATE_OR_PROVINCE_NAME) == ["NSW"]
    assert _attr(cert, NameOID.LOCALITY_NAME) == ["Sydney"]
    assert _attr(cert, NameOID.STREET_ADDRESS) == ["1 George St"]
    assert _attr(cert, NameOID.POSTAL_CODE) == ["2000"]
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        getattr(ExtendedKeyUsageOID, eku)
    ]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["etcd.internal"]
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["10.1.2.3"]
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["spiffe://prod/etcd"]
    assert issued.not_after == START + timedelta(days=7)
    assert issued.serial_hex == format(cert.serial_number, "x")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "peer"}, "unknown certificate kind 'peer'"),
        ({"common_name": ""}, "common name must not be empty"),
        ({"ip_addresses": ["not-an-ip"]}, "'not-an-ip' is not an IP address"),
        ({"uris": ["etcd.internal"]}, "must be an absolute URI with a scheme"),
        ({"country": ["Australia"]}, "invalid workload certificate subject"),
    ],
)
def test_bad_workload_requests_are_refused(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"kind": "server", "common_name": "w", **kwargs}
    with pytest.raises(InvalidArgument, match=message):
        certs.issue_workload_certificate(
            ca_mod.create_ca(),
            keys.generate_private_key().public_key(),
            **args,  # type: ignore[arg-type]
        )


def test_workload_refuses_rsa_keys() -> None:
    rsa_pub = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    with pytest.raises(InvalidArgument, match=r"workload public key is rsa-2048; accepted key types"):
        certs.issue_workload_certificate(ca_mod.create_ca(), rsa_pub, kind="client", common_name="w")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.1.7", "10.0.1.7"),
        (" 10.0.1.7\n", "10.0.1.7"),
        ("2001:db8::7", "2001:db8::7"),
        ("::ffff:10.0.0.9", "10.0.0.9"),  # Go's x509 writes an IPv4-mapped address as IPv4
        ("", None),
        ("ip-10-0-1-7", None),
        ("[2001:db8::7]", None),
        ("fe80::1%eth0", None),
        ("010.0.1.7", None),
        ("10.0.1", None),
    ],
)
def test_san_ip_address_reads_what_go_parse_ip_reads(text: str, expected: str | None) -> None:
    ip = certs.san_ip_address(text)
    assert (None if ip is None else str(ip)) == expected


def test_workload_ipv4_mapped_address_is_written_as_four_bytes() -> None:
    issued = certs.issue_workload_certificate(
        ca_mod.create_ca(),
        keys.generate_private_key().public_key(),
        kind="server",
        common_name="w",
        ip_addresses=["::ffff:10.0.0.9", "2001:db8::7"],
    )
    san = issued.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.IPv4Address("10.0.0.9"),
        ipaddress.IPv6Address("2001:db8::7"),
    ]


def test_subject_value_problem_names_values_no_certificate_can_hold() -> None:
    assert certs.subject_value_problem(NameOID.COUNTRY_NAME, "AU") is None
    assert certs.subject_value_problem(NameOID.ORGANIZATION_NAME, "Australia") is None
    problem = certs.subject_value_problem(NameOID.COUNTRY_NAME, "Australia")
    assert problem is not None
    assert "length" in problem
