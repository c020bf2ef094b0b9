"""Open an ObjectStore from a URL, and build the server's shard and cluster scopes.

URLs:

* ``file:///abs/dir`` — absolute directory; ``file://relative/dir`` — relative to the working directory
  (everything after ``file://`` is the path; ``~`` is expanded).
* ``s3://bucket`` or ``s3://bucket/prefix`` — the prefix gets a trailing ``/``. Query parameters
  ``endpoint``, ``region`` and ``path_style=true`` are accepted; keyword options win over them, and
  the environment (``AWS_ENDPOINT_URL``, ``AWS_S3_USE_PATH_STYLE``) fills in what neither gives.
* ``gcs://bucket`` or ``gcs://bucket/prefix`` — Google Cloud Storage (Application Default
  Credentials; ``STORAGE_EMULATOR_HOST`` or the ``endpoint`` option point it at an emulator).
* ``memory://`` — a fresh in-process store (nothing is shared between calls).

Anything else raises InvalidArgument naming the accepted schemes. This module only parses and
constructs: it must not touch the network or the file system beyond what a backend's constructor does,
and it imports boto3 (via the s3 backend) only when an ``s3://`` URL is opened, the Google client only
for ``gcs://``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from nstance.core.errors import InvalidArgument, NotFound
from nstance.objectstore.base import ObjectStore
from nstance.objectstore.file import FileObjectStore
from nstance.objectstore.memory import MemoryObjectStore
from nstance.objectstore.scoped import ScopedObjectStore, normalize_prefix

SCHEMES = ("file", "s3", "gcs", "memory")
_S3_QUERY_OPTIONS = {"endpoint": "endpoint_url", "endpoint_url": "endpoint_url", "region": "region"}


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def open_store(url: str, **opts: Any) -> ObjectStore:
    """Return the store ``url`` names; ``opts`` go to the backend (for s3: see S3ObjectStore)."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in SCHEMES:
        raise InvalidArgument(
            f"unsupported object storage URL {url!r}: use file:///dir, file://relative/dir, "
            "s3://bucket/prefix, gcs://bucket/prefix or memory://"
        )
    if scheme == "memory":
        _no_opts(scheme, opts)
        if rest.strip("/"):
            raise InvalidArgument(f"memory:// takes no path (got {url!r})")
        return MemoryObjectStore()
    if scheme == "file":
        _no_opts(scheme, opts)
        path = unquote(rest.split("?", 1)[0].split("#", 1)[0])
        if not path:
            raise InvalidArgument(f"file URL {url!r} names no directory")
        return FileObjectStore(Path(path).expanduser())
    if scheme == "gcs":
        return _open_gcs(url, opts)
    return _open_s3(url, opts)


def _open_gcs(url: str, opts: dict[str, Any]) -> ObjectStore:
    parts = urlsplit(url)
    if not parts.netloc:
        raise InvalidArgument(f"gcs URL {url!r} must name a bucket: gcs://bucket/prefix")
    unknown = set(opts) - {"endpoint"}
    if unknown:
        raise InvalidArgument(f"gcs:// takes only the endpoint option (got {', '.join(sorted(unknown))})")
    from nstance.objectstore.gcs import GcsObjectStore, gcs_client  # the Google client only when asked for

    prefix = normalize_prefix(unquote(parts.path).lstrip("/"))
    return GcsObjectStore(parts.netloc, prefix, client=gcs_client(opts.get("endpoint")))


def _no_opts(scheme: str, opts: dict[str, Any]) -> None:
    if opts:
        raise InvalidArgument(f"{scheme}:// takes no options (got {', '.join(sorted(opts))})")


def _open_s3(url: str, opts: dict[str, Any]) -> ObjectStore:
    parts = urlsplit(url)
    bucket = parts.netloc
    if not bucket or "@" in bucket or ":" in bucket:
        raise InvalidArgument(f"s3 URL {url!r} must name a bucket: s3://bucket/prefix")
    prefix = normalize_prefix(unquote(parts.path).lstrip("/"))
    kwargs: dict[str, Any] = {}
    for name, values in parse_qs(parts.query, keep_blank_values=True).items():
        value = values[-1]
        if name in _S3_QUERY_OPTIONS:
            kwargs[_S3_QUERY_OPTIONS[name]] = value or None
        elif name == "path_style":
            kwargs["path_style"] = _truthy(value)
        else:
            raise InvalidArgument(
                f"unknown s3 URL parameter {name!r} (accepted: endpoint, region, path_style)"
            )
    kwargs.update(opts)
    from nstance.objectstore.s3 import S3ObjectStore  # boto3 only when asked for

    return S3ObjectStore(bucket, prefix, **kwargs)


def check_bucket_directory(bucket: str) -> None:
    """Raise NotFound unless the ``file`` storage directory ``bucket`` exists (a typo is not created)."""
    path = Path(bucket).expanduser()
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise NotFound(
            f"storage directory {bucket} {what}; check --storage-bucket (`nstance-admin cluster init` "
            "creates it for a new cluster)"
        )


@dataclass(frozen=True, slots=True)
class StorageScopes:
    """The bucket-level store and the two views a shard server works with."""

    root: ObjectStore
    shard: ObjectStore
    cluster: ObjectStore


BUCKET_NAME: Final = re.compile(r"[a-zA-Z0-9.\-_]{1,255}")
"""What botocore accepts as a bucket name (an access point or outposts ARN aside); the clouds' own
rules are stricter and are theirs to report."""


def open_scopes(
    storage: str,
    bucket: str,
    *,
    shard: str,
    prefix: str | None = None,
    cluster_prefix: str = "cluster/",
    **opts: Any,
) -> StorageScopes:
    """Build the scopes from ``--storage file|s3|memory --bucket X --prefix Y`` style inputs.

    ``prefix`` is the shard scope's prefix as upstream's ``--prefix`` means it: default ``shard/{shard}/``,
    a ``{shard}`` placeholder is filled in; the cluster scope is ``cluster_prefix`` of the same bucket.
    For ``file`` the bucket is a directory.
    """
    kind = storage.lower()
    if kind in ("s3", "gcs"):
        if not bucket:
            raise InvalidArgument(f"--bucket must name a bucket for {kind} storage")
        if not BUCKET_NAME.fullmatch(bucket) and not bucket.startswith("arn:"):
            # Every request would fail the client's own check, and a server retried it for ever.
            raise InvalidArgument(
                f"--bucket {bucket!r} is not a bucket name (letters, digits, '.', '-' and '_' only)"
            )
        root = open_store(f"{kind}://{bucket}", **opts)
    elif kind == "file":
        if not bucket:
            raise InvalidArgument("--bucket must name a directory for file storage")
        _no_opts(kind, opts)
        root = FileObjectStore(Path(bucket).expanduser())
    elif kind == "memory":
        root = open_store("memory://", **opts)
    else:
        raise InvalidArgument(f"unsupported storage {storage!r}: use file, s3, gcs or memory")
    shard_prefix = (prefix if prefix is not None else "shard/{shard}/").replace("{shard}", shard)
    return StorageScopes(
        root=root,
        shard=ScopedObjectStore(root, shard_prefix),
        cluster=ScopedObjectStore(root, cluster_prefix),
    )
