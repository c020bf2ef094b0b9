"""Schema of the ``cluster`` section: cluster identity, cluster-scope storage, secrets, election.

Pydantic models with upstream defaults and the rules that only need this section (for example
``secrets.encryption_key`` is required exactly when the secrets provider is ``object-storage``).
No I/O: reading keys or talking to secret stores belongs to ``nstance.secrets``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal, Self

from pydantic import BeforeValidator, Field, model_validator

from nstance.config.fields import (
    Duration,
    Identifier,
    NonEmptyStr,
    PositiveDuration,
    Ref,
    Rules,
    StrictModel,
    seconds,
)


class LeaderElectionConfig(StrictModel):
    """Lockfile-based leader election timing (shared by the cluster and shard elections)."""

    enabled: bool = True
    frequent_interval: PositiveDuration = seconds(5)
    infrequent_interval: PositiveDuration = seconds(30)
    leader_timeout: PositiveDuration = seconds(15)

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        if self.leader_timeout <= self.frequent_interval:
            rules.add("leader_timeout", "must be greater than ", Ref(("frequent_interval",)))
        rules.check()
        return self


class StorageConfig(StrictModel):
    """Where cluster-scope objects live when they are not in the shard's bucket."""

    provider: Literal["s3", "gcs", "file"]
    bucket: NonEmptyStr
    region: str = ""
    endpoint: str = ""
    prefix: str = "cluster/"


EncryptionKeyProvider = Literal[
    "env", "file", "aws-parameter-store", "aws-secrets-manager", "google-secret-manager"
]


class EncryptionKeyConfig(StrictModel):
    """Where the 32-byte AES key for ``object-storage`` secrets comes from."""

    provider: EncryptionKeyProvider
    source: NonEmptyStr
    project_id: str = ""

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        if self.provider == "google-secret-manager" and not self.project_id:
            rules.add("project_id", 'is required when provider is "google-secret-manager"')
        rules.check()
        return self


def _secrets_alias(value: object) -> object:
    return "google-secret-manager" if value == "gcp-secret-manager" else value


SecretsProvider = Annotated[
    Literal[
        "object-storage", "aws-secrets-manager", "aws-parameter-store", "google-secret-manager", "memory"
    ],
    BeforeValidator(_secrets_alias),
]


class SecretsConfig(StrictModel):
    """The cluster's secret store (CA key, nonce signing key, template secrets)."""

    provider: SecretsProvider
    prefix: str = ""
    project_id: str = ""
    encryption_key: EncryptionKeyConfig | None = None
    old_encryption_keys: list[EncryptionKeyConfig] = Field(default_factory=list)
    cache_ttl: Duration = timedelta(0)

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        if self.provider == "object-storage" and self.encryption_key is None:
            rules.add("encryption_key", 'is required when provider is "object-storage"')
        if self.provider != "object-storage" and self.encryption_key is not None:
            rules.add("encryption_key", 'is only used with provider "object-storage"; remove it')
        if self.provider != "object-storage" and self.old_encryption_keys:
            rules.add("old_encryption_keys", 'is only used with provider "object-storage"; remove it')
        if self.provider == "google-secret-manager" and not self.project_id:
            rules.add("project_id", 'is required when provider is "google-secret-manager"')
        rules.check()
        return self


class ClusterConfig(StrictModel):
    """Cluster-wide settings shared by every shard."""

    id: Identifier
    storage: StorageConfig | None = None
    secrets: SecretsConfig
    leader_election: LeaderElectionConfig = LeaderElectionConfig()
