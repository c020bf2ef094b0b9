"""Open a SecretStore by provider name (the ``secrets.provider`` config value).

Providers: ``object-storage`` (needs an ObjectStore and at least one 32-byte key; default prefix
``secret/``), ``aws-secrets-manager`` (boto3; default prefix empty, as upstream) and ``memory``.
Upstream's ``aws-parameter-store`` and ``google-secret-manager`` are refused with InvalidArgument
"not supported yet"; anything else is refused naming the accepted providers.

This module only chooses and constructs; it imports boto3 (via ``aws``) only when that provider is
asked for, and loads no keys itself (see ``keys``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nstance.core.errors import InvalidArgument
from nstance.objectstore.base import ObjectStore
from nstance.secrets.base import SecretStore
from nstance.secrets.memory import MemorySecretStore
from nstance.secrets.objectstorage import DEFAULT_PREFIX, ObjectStorageSecretStore

PROVIDERS = ("object-storage", "aws-secrets-manager", "memory")
NOT_YET_SUPPORTED = ("aws-parameter-store", "google-secret-manager")


def open_secret_store(
    provider: str,
    *,
    object_store: ObjectStore | None = None,
    prefix: str | None = None,
    keys: Sequence[bytes] = (),
    aws_region: str | None = None,
    aws_endpoint_url: str | None = None,
    aws_client: Any = None,
    accept_legacy_unbound: bool = True,
) -> SecretStore:
    """Return the store ``provider`` names, configured with the options that apply to it."""
    if provider == "memory":
        return MemorySecretStore()
    if provider == "object-storage":
        if object_store is None:
            raise InvalidArgument("the object-storage secrets provider needs an object store")
        return ObjectStorageSecretStore(
            object_store,
            DEFAULT_PREFIX if prefix is None else prefix,
            keys=keys,
            accept_legacy_unbound=accept_legacy_unbound,
        )
    if provider == "aws-secrets-manager":
        from nstance.secrets.aws import AwsSecretsManagerStore  # boto3 only when asked for

        return AwsSecretsManagerStore(
            prefix or "", client=aws_client, region=aws_region, endpoint_url=aws_endpoint_url
        )
    if provider in NOT_YET_SUPPORTED:
        raise InvalidArgument(
            f"secrets provider {provider!r} is not supported yet; use one of: {', '.join(PROVIDERS)}"
        )
    raise InvalidArgument(f"unknown secrets provider {provider!r}; use one of: {', '.join(PROVIDERS)}")
