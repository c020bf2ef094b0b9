"""Key handling: generate, serialise and load the two key types Nstance uses.

* ``ecdsa-p256`` — ECDSA on NIST P-256 (secp256r1). Every key that signs inside a TLS handshake with
  grpcio (server certificates, agent and operator identities) must be this type, because grpcio's
  BoringSSL offers no Ed25519 signature algorithm in TLS. It is also the default CA key type.
* ``ed25519`` — accepted for an existing upstream CA, for the registration-nonce signing key (EdDSA
  JWTs) and for workload keys that never terminate TLS in grpcio.

Private keys are serialised as unencrypted PKCS#8 PEM (``-----BEGIN PRIVATE KEY-----``), public keys as
SubjectPublicKeyInfo PEM (``-----BEGIN PUBLIC KEY-----``), the forms upstream Nstance reads and writes.
Every loader takes the list of key types the caller accepts and refuses anything else with an
InvalidArgument that says what was given and what is accepted.

Pure functions only: no file or network I/O, no global state.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from typing import Literal, get_args

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa, x448, x25519
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from nstance.core.errors import InvalidArgument

KeyType = Literal["ecdsa-p256", "ed25519"]
KEY_TYPES: tuple[KeyType, ...] = get_args(KeyType)
DEFAULT_KEY_TYPE: KeyType = "ecdsa-p256"

PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
PublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey

_DESCRIPTIONS: dict[str, str] = {"ecdsa-p256": "ECDSA P-256", "ed25519": "Ed25519"}


def describe_key_types(accepted: Iterable[str]) -> str:
    """Human form of a key-type list, e.g. ``"ECDSA P-256 (ecdsa-p256) or Ed25519 (ed25519)"``."""
    names = [f"{_DESCRIPTIONS.get(t, t)} ({t})" for t in accepted]
    if not names:
        return "none"
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " or " + names[-1]


def key_type_name(key: object) -> str:
    """Name the type of any cryptography key object: ``ecdsa-p256``, ``ed25519``, ``rsa-2048``, ...

    Unsupported types get a descriptive name too, so error messages can say what was sent.
    """
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        curve = key.curve.name
        return {"secp256r1": "ecdsa-p256", "secp384r1": "ecdsa-p384", "secp521r1": "ecdsa-p521"}.get(
            curve, f"ecdsa-{curve}"
        )
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return "ed25519"
    if isinstance(key, ed448.Ed448PrivateKey | ed448.Ed448PublicKey):
        return "ed448"
    if isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey):
        return f"rsa-{key.key_size}"
    if isinstance(key, dsa.DSAPrivateKey | dsa.DSAPublicKey):
        return f"dsa-{key.key_size}"
    if isinstance(key, x25519.X25519PrivateKey | x25519.X25519PublicKey):
        return "x25519"
    if isinstance(key, x448.X448PrivateKey | x448.X448PublicKey):
        return "x448"
    return type(key).__name__


def _check_accepted(accepted: Iterable[str]) -> tuple[str, ...]:
    names = tuple(accepted)
    unknown = [n for n in names if n not in KEY_TYPES]
    if unknown or not names:
        raise ValueError(f"accepted key types must be a non-empty subset of {KEY_TYPES}, got {names}")
    return names


def _refuse(key: object, accepted: tuple[str, ...], what: str) -> InvalidArgument:
    return InvalidArgument(
        f"{what} is {key_type_name(key)}; accepted key types: {describe_key_types(accepted)}"
    )


def require_private_key(
    key: object, accepted: Iterable[str] = KEY_TYPES, *, what: str = "private key"
) -> PrivateKey:
    """Return ``key`` if it is a private key of an accepted type; raise InvalidArgument otherwise."""
    names = _check_accepted(accepted)
    if isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
        if key_type_name(key) in names:
            return key
    elif not _is_private(key):
        raise InvalidArgument(f"{what} is not a private key ({key_type_name(key)})")
    raise _refuse(key, names, what)


def require_public_key(
    key: object, accepted: Iterable[str] = KEY_TYPES, *, what: str = "public key"
) -> PublicKey:
    """Return ``key`` if it is a public key of an accepted type; raise InvalidArgument otherwise."""
    names = _check_accepted(accepted)
    if isinstance(key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey):
        if key_type_name(key) in names:
            return key
    elif _is_private(key):
        raise InvalidArgument(f"{what} is a private key; a public key was expected")
    raise _refuse(key, names, what)


def _is_private(key: object) -> bool:
    return isinstance(
        key,
        ec.EllipticCurvePrivateKey
        | ed25519.Ed25519PrivateKey
        | ed448.Ed448PrivateKey
        | rsa.RSAPrivateKey
        | dsa.DSAPrivateKey
        | x25519.X25519PrivateKey
        | x448.X448PrivateKey,
    )


def generate_private_key(key_type: str = DEFAULT_KEY_TYPE) -> PrivateKey:
    """Generate a fresh private key of ``key_type`` (``ecdsa-p256`` or ``ed25519``)."""
    if key_type == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    raise InvalidArgument(
        f"unsupported key type {key_type!r}; accepted key types: {describe_key_types(KEY_TYPES)}"
    )


def private_key_to_pem(key: PrivateKey) -> bytes:
    """Unencrypted PKCS#8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def public_key_to_pem(key: PublicKey | PrivateKey) -> bytes:
    """SubjectPublicKeyInfo PEM of a public key (or of a private key's public half)."""
    pub = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def public_key_to_der(key: PublicKey | PrivateKey) -> bytes:
    """SubjectPublicKeyInfo DER of a public key (or of a private key's public half)."""
    pub = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def public_keys_equal(a: PublicKey | PrivateKey, b: PublicKey | PrivateKey) -> bool:
    """Whether two keys (public, or private for their public half) are the same public key."""
    return public_key_to_der(a) == public_key_to_der(b)


def _pem_bytes(data: bytes | str, what: str) -> bytes:
    raw = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data)
    raw = raw.strip()
    if not raw.startswith(b"-----BEGIN "):
        raise InvalidArgument(f"{what} is not PEM (expected a '-----BEGIN ...-----' block)")
    return raw


def load_private_key_pem(
    data: bytes | str, accepted: Iterable[str] = KEY_TYPES, *, what: str = "private key"
) -> PrivateKey:
    """Parse an unencrypted PEM private key (PKCS#8; SEC1 EC keys are read too) of an accepted type."""
    names = _check_accepted(accepted)
    raw = _pem_bytes(data, what)
    try:
        key = serialization.load_pem_private_key(raw, password=None)
    except TypeError as exc:
        raise InvalidArgument(f"{what} is encrypted; an unencrypted PKCS#8 PEM key is expected") from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InvalidArgument(f"{what} is not a readable PEM private key: {exc}") from exc
    return require_private_key(key, names, what=what)


def load_any_public_key_pem(data: bytes | str, *, what: str = "public key") -> PublicKeyTypes:
    """Parse a SubjectPublicKeyInfo PEM public key of any type; the caller checks the type."""
    raw = _pem_bytes(data, what)
    try:
        return serialization.load_pem_public_key(raw)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InvalidArgument(f"{what} is not a readable PEM public key: {exc}") from exc


def load_public_key_pem(
    data: bytes | str, accepted: Iterable[str] = KEY_TYPES, *, what: str = "public key"
) -> PublicKey:
    """Parse a SubjectPublicKeyInfo PEM public key of an accepted type."""
    names = _check_accepted(accepted)
    return require_public_key(load_any_public_key_pem(data, what=what), names, what=what)


def public_key_to_wire(key: PublicKey | PrivateKey) -> bytes:
    """A public key as ``PublicKeySubmission.public_key_pem`` carries it: base64 (standard alphabet,
    padded) of the DER SubjectPublicKeyInfo, without PEM armour. Despite the field's name, that is what
    upstream's agents send and what upstream's servers decode (they skip anything else)."""
    return base64.b64encode(public_key_to_der(key))


def load_public_key_wire(
    data: bytes, accepted: Iterable[str] = KEY_TYPES, *, what: str = "public key"
) -> PublicKey:
    """Parse a submitted public key of an accepted type: base64 of its DER (``public_key_to_wire``, as
    upstream's agents send it) or PEM (as this project's agents sent it before they followed upstream)."""
    if b"-----BEGIN" in data:
        return load_public_key_pem(data, accepted, what=what)
    try:
        der = base64.b64decode(data.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(f"{what} is neither base64 of a DER public key nor a PEM public key") from None
    try:
        key = serialization.load_der_public_key(der)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InvalidArgument(f"{what} is not a readable DER public key: {exc}") from exc
    return require_public_key(key, _check_accepted(accepted), what=what)
