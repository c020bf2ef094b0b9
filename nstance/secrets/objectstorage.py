"""Secrets as AES-256-GCM encrypted objects in an ObjectStore (the embedded default).

Each secret ``name`` is stored at ``prefix + name`` (default prefix ``secret/``) as

    nonce (12 random bytes) || AES-256-GCM ciphertext || tag (16 bytes)

which is upstream Nstance's layout, so a Go server with the same key reads every secret written here
(a cluster can move back). With ``bind_names`` the secret name is also bound to the ciphertext as
GCM additional authenticated data (AAD = UTF-8 name): an object copied or renamed to another secret
name then fails to decrypt instead of silently becoming that secret, but upstream cannot read it.

Keys: exactly 32 bytes each. ``keys[0]`` is the current key and encrypts every write; every key, in
order, is tried for reads (old keys stay decrypt-only, so keys can be rotated by prepending a new one
and re-writing secrets). No keys means the store refuses to be constructed. Upstream stored secrets in
plaintext when no key was configured; we deliberately do not — a misconfiguration must not silently
put the CA key unencrypted into a bucket.

Reads try both forms: the unbound (upstream) form and the name-bound form (written with
``bind_names``, and by earlier versions of this implementation). With ``bind_names`` and
``accept_legacy_unbound=False`` only name-bound secrets are accepted, so the binding holds for every
secret read; use that once all secrets were re-written bound.

Failures: a missing object -> SecretNotFound; an object no key decrypts (wrong key, altered bytes,
wrong name) -> SecretDecryptionError with a message that never includes secret material. Object-store
errors (Unavailable, ...) pass through unchanged. The store keeps no state beyond its keys, must never
fall back to writing plaintext, and never puts key or secret bytes into an error message.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from nstance.core.errors import InvalidArgument
from nstance.objectstore.base import ObjectNotFound, ObjectStore, PreconditionFailed
from nstance.secrets.base import SecretDecryptionError, SecretNotFound, validate_secret_name

KEY_SIZE = 32
NONCE_SIZE = 12
TAG_SIZE = 16
DEFAULT_PREFIX = "secret/"


def check_encryption_key(key: bytes, label: str = "encryption key") -> bytes:
    """Return ``key`` if it is exactly 32 bytes; raise InvalidArgument otherwise (never echoing it)."""
    if not isinstance(key, bytes | bytearray):
        raise InvalidArgument(f"{label} must be bytes, got {type(key).__name__}")
    if len(key) != KEY_SIZE:
        raise InvalidArgument(f"{label} is {len(key)} bytes; AES-256-GCM needs exactly {KEY_SIZE} bytes")
    return bytes(key)


def _normalize_prefix(prefix: str) -> str:
    prefix = prefix.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    if ".." in prefix.split("/"):
        raise InvalidArgument(f"secret prefix {prefix!r} must not contain '..'")
    return prefix


class ObjectStorageSecretStore:
    """SecretStore over an ObjectStore with client-side AES-256-GCM encryption."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str = DEFAULT_PREFIX,
        *,
        keys: Sequence[bytes],
        accept_legacy_unbound: bool = True,
        bind_names: bool = False,
    ) -> None:
        if not keys:
            raise InvalidArgument(
                "object-storage secrets need at least one 32-byte encryption key; refusing to store "
                "secrets unencrypted (configure an encryption key, e.g. NSTANCE_ENCRYPTION_KEY)"
            )
        checked = [
            check_encryption_key(k, "current encryption key" if i == 0 else f"old encryption key #{i}")
            for i, k in enumerate(keys)
        ]
        self._store = store
        self._prefix = _normalize_prefix(prefix)
        self._ciphers = [AESGCM(k) for k in checked]
        self._accept_legacy = accept_legacy_unbound or not bind_names
        self._bind = bind_names

    @property
    def prefix(self) -> str:
        return self._prefix

    def _key(self, name: str) -> str:
        return self._prefix + validate_secret_name(name)

    def encrypt(self, name: str, data: bytes) -> bytes:
        """The stored form of ``data`` under ``name`` with the current key (fresh random nonce)."""
        nonce = os.urandom(NONCE_SIZE)
        aad = validate_secret_name(name).encode() if self._bind else None
        return nonce + self._ciphers[0].encrypt(nonce, bytes(data), aad)

    def decrypt(self, name: str, blob: bytes) -> bytes:
        """Inverse of ``encrypt``, trying every key; raise SecretDecryptionError when none works."""
        if len(blob) < NONCE_SIZE + TAG_SIZE:
            raise SecretDecryptionError(
                f"secret {name!r} is {len(blob)} bytes, too short to be an encrypted secret "
                f"(at least {NONCE_SIZE + TAG_SIZE})"
            )
        nonce, body = blob[:NONCE_SIZE], blob[NONCE_SIZE:]
        aads: list[bytes | None] = [name.encode()] if self._bind else [None, name.encode()]
        if self._bind and self._accept_legacy:
            aads.append(None)
        for aad in aads:
            for cipher in self._ciphers:
                try:
                    return cipher.decrypt(nonce, body, aad)
                except InvalidTag:
                    continue
        raise SecretDecryptionError(
            f"secret {name!r} could not be decrypted with any of the {len(self._ciphers)} configured "
            "encryption key(s): the key is wrong, or the stored object was altered or copied from "
            "another secret name"
        )

    def get(self, name: str) -> bytes:
        key = self._key(name)
        try:
            blob, _ = self._store.get(key)
        except ObjectNotFound as exc:
            raise SecretNotFound(f"secret {name!r} not found") from exc
        return self.decrypt(name, blob)

    def set(self, name: str, data: bytes) -> None:
        key = self._key(name)
        self._store.put(key, self.encrypt(name, data))

    def set_if_absent(self, name: str, data: bytes) -> bool:
        key = self._key(name)
        try:
            self._store.put_if_match(key, self.encrypt(name, data), None)
        except PreconditionFailed:
            return False
        return True

    def delete(self, name: str) -> None:
        self._store.delete(self._key(name))

    def exists(self, name: str) -> bool:
        return self._store.exists(self._key(name))
