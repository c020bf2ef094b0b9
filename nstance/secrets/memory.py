"""In-process SecretStore: a dict behind a lock.

For tests, the deterministic simulator and ``--secrets memory`` demos. Nothing survives the process
and nothing is encrypted; it must not be used where secrets have to outlive a restart.
"""

from __future__ import annotations

import threading

from nstance.secrets.base import SecretNotFound, validate_secret_name


class MemorySecretStore:
    """Secrets in memory; values are copied in and out so callers cannot alias them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._secrets: dict[str, bytes] = {}

    def get(self, name: str) -> bytes:
        validate_secret_name(name)
        with self._lock:
            value = self._secrets.get(name)
        if value is None:
            raise SecretNotFound(f"secret {name!r} not found")
        return bytes(value)

    def set(self, name: str, data: bytes) -> None:
        validate_secret_name(name)
        with self._lock:
            self._secrets[name] = bytes(data)

    def set_if_absent(self, name: str, data: bytes) -> bool:
        validate_secret_name(name)
        with self._lock:
            if name in self._secrets:
                return False
            self._secrets[name] = bytes(data)
            return True

    def delete(self, name: str) -> None:
        validate_secret_name(name)
        with self._lock:
            self._secrets.pop(name, None)

    def exists(self, name: str) -> bool:
        validate_secret_name(name)
        with self._lock:
            return name in self._secrets
