"""Key pairs the server asks for on ReceiveKeyRequests: ``KEYS_DIR/<name>.key`` and ``<name>.pub``.

Responsible for validating key names (bare file names only), creating key pairs or reusing existing
ones, and listing every public key for SubmitPublicKeys. New pairs are of the identity key's type:
Ed25519 under an Ed25519 cluster CA (a Go server issues workload certificates for Ed25519 keys only),
ECDSA P-256 otherwise. Nothing here speaks gRPC and nothing is written outside KEYS_DIR.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from nstance.core.atomicfile import write_atomic
from nstance.core.errors import InvalidArgument
from nstance.pki.keys import (
    generate_private_key,
    load_private_key_pem,
    private_key_to_pem,
    public_key_to_pem,
)

log = logging.getLogger("nstance.agent.keys")

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")


def validate_key_name(name: str) -> str:
    """Return the base name of a requested key; InvalidArgument unless it is a bare file name.

    A trailing ``.pub`` is stripped (upstream template key names end in it).
    """
    base = name.removesuffix(".pub")
    if not _NAME.fullmatch(base) or ".." in base:
        raise InvalidArgument(
            f"key name {name!r} is not a bare file name (letters, digits, '.', '_', '-'; no '/' or '..')"
        )
    return base


@dataclass(frozen=True, slots=True)
class PublicKeyFile:
    """A public key ready for submission."""

    name: str
    public_key_pem: bytes


class KeyStore:
    """Creates and lists key pairs in ``keys_dir``."""

    def __init__(
        self, keys_dir: Path, *, mode: int = 0o640, dir_mode: int = 0o750, key_type: str = "ecdsa-p256"
    ) -> None:
        self._dir = keys_dir
        self._mode = mode
        self._dir_mode = dir_mode
        #: The type of new pairs; the agent sets it from the cluster CA once it has read it.
        self.key_type = key_type

    def ensure(self, names: list[str]) -> list[str]:
        """Create (or reuse) a key pair for each valid name; returns the names that are ready."""
        ready: list[str] = []
        for raw in names:
            try:
                name = validate_key_name(raw)
            except InvalidArgument as exc:
                log.warning("refused key request: %s", exc)
                continue
            key_path = self._dir / f"{name}.key"
            pub_path = self._dir / f"{name}.pub"
            if key_path.exists():
                try:
                    key = load_private_key_pem(key_path.read_bytes(), what=f"key {key_path}")
                except InvalidArgument as exc:
                    log.error("cannot reuse %s (%s); leaving it alone", key_path, exc)
                    continue
            else:
                key = generate_private_key(self.key_type)
                write_atomic(key_path, private_key_to_pem(key), mode=self._mode, dir_mode=self._dir_mode)
                log.info("generated key %s", name)
            pem = public_key_to_pem(key)
            if not pub_path.exists() or pub_path.read_bytes() != pem:
                write_atomic(pub_path, pem, mode=self._mode, dir_mode=self._dir_mode)
            ready.append(name)
        return ready

    def public_keys(self) -> list[PublicKeyFile]:
        """Every ``<name>.pub`` in the keys directory, sorted by name."""
        if not self._dir.is_dir():
            return []
        out: list[PublicKeyFile] = []
        for path in sorted(self._dir.glob("*.pub")):
            if path.is_file() and _NAME.fullmatch(path.stem):
                out.append(PublicKeyFile(name=path.stem, public_key_pem=path.read_bytes()))
        return out
