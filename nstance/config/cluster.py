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
    """Take part in the election. With `false` the server acts as leader at once and writes no lockfile, so
    exactly one server may run (per shard for `shard.leader_election`, per cluster for
    `cluster.leader_election`)."""
    frequent_interval: PositiveDuration = seconds(5)
    """How often the leader renews the lockfile; followers read it twice as often."""
    infrequent_interval: PositiveDuration = seconds(30)
    """Accepted for upstream compatibility. Followers always read every half `frequent_interval` (so a
    failover stays within `leader_timeout`); this value is only the step period when `enabled` is
    `false`."""
    leader_timeout: PositiveDuration = seconds(15)
    """A leader that has not renewed for half of it stops acting; a follower that sees the lockfile
    unchanged, by its own clock, for `max(leader_timeout - frequent_interval, 0.6 × leader_timeout,
    min(1.5 × frequent_interval, leader_timeout))` takes over: always longer than one renewal interval,
    so a leader that renews once per `frequent_interval` (upstream's) is never taken over. Must be
    greater than `frequent_interval`."""

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
    """`s3`, `gcs` (Google Cloud Storage) or `file`."""
    bucket: NonEmptyStr
    """Bucket name (`s3`, `gcs`) or directory (`file`)."""
    region: str = ""
    """Region of the bucket (`s3`); empty: boto3's default (`AWS_REGION`)."""
    endpoint: str = ""
    """Endpoint URL of an S3-compatible store (or of a GCS emulator); empty: AWS S3 (or `AWS_ENDPOINT_URL`
    when set), Google Cloud Storage (or `STORAGE_EMULATOR_HOST`)."""
    prefix: str = "cluster/"
    """Key prefix of the cluster scope inside that bucket."""


def _secrets_alias(value: object) -> object:
    return "google-secret-manager" if value == "gcp-secret-manager" else value


def read_v1_options(data: object) -> object:
    """Upstream v1 wrote the Google project as ``options: {"project_id": ...}``; read it as ``project_id``."""
    if not isinstance(data, dict) or "options" not in data:
        return data
    options = data["options"]
    rules = Rules()
    if not isinstance(options, dict):
        rules.add("options", 'must be an object such as {"project_id": "my-project"} (upstream v1\'s shape)')
    else:
        for key in sorted(set(options) - {"project_id"}):
            rules.add(("options", key), "unknown field (upstream v1's options carry only project_id)")
        project = options.get("project_id")
        if project is not None and data.get("project_id") not in (None, "", project):
            rules.add(("options", "project_id"), "differs from project_id; set one of them")
    rules.check()
    out = {k: v for k, v in data.items() if k != "options"}
    if isinstance(options, dict) and options.get("project_id") is not None and not out.get("project_id"):
        out["project_id"] = options["project_id"]
    return out


EncryptionKeyProvider = Annotated[
    Literal["env", "file", "aws-parameter-store", "aws-secrets-manager", "google-secret-manager"],
    BeforeValidator(_secrets_alias),
]


class EncryptionKeyConfig(StrictModel):
    """Where the 32-byte AES key for ``object-storage`` secrets comes from."""

    provider: EncryptionKeyProvider
    """`env` (an environment variable), `file`, `aws-secrets-manager` (a secret's name or ARN; the default
    of upstream's Terraform module), `aws-parameter-store` (a `SecureString` parameter) or
    `google-secret-manager` (the latest version of the secret `source` in project `project_id`)."""
    source: NonEmptyStr
    """The variable name, file path, secret name or ARN, or parameter name holding the key: 32 raw bytes
    (what upstream reads; `nstance-admin secrets generate-key` prints such a key), 64 hex characters, or
    base64 of 32 bytes."""
    project_id: str = ""
    """Google project of `google-secret-manager`; required with that provider. Upstream v1's
    `options: {"project_id": ...}` is read as this field."""

    @model_validator(mode="before")
    @classmethod
    def _v1_options(cls, data: object) -> object:
        return read_v1_options(data)

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        if self.provider == "google-secret-manager" and not self.project_id:
            rules.add("project_id", 'is required when provider is "google-secret-manager"')
        rules.check()
        return self


SecretsProvider = Annotated[
    Literal[
        "object-storage", "aws-secrets-manager", "aws-parameter-store", "google-secret-manager", "memory"
    ],
    BeforeValidator(_secrets_alias),
]


class SecretsConfig(StrictModel):
    """The cluster's secret store (CA key, nonce signing key, template secrets)."""

    provider: SecretsProvider
    """`object-storage` (AES-256-GCM encrypted objects in the cluster scope), `aws-parameter-store`
    (`SecureString` parameters), `aws-secrets-manager`, `google-secret-manager` (alias
    `gcp-secret-manager`; secrets in project `project_id`) or `memory` (a process-local store, for tests).
    Without a `cluster.secrets` block, `aws` shards use `aws-parameter-store` and `google` shards
    `google-secret-manager`, as upstream."""
    prefix: str = ""
    """Name prefix of every secret. Empty: upstream's default of the provider: `secret/` for
    `object-storage` (so `cluster/secret/ca.key`), `/nstance/` for `aws-parameter-store`, `nstance/` for
    `aws-secrets-manager`, `nstance-` for `google-secret-manager`. Pass the same value to
    `nstance-admin --secrets-prefix`."""
    project_id: str = ""
    """Google project of `google-secret-manager`; required with that provider. On a `google` shard it
    defaults to the provider's project, `shard.infra.options.project_id` (or `.project`); upstream
    requires it written out. Upstream v1's `options: {"project_id": ...}` is read as this field."""
    encryption_key: EncryptionKeyConfig | None = None
    """The current key of `object-storage` secrets: it encrypts every write and is tried first on reads.
    Required with `object-storage`, refused with any other provider."""
    old_encryption_keys: list[EncryptionKeyConfig] = Field(default_factory=list)
    """Earlier keys, tried in order after `encryption_key` when a secret does not decrypt, never used to
    write. Only with `object-storage`."""
    bind_names: bool = False
    """`object-storage`: also bind each secret's name to its ciphertext (AES-GCM additional data), so an
    object copied to another secret name fails to decrypt. Upstream's Go server cannot read secrets
    written this way; leave it `false` while a move back to it must stay possible. Both forms are
    always read. Not an upstream field (upstream ignores it)."""
    cache_ttl: Duration = timedelta(0)
    """Accepted for upstream compatibility. This server does not cache secrets, so the value has no effect."""

    @model_validator(mode="before")
    @classmethod
    def _v1_options(cls, data: object) -> object:
        return read_v1_options(data)

    @model_validator(mode="after")
    def _rules(self) -> Self:
        rules = Rules()
        if self.provider == "object-storage" and self.encryption_key is None:
            rules.add("encryption_key", 'is required when provider is "object-storage"')
        if self.provider != "object-storage" and self.encryption_key is not None:
            rules.add("encryption_key", 'is only used with provider "object-storage"; remove it')
        if self.provider != "object-storage" and self.bind_names:
            rules.add("bind_names", 'is only used with provider "object-storage"; remove it')
        if self.provider != "object-storage" and self.old_encryption_keys:
            rules.add("old_encryption_keys", 'is only used with provider "object-storage"; remove it')
        if self.provider == "google-secret-manager" and not self.project_id:
            rules.add(
                "project_id",
                'is required when provider is "google-secret-manager" (on a google shard it defaults to '
                "shard.infra.options.project_id)",
            )
        rules.check()
        return self


class ClusterConfig(StrictModel):
    """Cluster-wide settings shared by every shard."""

    id: Identifier
    """Cluster identifier. It is in every registration nonce and client certificate, in every instance's
    tags, and in the name of the operator's Cluster API objects; every shard's file must say the same."""
    storage: StorageConfig | None = None
    """Keep the cluster scope (CA certificate, encrypted secrets, operator records, deny-list, cluster
    lockfile) in another bucket. Unset: the `cluster/` prefix of the bucket given to `nstance-server
    --bucket`."""
    secrets: SecretsConfig
    """The cluster's secret store: the CA key, the registration-nonce signing key and the secrets template
    files deliver."""
    leader_election: LeaderElectionConfig = LeaderElectionConfig()
    """Timing of the cluster election (`cluster/leader.json`). The cluster leader creates a missing cluster
    identity, registers operators and renews their certificates."""
