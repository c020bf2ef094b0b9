"""Open a SecretStore by provider name (the ``secrets.provider`` config value).

Providers and their default name prefixes (upstream v2's): ``object-storage`` (needs an ObjectStore
and at least one 32-byte key; ``secret/``), ``aws-parameter-store`` (``/nstance/``),
``aws-secrets-manager`` (``nstance/``), ``google-secret-manager`` (``nstance-``; needs a project id)
and ``memory``. Anything else is refused naming the accepted providers.

This module only chooses and constructs; it imports boto3 or the Google client library only when that
provider is asked for, and loads no keys itself (see ``keys``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nstance.core.errors import InvalidArgument
from nstance.objectstore.base import ObjectStore
from nstance.secrets.base import SecretStore
from nstance.secrets.memory import MemorySecretStore
from nstance.secrets.objectstorage import DEFAULT_PREFIX, ObjectStorageSecretStore

PROVIDERS = (
    "object-storage",
    "aws-parameter-store",
    "aws-secrets-manager",
    "google-secret-manager",
    "memory",
)
#: Name prefix of each provider when the config sets none (upstream v2's ``SetDefaults``).
DEFAULT_PREFIXES: dict[str, str] = {
    "object-storage": DEFAULT_PREFIX,
    "aws-parameter-store": "/nstance/",
    "aws-secrets-manager": "nstance/",
    "google-secret-manager": "nstance-",
    "memory": "",
}


def default_prefix(provider: str, prefix: str | None) -> str:
    """``prefix`` when set (non-empty), else the provider's default."""
    return prefix or DEFAULT_PREFIXES.get(provider, "")


def open_secret_store(
    provider: str,
    *,
    object_store: ObjectStore | None = None,
    prefix: str | None = None,
    keys: Sequence[bytes] = (),
    aws_region: str | None = None,
    aws_endpoint_url: str | None = None,
    aws_client: Any = None,
    project_id: str = "",
    google_client: Any = None,
    accept_legacy_unbound: bool = True,
    bind_names: bool = False,
) -> SecretStore:
    """Return the store ``provider`` names, configured with the options that apply to it."""
    if provider == "memory":
        return MemorySecretStore()
    if provider == "object-storage":
        if object_store is None:
            raise InvalidArgument("the object-storage secrets provider needs an object store")
        return ObjectStorageSecretStore(
            object_store,
            default_prefix(provider, prefix),
            keys=keys,
            accept_legacy_unbound=accept_legacy_unbound,
            bind_names=bind_names,
        )
    if provider == "aws-secrets-manager":
        from nstance.secrets.aws import AwsSecretsManagerStore  # boto3 only when asked for

        return AwsSecretsManagerStore(
            default_prefix(provider, prefix),
            client=aws_client,
            region=aws_region,
            endpoint_url=aws_endpoint_url,
        )
    if provider == "aws-parameter-store":
        from nstance.secrets.parameterstore import AwsParameterStoreSecretStore  # boto3 only when asked for

        return AwsParameterStoreSecretStore(
            default_prefix(provider, prefix),
            client=aws_client,
            region=aws_region,
            endpoint_url=aws_endpoint_url,
        )
    if provider == "google-secret-manager":
        from nstance.secrets.googlesm import GoogleSecretManagerStore  # Google's library only when asked for

        return GoogleSecretManagerStore(project_id, default_prefix(provider, prefix), client=google_client)
    raise InvalidArgument(f"unknown secrets provider {provider!r}; use one of: {', '.join(PROVIDERS)}")
