"""The SecretStore protocol, its errors, and the rule secret names follow.

A secret is a named blob of bytes (``ca.key``, ``registration-nonce.key``, secrets referenced by
template ``files``). Every store offers the same small, synchronous, thread-safe surface; asyncio code
calls it through ``asyncio.to_thread``.

Secret names are validated the same way everywhere: 1-255 characters from ``A-Z a-z 0-9 . _ + = @ -``,
not ``.`` and never containing ``..``. No ``/`` is allowed, so a name can never climb out of a
store's prefix or collide with another store's layout.

This module does no I/O and must never put a secret's value into a message.
"""

from __future__ import annotations

import re
from typing import Protocol

from nstance.core.errors import FailedPrecondition, InvalidArgument, NotFound

SECRET_NAME_MAX_LEN = 255
_NAME_CHARS = re.compile(r"[A-Za-z0-9._+=@-]+")


class SecretNotFound(NotFound):
    """No secret of that name exists."""


class SecretDecryptionError(FailedPrecondition):
    """A stored secret exists but could not be decrypted (wrong key, or the stored bytes were altered)."""


def validate_secret_name(name: str) -> str:
    """Return ``name`` if it is a valid secret name; raise InvalidArgument saying which rule failed."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("secret name must not be empty")
    if len(name) > SECRET_NAME_MAX_LEN:
        raise InvalidArgument(
            f"secret name must be at most {SECRET_NAME_MAX_LEN} characters (got {len(name)})"
        )
    if "/" in name:
        raise InvalidArgument(f"secret name {name!r} must not contain '/'")
    if name == "." or ".." in name:
        raise InvalidArgument(f"secret name {name!r} must not be '.' or contain '..'")
    if not _NAME_CHARS.fullmatch(name):
        raise InvalidArgument(
            f"secret name {name!r} may only contain letters, digits and the characters . _ + = @ -"
        )
    return name


class SecretStore(Protocol):
    """Named secrets. Implementations: memory, object-storage (encrypted), aws-secrets-manager."""

    def get(self, name: str) -> bytes:
        """Return the secret's bytes; raise SecretNotFound when it does not exist."""
        ...

    def set(self, name: str, data: bytes) -> None:
        """Create or replace the secret."""
        ...

    def set_if_absent(self, name: str, data: bytes) -> bool:
        """Create the secret only if no secret of that name exists, atomically.

        Return True if it was created, False if one already existed (which is left unchanged).
        """
        ...

    def delete(self, name: str) -> None:
        """Delete the secret; deleting a secret that does not exist is not an error."""
        ...

    def exists(self, name: str) -> bool:
        """Return whether the secret exists."""
        ...
