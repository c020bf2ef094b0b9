"""Loading the 32-byte AES-256 key(s) that encrypt object-storage secrets.

Sources (``provider``, ``source``), as upstream:

* ``env``: the environment variable named ``source`` (admin default ``NSTANCE_ENCRYPTION_KEY``);
* ``file``: the file at path ``source``;
* ``aws-secrets-manager``: the secret whose name or ARN is ``source`` (string or binary value; the
  default of upstream's Terraform module);
* ``aws-parameter-store``: the ``SecureString`` parameter named ``source``;
* ``google-secret-manager``: the latest version of the secret ``source`` in Google project
  ``project_id`` (required).

Accepted encodings, tried in this order (none of them can be mistaken for another):

1. exactly 32 raw bytes — a binary key file, or upstream Nstance's form (a 32-character value used
   byte for byte); surrounding whitespace is trimmed first when the raw content is not 32 bytes;
2. 64 hexadecimal characters;
3. base64 (standard or URL-safe alphabet, padding optional) of 32 bytes, e.g. ``openssl rand -base64 32``
   or ``generate_encryption_key()``.

Errors are InvalidArgument naming the variable or file and the expected formats; the key itself is
never echoed. Reads only the named variable, file, secret or parameter (boto3 and Google's client
library are imported only for their sources).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
import string
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from nstance.core.errors import InvalidArgument

KEY_SIZE = 32
DEFAULT_KEY_ENV = "NSTANCE_ENCRYPTION_KEY"
KEY_PROVIDERS = ("env", "file", "aws-secrets-manager", "aws-parameter-store", "google-secret-manager")
_HEX = re.compile(rb"[0-9a-fA-F]{64}")
_B64 = re.compile(rb"[A-Za-z0-9+/_-]+={0,2}")
EXPECTED_FORMATS = (
    "32 raw bytes, 64 hex characters, or base64 of 32 bytes (generate one with "
    "`nstance-admin secrets generate-key` or `openssl rand -base64 32`)"
)


_KEY_ALPHABET = string.ascii_letters + string.digits


def generate_encryption_key() -> str:
    """A new random key of 32 letters and digits (about 190 bits from the OS CSPRNG).

    Its 32 characters are the 32 key bytes, the only form upstream's Go server reads from ``env`` and
    ``file`` sources, so the same value works for both implementations.
    """
    return "".join(secrets.choice(_KEY_ALPHABET) for _ in range(KEY_SIZE))


def decode_encryption_key(value: bytes | str, where: str) -> bytes:
    """Turn the content of a key source into the 32 key bytes; ``where`` names the source in errors."""
    raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if len(raw) == KEY_SIZE:
        return raw
    text = raw.strip()
    if not text:
        raise InvalidArgument(f"encryption key from {where} is empty; expected {EXPECTED_FORMATS}")
    if len(text) == KEY_SIZE:
        return text
    if _HEX.fullmatch(text):
        return bytes.fromhex(text.decode("ascii"))
    if _B64.fullmatch(text):
        padded = text.rstrip(b"=") + b"=" * (-len(text.rstrip(b"=")) % 4)
        try:
            decoded = base64.urlsafe_b64decode(padded.replace(b"+", b"-").replace(b"/", b"_"))
        except (binascii.Error, ValueError):
            decoded = b""
        if len(decoded) == KEY_SIZE:
            return decoded
        if decoded:
            raise InvalidArgument(
                f"encryption key from {where} decodes (base64) to {len(decoded)} bytes, not {KEY_SIZE}; "
                f"expected {EXPECTED_FORMATS}"
            )
    raise InvalidArgument(
        f"encryption key from {where} is not in a recognised format ({len(text)} characters); "
        f"expected {EXPECTED_FORMATS}"
    )


def _remote_key(provider: str, source: str, client: Any, project_id: str = "") -> bytes:
    """The key held by an AWS secret or parameter or a Google secret (their libraries imported only here)."""
    if provider == "google-secret-manager":
        from nstance.secrets.googlesm import access_latest, secret_manager_client

        if not project_id:
            raise InvalidArgument("encryption key provider 'google-secret-manager' needs a project_id")
        held = access_latest(client or secret_manager_client(), project_id, source, f"secret {source!r}")
        if not held:
            raise InvalidArgument(
                f"Google Secret Manager secret {source} is empty; it must hold {EXPECTED_FORMATS}"
            )
        return decode_encryption_key(held, f"Google Secret Manager secret {source}")
    if provider == "aws-parameter-store":
        from nstance.secrets.parameterstore import read_secure_string, ssm_client

        value = read_secure_string(client or ssm_client(), source, f"parameter {source!r}")
        return decode_encryption_key(value, f"AWS Parameter Store parameter {source}")
    from botocore.exceptions import BotoCoreError, ClientError

    from nstance.secrets.aws import secrets_manager_client, secrets_manager_failure

    try:
        resp = (client or secrets_manager_client()).get_secret_value(SecretId=source)
    except (ClientError, BotoCoreError) as exc:
        secrets_manager_failure(exc, f"secret {source!r}", "read")
    data = resp.get("SecretString")
    raw = data.encode("utf-8") if isinstance(data, str) else resp.get("SecretBinary")
    if not raw:
        raise InvalidArgument(
            f"AWS Secrets Manager secret {source} is empty; it must hold {EXPECTED_FORMATS}"
        )
    return decode_encryption_key(bytes(raw), f"AWS Secrets Manager secret {source}")


def load_encryption_key(
    provider: str,
    source: str,
    environ: Mapping[str, str] | None = None,
    *,
    aws_client: Any = None,
    project_id: str = "",
    google_client: Any = None,
) -> bytes:
    """Load one 32-byte key from a source.

    ``aws_client`` / ``google_client``: a client to use for an AWS or Google source; ``project_id``: the
    Google project of a ``google-secret-manager`` source.
    """
    env = os.environ if environ is None else environ
    if provider not in KEY_PROVIDERS:
        raise InvalidArgument(
            f"unknown encryption key provider {provider!r}; use one of: {', '.join(KEY_PROVIDERS)}"
        )
    if not source:
        what = {"env": "an environment variable name", "file": "a file path"}.get(provider, "a name or ARN")
        raise InvalidArgument(f"encryption key provider {provider!r} needs a source ({what})")
    if provider == "google-secret-manager":
        return _remote_key(provider, source, google_client, project_id)
    if provider in ("aws-secrets-manager", "aws-parameter-store"):
        return _remote_key(provider, source, aws_client)
    if provider == "env":
        value = env.get(source)
        if not value:
            raise InvalidArgument(
                f"environment variable {source} is not set or empty; it must hold the secrets "
                f"encryption key: {EXPECTED_FORMATS}"
            )
        return decode_encryption_key(value, f"environment variable {source}")
    try:
        data = Path(source).expanduser().read_bytes()
    except OSError as exc:
        raise InvalidArgument(
            f"cannot read encryption key file {source}: {exc.strerror or exc}; "
            f"it must hold {EXPECTED_FORMATS}"
        ) from exc
    return decode_encryption_key(data, f"file {source}")


def load_encryption_keys(
    sources: Iterable[tuple[str, str, str]], environ: Mapping[str, str] | None = None
) -> list[bytes]:
    """Load several keys from (provider, source, Google project id); the first is the current key, the
    rest are old decrypt-only keys."""
    return [
        load_encryption_key(provider, source, environ, project_id=project)
        for provider, source, project in sources
    ]
