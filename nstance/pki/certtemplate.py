"""Client certificates assembled from DER pieces a CA encodes once, then signed.

The agent and operator certificates a CA signs differ only in their serial, their validity, their
subject (CN and O), their public key with the key identifier derived from it, and their role
extension. Their issuer, signature algorithm, basic constraints, key usage, extended key usage and
authority key identifier are the same in every one. ``ClientTemplate`` encodes those once, with
cryptography's own encoders; ``ClientTemplate.tbs`` joins them with the per-certificate parts and
``ClientTemplate.sign`` signs the result.
The TBSCertificate is the one ``cryptography.x509.CertificateBuilder`` produces for the same inputs,
byte for byte (``tests/unit/pki/test_pki_certtemplate.py`` compares them): the builder spends about four
times the signature's own cost building and encoding its objects, this path little beyond the signature.

A CA key is ECDSA P-256 (signed ecdsa-with-SHA256) or Ed25519 (``keys.KEY_TYPES``); the template
knows the AlgorithmIdentifier of both.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from nstance.pki.ca import CertificateAuthority
from nstance.pki.keys import PublicKey

#: AlgorithmIdentifier of ecdsa-with-SHA256 (1.2.840.10045.4.3.2, parameters absent; RFC 5758).
_ECDSA_SHA256 = bytes.fromhex("300a06082a8648ce3d040302")
#: AlgorithmIdentifier of Ed25519 (1.3.101.112, parameters absent; RFC 8410).
_ED25519 = bytes.fromhex("300506032b6570")
#: ``[0] EXPLICIT INTEGER 2``: an X.509 v3 certificate.
_VERSION_3 = bytes.fromhex("a003020102")
#: The critical flag of an Extension: BOOLEAN TRUE.
_CRITICAL = bytes.fromhex("0101ff")
#: The OID of the subject key identifier extension (2.5.29.14), DER.
_SKI_OID = bytes.fromhex("0603551d0e")
#: RFC 5280 4.1.2.5: validity dates through 2049 are UTCTime, from 2050 GeneralizedTime.
_LAST_UTC_TIME_YEAR = 2049


def der(tag: int, body: bytes) -> bytes:
    """One DER element: ``tag``, the definite length of ``body``, ``body``."""
    n = len(body)
    if n < 0x80:
        return bytes((tag, n)) + body
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(size))) + size + body


def _sequence(*parts: bytes) -> bytes:
    return der(0x30, b"".join(parts))


def der_integer(value: int) -> bytes:
    """A DER INTEGER of ``value`` >= 0: minimal, with a zero byte first when the top bit is set."""
    return der(0x02, value.to_bytes(value.bit_length() // 8 + 1, "big"))


def der_time(moment: datetime) -> bytes:
    """A validity date (whole seconds; naive means UTC, as the builder takes it) as RFC 5280 encodes it."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    clock = f"{moment.month:02}{moment.day:02}{moment.hour:02}{moment.minute:02}{moment.second:02}Z"
    if moment.year <= _LAST_UTC_TIME_YEAR:
        return der(0x17, f"{moment.year % 100:02}{clock}".encode("ascii"))
    return der(0x18, f"{moment.year:04}{clock}".encode("ascii"))


def der_oid(oid: x509.ObjectIdentifier) -> bytes:
    """A DER OBJECT IDENTIFIER: the first two arcs in one, then each arc in base 128."""
    arcs = [int(arc) for arc in oid.dotted_string.split(".")]
    body = bytearray()
    for arc in (arcs[0] * 40 + arcs[1], *arcs[2:]):
        digits = [arc & 0x7F]
        arc >>= 7
        while arc:
            digits.append(0x80 | (arc & 0x7F))
            arc >>= 7
        body += bytes(reversed(digits))
    return der(0x06, bytes(body))


def der_extension(value: x509.ExtensionType, *, critical: bool) -> bytes:
    """One Extension: its OID, the critical flag when set, the value's DER in an OCTET STRING."""
    return _sequence(der_oid(value.oid), _CRITICAL if critical else b"", der(0x04, value.public_bytes()))


def _subject_public_key(spki: bytes) -> bytes:
    """The subjectPublicKey bits of a DER SubjectPublicKeyInfo (what RFC 5280's first key identifier
    method hashes): the contents of its BIT STRING, after the unused-bits byte (always 0 here)."""
    _, offset = der_header(spki, 0)  # into the outer SEQUENCE
    length, start = der_header(spki, offset)  # the AlgorithmIdentifier
    length, start = der_header(spki, start + length)  # the BIT STRING
    return spki[start + 1 : start + length]


def der_header(data: bytes, offset: int) -> tuple[int, int]:
    """The length of the DER element at ``offset`` and where its contents start; ValueError when the
    header is cut short, or its length takes no byte or more than four."""
    if offset + 2 > len(data):
        raise ValueError("DER header cut short")
    first = data[offset + 1]
    if first < 0x80:
        return first, offset + 2
    count = first & 0x7F
    if count == 0 or count > 4 or offset + 2 + count > len(data):
        raise ValueError("DER length of no byte, more than four, or cut short")
    return int.from_bytes(data[offset + 2 : offset + 2 + count], "big"), offset + 2 + count


class ClientTemplate:
    """What every client certificate of one CA shares, encoded; ``issue`` signs one."""

    __slots__ = ("_aki", "_head", "_issuer", "_sig_alg", "ca")

    def __init__(self, ca: CertificateAuthority, head: Sequence[tuple[x509.ExtensionType, bool]]) -> None:
        """``head``: the extensions (value, critical) before the subject key identifier, in order."""
        key = ca.private_key
        if isinstance(key, ed25519.Ed25519PrivateKey):
            self._sig_alg = _ED25519
        elif isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
            self._sig_alg = _ECDSA_SHA256
        else:  # keys.require_private_key admits no other CA key
            raise ValueError(f"no certificate template for a CA key of type {type(key).__name__}")
        self.ca = ca
        self._issuer = self._sig_alg + ca.certificate.subject.public_bytes()
        self._head = b"".join(der_extension(value, critical=critical) for value, critical in head)
        self._aki = der_extension(ca.authority_key_identifier(), critical=False)

    def tbs(
        self,
        *,
        serial: int,
        not_before: datetime,
        not_after: datetime,
        subject: x509.Name,
        key: PublicKey,
        tail: Sequence[bytes],
    ) -> bytes:
        """The TBSCertificate. Its extensions: ``head``, the key identifier, ``tail`` (encoded
        extensions, as ``der_extension`` gives them), the authority key identifier."""
        spki = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        digest = hashlib.sha1(_subject_public_key(spki), usedforsecurity=False).digest()
        ski = _sequence(_SKI_OID, der(0x04, der(0x04, digest)))
        extensions = der(0xA3, _sequence(self._head, ski, *tail, self._aki))
        return _sequence(
            _VERSION_3,
            der_integer(serial),
            self._issuer,
            _sequence(der_time(not_before), der_time(not_after)),
            subject.public_bytes(),
            spki,
            extensions,
        )

    def sign(self, tbs: bytes) -> x509.Certificate:
        """The certificate of ``tbs``, signed with the CA's key."""
        key = self.ca.private_key
        if isinstance(key, ed25519.Ed25519PrivateKey):
            signature = key.sign(tbs)
        else:
            signature = key.sign(tbs, ec.ECDSA(hashes.SHA256()))
        return x509.load_der_x509_certificate(_sequence(tbs, self._sig_alg, der(0x03, b"\x00" + signature)))
