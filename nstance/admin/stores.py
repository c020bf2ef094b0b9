"""Open the cluster's object storage and secret store from nstance-admin's storage/secrets flags.

The flags mirror upstream's (``--storage-provider``, ``--storage-bucket``, ``--storage-prefix``,
``--secrets-provider``, ``--secrets-prefix``, ``--secrets-project``, ``--key-provider``,
``--key-source``); an empty ``--secrets-prefix`` is the provider's default, as in the server.
The cluster scope is ``{bucket}/{storage-prefix}`` and object-storage secrets live under
``{storage-prefix}{secrets-prefix}`` (``cluster/secret/ca.key``), shard scopes under ``shard/{shard}/``,
as upstream lays them out.

This module only validates the flag combination and constructs stores; it reads no secret. A ``file``
bucket directory is created only by ``cluster init``; every other command requires it to exist. It also
finds the cluster id in storage for commands given none (``cluster_id_from_storage``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nstance.config.errors import ConfigError
from nstance.config.jsonc import parse_jsonc
from nstance.core.errors import InvalidArgument
from nstance.core.ids import identifier_problem
from nstance.objectstore.base import ObjectStore
from nstance.objectstore.factory import check_bucket_directory, open_scopes
from nstance.objectstore.scoped import ScopedObjectStore
from nstance.secrets.base import SecretStore
from nstance.secrets.factory import open_secret_store
from nstance.secrets.keys import load_encryption_key

STORAGE_PROVIDERS = ("file", "s3", "gcs")


@dataclass(frozen=True, slots=True)
class StorageOptions:
    """Where the cluster's objects and secrets are, as given on the command line."""

    storage_provider: str
    storage_bucket: str
    storage_prefix: str = "cluster/"
    secrets_provider: str = "object-storage"
    secrets_prefix: str = ""  # empty: the provider's default (``secret/`` for object-storage)
    secrets_project: str = ""
    key_provider: str = "env"
    key_source: str = "NSTANCE_ENCRYPTION_KEY"


@dataclass(frozen=True, slots=True)
class ClusterStores:
    """The bucket root, the cluster scope and the secret store."""

    root: ObjectStore
    cluster: ObjectStore
    secrets: SecretStore

    def shard(self, shard: str) -> ObjectStore:
        """The ``shard/{shard}/`` scope of the same bucket."""
        problem = identifier_problem(shard)
        if problem:
            raise InvalidArgument(f"--shard {shard!r}: {problem}")
        return ScopedObjectStore(self.root, f"shard/{shard}/")


def open_cluster_stores(
    opts: StorageOptions, environ: Mapping[str, str] | None = None, *, create: bool = False
) -> ClusterStores:
    """Build the stores the options describe; raise InvalidArgument naming the flag that is wrong.

    A ``file`` bucket directory must exist unless ``create`` (``cluster init``): a mistyped path is
    reported rather than silently made.
    """
    if opts.storage_provider not in STORAGE_PROVIDERS:
        raise InvalidArgument(
            f"--storage-provider {opts.storage_provider!r} is not supported; use one of: "
            f"{', '.join(STORAGE_PROVIDERS)}"
        )
    if not opts.storage_bucket:
        what = "a directory" if opts.storage_provider == "file" else "a bucket name"
        raise InvalidArgument(f"--storage-bucket is required ({what})")
    if opts.storage_provider == "file" and not create:
        check_bucket_directory(opts.storage_bucket)
    scopes = open_scopes(
        opts.storage_provider,
        opts.storage_bucket,
        shard="admin",
        cluster_prefix=opts.storage_prefix,
    )
    keys: list[bytes] = []
    if opts.secrets_provider == "object-storage":
        keys.append(
            load_encryption_key(opts.key_provider, opts.key_source, environ, project_id=opts.secrets_project)
        )
    secrets = open_secret_store(
        opts.secrets_provider,
        object_store=scopes.cluster,
        prefix=opts.secrets_prefix or None,
        keys=keys,
        project_id=opts.secrets_project,
    )
    return ClusterStores(root=scopes.root, cluster=scopes.cluster, secrets=secrets)


_CA_ORG = "Nstance Cluster "


def cluster_id_from_storage(stores: ClusterStores, ca_organization: str) -> str:
    """The cluster id as storage tells it, for commands given no ``--cluster-id``.

    First the CA's organization (``Nstance Cluster <id>``, written here when the cluster was created),
    then the ``cluster.id`` of the shard configs in the bucket (``shard/*/config.jsonc``; a CA made by
    upstream says ``Nstance Cluster Unknown``). InvalidArgument when neither names one id.
    """
    if ca_organization.startswith(_CA_ORG):
        candidate = ca_organization.removeprefix(_CA_ORG)
        if candidate != "Unknown" and identifier_problem(candidate) is None:
            return candidate
    found: set[str] = set()
    for key in stores.root.list("shard/"):
        if not key.endswith("/config.jsonc") or key.count("/") != 2:
            continue
        data, _etag = stores.root.get(key)
        try:
            doc = parse_jsonc(data.decode("utf-8", errors="replace"), key)
        except ConfigError:
            continue
        cluster = doc.get("cluster") if isinstance(doc, dict) else None
        value = cluster.get("id") if isinstance(cluster, dict) else None
        if isinstance(value, str) and identifier_problem(value) is None:
            found.add(value)
    if len(found) == 1:
        return found.pop()
    if found:
        raise InvalidArgument(
            f"the shard configs in the bucket name several cluster ids ({', '.join(sorted(found))}); "
            "pass --cluster-id"
        )
    raise InvalidArgument(
        "cannot tell the cluster id from storage (no cluster id in the CA certificate and no "
        "shard/*/config.jsonc); pass --cluster-id"
    )
