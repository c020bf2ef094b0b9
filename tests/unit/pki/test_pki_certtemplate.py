"""Client certificates from the DER template are the builder's certificates, byte for byte."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nstance.core.clock import ManualClock
from nstance.pki import ca as ca_mod
from nstance.pki import certs, certtemplate, keys

#: Serials at the DER INTEGER's edges (one byte, a zero byte needed, two bytes, 128 bits).
SERIALS = [1, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 2**127, 2**128 - 1]
#: Moments around the change from UTCTime to GeneralizedTime (RFC 5280: 2050).
MOMENTS = [
    datetime(2026, 11, 28, 14, 3, 9, tzinfo=UTC),
    datetime(2049, 12, 31, 23, 59, 59, tzinfo=UTC),
    datetime(2050, 1, 1, 0, 0, 0, tzinfo=UTC),
]
#: (CN, O) pairs: usual, the longest CN, an O long enough for two-byte DER lengths, non-ASCII.
SUBJECTS = [
    ("app06h24y1pdxteh367bx4z5nat4c", "default"),
    ("c" * 64, "t"),
    ("op", "tenant-" + "x" * 300),
    ("agent-é", "tenant-日本"),
]


def _ca(key_type: str, not_after: datetime) -> ca_mod.CertificateAuthority:
    start = datetime(2020, 1, 1, tzinfo=UTC)
    return ca_mod.create_ca(key_type=key_type, ttl=not_after - start, clock=ManualClock(start))


def _builder_certificate(
    ca: ca_mod.CertificateAuthority,
    key: keys.PublicKey,
    cn: str,
    tenant: str,
    role: str,
    serial: int,
    now: datetime,
    ttl: timedelta,
    monkeypatch: pytest.MonkeyPatch,
) -> x509.Certificate:
    """What the builder path (``certs._issue``, which server and workload certificates use) signs."""
    monkeypatch.setattr(certs, "random_serial", lambda: serial)
    subject = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, cn), x509.NameAttribute(NameOID.ORGANIZATION_NAME, tenant)]
    )
    return certs._issue(
        ca,
        key,
        subject,
        eku=ExtendedKeyUsageOID.CLIENT_AUTH,
        ttl=ttl,
        clock=ManualClock(now),
        extra=[certs.role_extension(role)],
    )


@pytest.mark.parametrize("ca_type", ["ecdsa-p256", "ed25519"])
@pytest.mark.parametrize("key_type", ["ecdsa-p256", "ed25519"])
def test_the_template_signs_what_the_builder_signs(
    ca_type: str, key_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = _ca(ca_type, datetime(2060, 1, 1, tzinfo=UTC))
    rng = random.Random(f"{ca_type}/{key_type}")
    cases = 0
    for serial in [*SERIALS, rng.getrandbits(128) | 1]:
        for now in MOMENTS:
            for cn, tenant in SUBJECTS:
                key = keys.generate_private_key(key_type).public_key()  # type: ignore[arg-type]
                role = rng.choice(certs.ROLES)
                ttl = timedelta(hours=rng.choice([1, 8760]))
                reference = _builder_certificate(ca, key, cn, tenant, role, serial, now, ttl, monkeypatch)
                issued = certs.issue_client_certificate(
                    ca,
                    keys.public_key_to_pem(key),
                    client_id=cn,
                    tenant=tenant,
                    role=role,
                    ttl=ttl,
                    clock=ManualClock(now),
                )
                assert issued.certificate.tbs_certificate_bytes == reference.tbs_certificate_bytes, (
                    serial,
                    now,
                    cn,
                    tenant,
                )
                assert issued.certificate.signature_algorithm_oid == reference.signature_algorithm_oid
                issued.certificate.verify_directly_issued_by(ca.certificate)
                assert (issued.serial, issued.not_before, issued.not_after) == (
                    reference.serial_number,
                    reference.not_valid_before_utc,
                    reference.not_valid_after_utc,
                )
                assert issued.serial_hex == certs.serial_hex(serial)
                cases += 1
    assert cases == 10 * len(MOMENTS) * len(SUBJECTS)


def test_a_rotated_ca_gets_its_own_template() -> None:
    """The template follows the CA passed in: a certificate is signed by, and names, that CA."""
    clock = ManualClock(datetime(2026, 11, 28, tzinfo=UTC))
    key = keys.public_key_to_pem(keys.generate_private_key("ecdsa-p256").public_key())
    for ca in [
        _ca("ecdsa-p256", datetime(2030, 1, 1, tzinfo=UTC)),
        _ca("ed25519", datetime(2031, 1, 1, tzinfo=UTC)),
    ] * 2:
        issued = certs.issue_client_certificate(ca, key, client_id="a", tenant="t", role="agent", clock=clock)
        issued.certificate.verify_directly_issued_by(ca.certificate)
        assert issued.certificate.issuer == ca.certificate.subject


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "020100"),
        (1, "020101"),
        (0x7F, "02017f"),
        (0x80, "02020080"),
        (0x100, "02020100"),
        (0xFF00, "020300ff00"),
    ],
)
def test_der_integer(value: int, expected: str) -> None:
    assert certtemplate.der_integer(value).hex() == expected


def test_der_lengths_of_long_contents() -> None:
    assert certtemplate.der(0x04, b"x" * 127)[:2].hex() == "047f"
    assert certtemplate.der(0x04, b"x" * 128)[:3].hex() == "048180"
    assert certtemplate.der(0x04, b"x" * 256)[:4].hex() == "04820100"


@pytest.mark.parametrize(
    ("dotted", "expected"),
    [
        ("2.5.29.14", "0603551d0e"),
        ("1.2.840.10045.4.3.2", "06082a8648ce3d040302"),
        ("1.2.840.113549.1.1.11", "06092a864886f70d01010b"),
        ("2.999.3", "0603883703"),
        ("1.3.6.1.4.1.999999.1", "06092b06010401bd843f01"),
    ],
)
def test_der_oid(dotted: str, expected: str) -> None:
    assert certtemplate.der_oid(x509.ObjectIdentifier(dotted)).hex() == expected
