"""Encrypted object-storage secrets: what lands in the bucket, key rotation, tampering, name binding."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from nstance.core.errors import InvalidArgument
from nstance.objectstore.memory import MemoryObjectStore
from nstance.secrets.base import SecretDecryptionError, SecretNotFound
from nstance.secrets.objectstorage import ObjectStorageSecretStore

OLD = b"o" * 32
NEW = b"n" * 32
PLAINTEXT = (
    b"-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIPlaintextCAKeyMaterial\n-----END PRIVATE KEY-----\n"
)


@pytest.fixture
def bucket() -> MemoryObjectStore:
    return MemoryObjectStore()


def test_ciphertext_at_rest_is_not_the_plaintext(bucket: MemoryObjectStore) -> None:
    store = ObjectStorageSecretStore(bucket, keys=[NEW])
    store.set("ca.key", PLAINTEXT)
    assert bucket.list() == ["secret/ca.key"]
    blob, _ = bucket.get("secret/ca.key")
    assert PLAINTEXT not in blob
    assert b"PRIVATE KEY" not in blob
    assert len(blob) == 12 + len(PLAINTEXT) + 16  # nonce || ciphertext || tag
    # Upstream's layout, plain AES-256-GCM without AAD: a Go server with the same key decrypts it.
    assert AESGCM(NEW).decrypt(blob[:12], blob[12:], None) == PLAINTEXT
    bound = ObjectStorageSecretStore(bucket, keys=[NEW], bind_names=True)
    bound.set("ca.key", PLAINTEXT)
    blob, _ = bucket.get("secret/ca.key")
    assert AESGCM(NEW).decrypt(blob[:12], blob[12:], b"ca.key") == PLAINTEXT
    assert store.get("ca.key") == PLAINTEXT  # written bound (by bind_names or an earlier version): still read


def test_each_write_uses_a_fresh_nonce(bucket: MemoryObjectStore) -> None:
    store = ObjectStorageSecretStore(bucket, keys=[NEW])
    store.set("a", PLAINTEXT)
    first, _ = bucket.get("secret/a")
    store.set("a", PLAINTEXT)
    second, _ = bucket.get("secret/a")
    assert first[:12] != second[:12]
    assert first != second


def test_old_keys_decrypt_and_new_writes_use_the_current_key(bucket: MemoryObjectStore) -> None:
    ObjectStorageSecretStore(bucket, keys=[OLD]).set("ca.key", b"written with old")
    rotated = ObjectStorageSecretStore(bucket, keys=[NEW, OLD])
    assert rotated.get("ca.key") == b"written with old"

    rotated.set("nonce.key", b"written after rotation")
    assert ObjectStorageSecretStore(bucket, keys=[NEW]).get("nonce.key") == b"written after rotation"
    with pytest.raises(SecretDecryptionError):
        ObjectStorageSecretStore(bucket, keys=[OLD]).get("nonce.key")


def test_wrong_key_gives_a_clear_error_without_key_material(bucket: MemoryObjectStore) -> None:
    ObjectStorageSecretStore(bucket, keys=[OLD]).set("ca.key", PLAINTEXT)
    with pytest.raises(SecretDecryptionError) as err:
        ObjectStorageSecretStore(bucket, keys=[NEW, b"x" * 32]).get("ca.key")
    message = str(err.value)
    assert message.startswith(
        "secret 'ca.key' could not be decrypted with any of the 2 configured encryption key(s)"
    )
    assert "wrong" in message
    assert "nnnn" not in message
    assert "PRIVATE" not in message


@pytest.mark.parametrize("position", [0, 11, 12, 20, -16, -1])
def test_tampering_is_detected(bucket: MemoryObjectStore, position: int) -> None:
    store = ObjectStorageSecretStore(bucket, keys=[NEW])
    store.set("ca.key", PLAINTEXT)
    blob = bytearray(bucket.get("secret/ca.key")[0])
    blob[position] ^= 0x80  # nonce, ciphertext or tag
    bucket.put("secret/ca.key", bytes(blob))
    with pytest.raises(SecretDecryptionError, match="altered"):
        store.get("ca.key")


def test_truncated_object_is_reported(bucket: MemoryObjectStore) -> None:
    store = ObjectStorageSecretStore(bucket, keys=[NEW])
    bucket.put("secret/ca.key", b"short")
    with pytest.raises(SecretDecryptionError, match="5 bytes, too short to be an encrypted secret"):
        store.get("ca.key")


def test_ciphertext_moved_to_another_name_does_not_decrypt(bucket: MemoryObjectStore) -> None:
    store = ObjectStorageSecretStore(bucket, keys=[NEW], bind_names=True)
    store.set("registration-nonce.key", b"nonce signing key")
    blob, _ = bucket.get("secret/registration-nonce.key")
    bucket.put("secret/ca.key", blob)
    with pytest.raises(SecretDecryptionError, match="copied from another secret name"):
        store.get("ca.key")


def test_upstream_unbound_ciphertext_is_read_only_when_allowed(bucket: MemoryObjectStore) -> None:
    nonce = os.urandom(12)
    bucket.put("secret/ca.key", nonce + AESGCM(OLD).encrypt(nonce, PLAINTEXT, None))  # upstream's format
    assert ObjectStorageSecretStore(bucket, keys=[NEW, OLD]).get("ca.key") == PLAINTEXT
    strict = ObjectStorageSecretStore(bucket, keys=[NEW, OLD], accept_legacy_unbound=False, bind_names=True)
    with pytest.raises(SecretDecryptionError):
        strict.get("ca.key")
    # Re-writing with bind_names upgrades it to the name-bound form, which strict stores read.
    ObjectStorageSecretStore(bucket, keys=[NEW, OLD], bind_names=True).set("ca.key", PLAINTEXT)
    assert strict.get("ca.key") == PLAINTEXT


def test_no_keys_is_refused_instead_of_storing_plaintext(bucket: MemoryObjectStore) -> None:
    with pytest.raises(InvalidArgument, match="refusing to store secrets unencrypted"):
        ObjectStorageSecretStore(bucket, keys=[])


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ([b"short"], "current encryption key is 5 bytes; AES-256-GCM needs exactly 32 bytes"),
        ([NEW, b"y" * 16], "old encryption key #1 is 16 bytes"),
        ([NEW, b"z" * 33], "old encryption key #1 is 33 bytes"),
        (["n" * 32], "current encryption key must be bytes, got str"),
    ],
)
def test_bad_keys_are_refused(bucket: MemoryObjectStore, keys: list[bytes], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        ObjectStorageSecretStore(bucket, keys=keys)


@pytest.mark.parametrize(
    ("prefix", "key"),
    [("secret/", "secret/x"), ("cluster/secrets", "cluster/secrets/x"), ("", "x"), ("/s/", "s/x")],
)
def test_prefix(bucket: MemoryObjectStore, prefix: str, key: str) -> None:
    store = ObjectStorageSecretStore(bucket, prefix, keys=[NEW])
    store.set("x", b"1")
    assert bucket.list() == [key]


def test_prefix_may_not_climb(bucket: MemoryObjectStore) -> None:
    with pytest.raises(InvalidArgument, match=r"must not contain '\.\.'"):
        ObjectStorageSecretStore(bucket, "secret/../other", keys=[NEW])


def test_set_if_absent_never_overwrites_a_foreign_object(bucket: MemoryObjectStore) -> None:
    bucket.put("secret/ca.key", b"something else entirely")
    store = ObjectStorageSecretStore(bucket, keys=[NEW])
    assert store.set_if_absent("ca.key", PLAINTEXT) is False
    assert bucket.get("secret/ca.key")[0] == b"something else entirely"


def test_missing_object_is_secret_not_found(bucket: MemoryObjectStore) -> None:
    with pytest.raises(SecretNotFound):
        ObjectStorageSecretStore(bucket, keys=[NEW]).get("ca.key")
