"""Key generation, PEM round trips and refusal of key types Nstance does not accept."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa, x25519

from nstance.core.errors import InvalidArgument
from nstance.pki import keys


@pytest.mark.parametrize("key_type", ["ecdsa-p256", "ed25519"])
def test_generate_serialise_and_load_round_trip(key_type: str) -> None:
    key = keys.generate_private_key(key_type)
    assert keys.key_type_name(key) == key_type

    key_pem = keys.private_key_to_pem(key)
    pub_pem = keys.public_key_to_pem(key)
    assert key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8
    assert pub_pem.startswith(b"-----BEGIN PUBLIC KEY-----")  # SubjectPublicKeyInfo

    loaded = keys.load_private_key_pem(key_pem)
    assert keys.private_key_to_pem(loaded) == key_pem
    pub = keys.load_public_key_pem(pub_pem.decode())
    assert keys.public_keys_equal(pub, key)
    assert keys.key_type_name(pub) == key_type


def test_default_key_type_is_ecdsa_p256() -> None:
    assert keys.key_type_name(keys.generate_private_key()) == "ecdsa-p256"


def test_unknown_key_type_is_refused_naming_the_accepted_ones() -> None:
    with pytest.raises(InvalidArgument, match=r"'rsa'.*ECDSA P-256 \(ecdsa-p256\) or Ed25519 \(ed25519\)"):
        keys.generate_private_key("rsa")


@pytest.mark.parametrize(
    ("key", "name"),
    [
        (ec.generate_private_key(ec.SECP384R1()), "ecdsa-p384"),
        (ec.generate_private_key(ec.SECP256K1()), "ecdsa-secp256k1"),
        (rsa.generate_private_key(public_exponent=65537, key_size=2048), "rsa-2048"),
        (ed448.Ed448PrivateKey.generate(), "ed448"),
        (x25519.X25519PrivateKey.generate(), "x25519"),
        (ed25519.Ed25519PrivateKey.generate().public_key(), "ed25519"),
    ],
)
def test_key_type_name_names_other_types(key: object, name: str) -> None:
    assert keys.key_type_name(key) == name


def test_loading_an_rsa_public_key_is_refused_with_what_is_accepted() -> None:
    rsa_pub = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    rsa_pem = rsa_pub.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(InvalidArgument) as err:
        keys.load_public_key_pem(rsa_pem, what="agent public key")
    assert str(err.value) == (
        "agent public key is rsa-2048; accepted key types: ECDSA P-256 (ecdsa-p256) or Ed25519 (ed25519)"
    )


def test_accepted_list_narrows_what_loads() -> None:
    ed_pem = keys.public_key_to_pem(keys.generate_private_key("ed25519"))
    with pytest.raises(InvalidArgument, match=r"is ed25519; accepted key types: ECDSA P-256 \(ecdsa-p256\)$"):
        keys.load_public_key_pem(ed_pem, ("ecdsa-p256",))


def test_p384_private_key_is_refused() -> None:
    pem = ec.generate_private_key(ec.SECP384R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(InvalidArgument, match="CA key is ecdsa-p384"):
        keys.load_private_key_pem(pem, what="CA key")


def test_sec1_ec_private_key_is_read() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    sec1 = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    assert keys.public_keys_equal(keys.load_private_key_pem(sec1), key)


def test_encrypted_private_key_gets_a_clear_message() -> None:
    pem = keys.generate_private_key().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pw"),
    )
    with pytest.raises(InvalidArgument, match="is encrypted; an unencrypted PKCS#8 PEM key is expected"):
        keys.load_private_key_pem(pem)


@pytest.mark.parametrize("data", [b"", b"not pem", "garbage text"])
def test_non_pem_input_is_refused(data: bytes | str) -> None:
    with pytest.raises(InvalidArgument, match="is not PEM"):
        keys.load_private_key_pem(data)
    with pytest.raises(InvalidArgument, match="is not PEM"):
        keys.load_public_key_pem(data)


def test_corrupt_pem_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="not a readable PEM public key"):
        keys.load_public_key_pem(b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")


def test_private_key_where_public_expected_and_vice_versa() -> None:
    key = keys.generate_private_key()
    with pytest.raises(InvalidArgument, match="is a private key; a public key was expected"):
        keys.require_public_key(key)
    with pytest.raises(InvalidArgument, match="is not a private key"):
        keys.require_private_key(key.public_key())
    with pytest.raises(InvalidArgument, match="private key is rsa-2048"):
        keys.require_private_key(rsa.generate_private_key(public_exponent=65537, key_size=2048))


@pytest.mark.parametrize("key_type", ["ed25519", "ecdsa-p256"])
def test_a_submitted_public_key_reads_in_upstreams_wire_form_and_as_pem(key_type: str) -> None:
    # Upstream's agents send base64 (standard, padded) of the DER in PublicKeySubmission.public_key_pem.
    key = keys.generate_private_key(key_type)
    wire = keys.public_key_to_wire(key)
    assert wire == base64.b64encode(keys.public_key_to_der(key))
    assert b"-----" not in wire
    assert keys.public_keys_equal(keys.load_public_key_wire(wire), key)
    assert keys.public_keys_equal(keys.load_public_key_wire(keys.public_key_to_pem(key)), key)


@pytest.mark.parametrize(
    "data", [b"", b"not base64!", b"AAAA", b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"]
)
def test_a_submitted_public_key_that_is_neither_form_is_refused(data: bytes) -> None:
    with pytest.raises(InvalidArgument, match=r"^public key"):
        keys.load_public_key_wire(data)
